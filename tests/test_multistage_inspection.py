"""Inspection of a two-stage model at both levels: rendering with '|' and '||', segment offsets that
tile the input at each level, per-level evaluation, and generation whose on-the-fly boundaries equal
one forward pass over the generated text."""

import json
import os

from conftest import jit_call
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import decoding, evaluate, inspection, sample, segment, tokenization
from tokjax.data import PAD_ID
from tokjax.models import hierarchical

TEXT = (
    b'def add(a, b):\n    """Adds two numbers."""\n    return a + b\n\n' * 6
    + 'caf\u00e9 na\u00efve \u2603 snow\n'.encode()
)


@pytest.fixture(scope='module')
def ckpt(tiny_two_stage_run):
  return inspection.load_checkpoint(tiny_two_stage_run[0])


def test_render_repeats_the_delimiter_once_per_level():
  text = b'ab cd\nef gh'
  stage0 = np.array([0, 1, 1, 0, 1, 1, 0, 1, 0, 0, 0], np.float32)
  stage1 = np.array([0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0], np.float32)
  both = np.stack([stage0, stage1])
  assert tokenization.render(text, both) == 'ab| ||cd|\n||ef| gh'
  assert tokenization.render(text, stage0) == 'ab| |cd|\n|ef| gh'  # One level: as before stages.
  assert tokenization.render(text, stage0[None]) == tokenization.render(text, stage0)
  assert tokenization.preview(text, both, width=6) == 'ab| ||cd|⏎'
  assert tokenization.chunk_offsets(both, 1) == [(0, 3), (3, 6), (6, 11)]
  assert tokenization.split_chunks(text, both, 1) == [b'ab ', b'cd\n', b'ef gh']
  assert tokenization.legend(2) == '| ends a stage-0 chunk, || ends a stage-1 chunk'
  assert tokenization.legend(1) == '| ends a chunk'


def test_training_prints_both_levels(tiny_two_stage_run, ckpt):
  _, console = tiny_two_stage_run
  assert 'held-out text (| ends a stage-0 chunk, || ends a stage-1 chunk):' in console
  sampled = console.split('--- sample boundaries ---')[1]
  assert '||' in sampled and '|' in sampled.replace('||', '')
  last_val = [l for l in console.splitlines() if l.startswith('  val bpb')][-1]
  # Stage 1 against its chance level (stage 0's precision), as the val metrics hold it.
  run, _ = tiny_two_stage_run
  rows = [json.loads(l) for l in open(os.path.join(run, 'metrics.jsonl'))]
  val = [r for r in rows if r['split'] == 'val'][-1]
  lift = f"ws lift {val['stage1_whitespace_lift']:+.3f} +- {val['stage1_whitespace_lift_se']:.3f}"
  assert f"stage 1 rate {val['stage1_rate']:.3f} {lift}" in last_val
  # The printed segmentation is the model's: the same call renders the same text.
  data_text = sampled.strip().splitlines()[0]
  assert data_text.replace('|', '') in console  # A held-out line, delimiters removed.


def test_segment_offsets_cover_the_input_once_at_both_levels(tiny_two_stage_run, tmp_path):
  run, _ = tiny_two_stage_run
  path = tmp_path / 'in.txt'
  path.write_bytes(TEXT)
  assert len(TEXT) > 4 * 64  # Several windows of the tiny model's seq_len.
  res = segment.segment_file(run, str(path), str(tmp_path / 'seg'), mode='sample', delimiter='\x00')
  record = json.load(open(res['paths']['json']))
  by_level = record['offsets_by_level']
  assert record['stages'] == len(by_level) == 2 and by_level[0] == record['offsets']
  for offsets in by_level:
    assert offsets[0][0] == 0 and offsets[-1][1] == len(TEXT)
    assert all(e > s for s, e in offsets)
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))
    assert b''.join(TEXT[s:e] for s, e in offsets) == TEXT
  ends0, ends1 = ({e for _, e in offsets} for offsets in by_level)
  assert ends1 <= ends0 and 1 < len(ends1) < len(ends0)  # Stage-1 ends are stage-0 ends.
  assert record['num_chunks_by_level'] == [len(o) for o in by_level]
  txt = open(res['paths']['txt'], encoding='utf-8').read()
  assert txt.replace('\x00', '') == TEXT.decode()
  # One delimiter per stage-0 end and one more per stage-1 end (none after the text's last chunk).
  assert txt.count('\x00\x00') == len(ends1 - {len(TEXT)})
  assert txt.count('\x00') == len(ends0 - {len(TEXT)}) + len(ends1 - {len(TEXT)})
  html = open(res['paths']['html'], encoding='utf-8').read()
  stage1_chars = sum(res['actions'][1, e - 1] > 0.5 for _, e in segment.utf8_spans(TEXT))
  assert html.count('class="cut cut1"') == stage1_chars > 0  # A heavier bar at stage-1 ends.


def test_evaluate_reports_every_level(tiny_two_stage_run, ckpt, tmp_path):
  run, _ = tiny_two_stage_run
  report = evaluate.run_evaluation(
      run,
      split='val',
      out=str(tmp_path / 'ev'),
      max_batches=ckpt.config.eval.max_batches,
      bpe=False,
  )
  val = [json.loads(l) for l in open(os.path.join(run, 'metrics.jsonl'))]
  val = [r for r in val if r['split'] == 'val'][-1]
  sampled = report['modes']['sample']
  # The trainer's val metrics hold the same per-level numbers (same evaluator, same key).
  for k in ('rate', 'stage1_rate', 'stage1_bytes_per_chunk', 'stage1_whitespace_precision'):
    assert sampled[k] == pytest.approx(val[k], abs=1e-6), k
  assert 0 < sampled['stage1_rate'] < 1
  # Stage 1 closes a chunk once per stage1_rate stage-0 chunks: its chunks are that much longer.
  assert sampled['stage1_bytes_per_chunk'] == pytest.approx(
      sampled['bytes_per_chunk'] / sampled['stage1_rate'], rel=1e-6
  )
  md = evaluate.to_markdown(report)
  rows = [l for l in md.splitlines() if l.startswith(('| sample | ', '| greedy | '))]
  assert [r.split(' | ')[:2] for r in rows[2:]] == [
      ['| sample', '0'],
      ['| sample', '1'],
      ['| greedy', '0'],
      ['| greedy', '1'],
  ]
  assert f"| sample | 1 | {sampled['stage1_rate']:.3f} |" in md
  for name in ('whitespace', 'line'):
    assert sampled[f'stage1_{name}_lift'] == pytest.approx(val[f'stage1_{name}_lift'], abs=1e-9)
  stage1_row = [l for l in md.splitlines() if l.startswith('| sample | 1 |')][0]
  assert stage1_row.endswith(
      f"| {sampled['stage1_whitespace_lift']:+.3f} +- {sampled['stage1_whitespace_lift_se']:.3f}"
      f" / {sampled['stage1_line_lift']:+.3f} +- {sampled['stage1_line_lift_se']:.3f} |"
  )
  assert 'line P / R' in md and open(tmp_path / 'ev.md').read() == md


def test_generation_draws_both_levels_as_one_forward_pass_would(ckpt):
  model, params = ckpt.model, ckpt.params
  prompt = decoding.encode_prompt(b'def f(x):\n', batch=2)
  key, n = jax.random.PRNGKey(0), 30
  gen = jax.device_get(
      decoding.generate_stages(
          model, params, prompt, key, n, mode='sample', temperature=1.0, top_k=0
      )
  )
  tokens, actions = gen['tokens'], gen['actions']
  assert actions.shape == (2, 2, prompt.shape[1] + n)
  np.testing.assert_array_equal(tokens[:, : prompt.shape[1]], prompt)
  # One pass over the final text (the spare position PAD), the boundary key of every step.
  full = jnp.pad(tokens, ((0, 0), (0, 1)), constant_values=PAD_ID)
  big = decoding.with_capacity(model, full.shape[1])
  out = jit_call(big.apply, {'params': params}, full, decoding.stage_keys(key)[0], mode='sample')
  ref = np.stack(jax.device_get(hierarchical.boundaries_in_bytes(out)), axis=1)[:, :, :-1]
  np.testing.assert_array_equal(actions, ref)
  np.testing.assert_allclose(
      gen['logits'].swapaxes(0, 1), np.asarray(out.logits)[:, :-1], atol=1e-4
  )
  assert np.all(actions[:, 1] <= actions[:, 0])  # Stage-1 ends are stage-0 ends.
  assert 0 < actions[:, 1, 1:].sum() < actions[:, 0, 1:].sum() < actions[:, 0, 1:].size
  # The boundary key matters: the agreement above is not vacuous.
  other = decoding.generate_stages(
      model, params, prompt, jax.random.PRNGKey(1), n, mode='sample', temperature=1.0, top_k=0
  )
  assert not np.array_equal(np.asarray(other['actions']), actions)


def test_sample_command_path_on_a_two_stage_checkpoint(ckpt):
  args = (ckpt.model, ckpt.params, b'import os', 20, jax.random.PRNGKey(0))
  settings = {'mode': 'sample', 'temperature': 0.8, 'top_k': 40}
  res = sample.run_generation(*args, **settings, cached=False)
  assert len(res['text']) == 29 and res['text'].startswith(b'import os')
  assert res['actions'].shape == (2, 29)
  assert res['marked'] == tokenization.render(res['text'], res['actions'])
  assert res['marked'].replace('|', '') == res['text'].decode('utf-8', errors='replace').replace(
      '|', ''
  )
  # The cached path decides the same bytes and boundaries.
  cached = sample.run_generation(*args, **settings, cached=True)
  assert cached['text'] == res['text'] and np.array_equal(cached['actions'], res['actions'])
