"""Tests of the learned tokenizer on files: offsets tile the input, windows leave no seams, greedy is
deterministic, and bad input gets a clear message."""

import json
import subprocess
import sys

from conftest import jit_call
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import decoding, models, segment, stages, tokenization
from tokjax.config import defaults as config_defaults
from tokjax.data import BOS_ID, PAD_ID, pipeline
from tokjax.errors import UserError

TEXT = (
    b'def add(a, b):\n    """Adds two numbers."""\n    return a + b\n\n' * 12
    + 'caf\u00e9 na\u00efve \u2603 snow\n'.encode()
)


def _fresh_model(byte_window=8, seq_len=48):
  c = config_defaults.base_config()
  c.model.d_model, c.model.byte_window, c.model.capacity = 32, byte_window, seq_len
  c.data.seq_len = seq_len
  c.boundary.policy.scale = 4.0  # Spread the untrained policy's probabilities so boundaries vary.
  model = models.build_model(c, levels=stages.resolve(c))
  params = nn.unbox(
      jit_call(model.init, jax.random.PRNGKey(3), *models.init_args(c, 1, seq_len))['params']
  )
  params['boundary']['bias'] = jnp.zeros(())  # p near 0.5: greedy boundaries on some bytes only.
  return c, model, params


def test_offsets_tile_the_input_exactly_once(tiny_run, tmp_path):
  path = tmp_path / 'in.txt'
  path.write_bytes(TEXT)
  assert len(TEXT) > 5 * 64  # Several windows of the tiny model's seq_len.
  for mode in ('greedy', 'sample'):
    res = segment.segment_file(
        tiny_run, str(path), str(tmp_path / mode), mode=mode, delimiter='\x00'
    )
    offsets = json.load(open(res['paths']['json']))['offsets']
    assert offsets[0][0] == 0 and offsets[-1][1] == len(TEXT)
    assert all(e > s for s, e in offsets)
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))
    assert b''.join(TEXT[s:e] for s, e in offsets) == TEXT
    txt = open(res['paths']['txt'], encoding='utf-8').read()
    assert txt.replace('\x00', '') == TEXT.decode()
    assert txt.count('\x00') in (len(offsets), len(offsets) - 1)  # No delimiter after an open tail.
    for k in ('html', 'png'):
      assert (tmp_path / f'{mode}.{k}').stat().st_size > 1000


def test_windows_leave_no_seams():
  """With overlap = the encoder's receptive field, windowed probabilities equal one long pass."""
  c, model, params = _fresh_model()
  overlap = tokenization.window_overlap(c, levels=stages.resolve(c))
  assert overlap == 7
  text = TEXT[:300]
  actions, probs = tokenization.segment_text(
      model, params, text, c.data.seq_len, jax.random.PRNGKey(0), mode='greedy', overlap=overlap
  )
  long = jnp.asarray([[BOS_ID] + list(text) + [PAD_ID]], jnp.int32)
  big = decoding.with_capacity(model, long.shape[1])
  ref = jit_call(big.apply, {'params': params}, long, jax.random.PRNGKey(0), mode='greedy')
  ref = ref.boundaries
  assert actions.shape == probs.shape == (1, len(text))  # [levels, bytes]: one stage.
  actions, probs = actions[0], probs[0]
  np.testing.assert_allclose(probs, np.asarray(ref.probs[0, 1:-1]), atol=1e-5)
  np.testing.assert_array_equal(actions, np.asarray(ref.actions[0, 1:-1]))
  assert 0 < actions.sum() < len(text)
  # Too little overlap does leave seams: the check above can fail.
  _, probs0 = tokenization.segment_text(
      model, params, text, c.data.seq_len, jax.random.PRNGKey(0), mode='greedy', overlap=0
  )
  assert np.abs(probs0[0] - np.asarray(ref.probs[0, 1:-1])).max() > 1e-4


def test_windows_are_cut_as_training_cuts_a_document():
  text = bytes(range(65, 105))  # 40 bytes, A to h.
  tokens, kept = tokenization.segment_windows(text, 16, overlap=3)
  # By hand: 16 - 2 - 3 = 11 new bytes a window; the first after BOS, each later one after 4 bytes
  # of context and no BOS, the byte after them last (its decision is the next window's).
  assert tokens.tolist() == [
      [BOS_ID, *text[0:12], PAD_ID, PAD_ID, PAD_ID],
      list(text[7:23]),
      list(text[18:34]),
      [*text[29:40], PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
  ]
  assert kept == [(0, 1, 11), (11, 4, 11), (22, 4, 11), (33, 4, 7)]
  # Without overlap the first window is training's first example of the document, BOS included.
  example = pipeline.get_examples(pipeline.pack_documents([text]), np.array([0]), seq_len=16)
  assert tokenization.segment_windows(text, 16)[0][0].tolist() == example['inputs'][0].tolist()


def test_later_windows_read_the_cut_text_without_bos():
  """A later window's kept decisions are the model's on the cut bytes alone; with a full-attention
  encoder a BOS before them would move every one."""
  _, model, params = _fresh_model(byte_window=0, seq_len=16)
  text, key = TEXT[:40], jax.random.PRNGKey(0)
  _, probs = tokenization.segment_text(model, params, text, 16, key, mode='greedy', overlap=3)
  run = lambda ids: np.asarray(
      jit_call(
          model.apply, {'params': params}, jnp.asarray([ids], jnp.int32), key, mode='greedy'
      ).boundaries.probs[0]
  )
  # Bytes 11..21 are window 1's, at its positions 4..14 after text[7:11] (see the test above).
  np.testing.assert_allclose(probs[0, 11:22], run(list(text[7:23]))[4:15], atol=1e-5)
  after_bos = run([BOS_ID, *text[8:23]])[4:15]  # The same bytes at the same positions, after BOS.
  assert np.abs(probs[0, 11:22] - after_bos).max() > 1e-3


def test_greedy_is_deterministic_and_sampling_is_not():
  c, model, params = _fresh_model()
  run = lambda mode, seed: tokenization.segment_text(
      model, params, TEXT, c.data.seq_len, jax.random.PRNGKey(seed), mode=mode, overlap=7
  )[0]
  np.testing.assert_array_equal(run('greedy', 0), run('greedy', 1))
  assert not np.array_equal(run('sample', 0), run('sample', 1))


def test_bad_input(tiny_run, tmp_path):
  (tmp_path / 'empty.txt').write_bytes(b'')
  with pytest.raises(UserError, match='empty'):
    segment.segment_file(tiny_run, str(tmp_path / 'empty.txt'))
  with pytest.raises(UserError, match='not a file'):
    segment.segment_file(tiny_run, str(tmp_path / 'nope.txt'))
  (tmp_path / 'a.txt').write_bytes(b'some text')
  with pytest.raises(UserError, match='does not exist'):
    segment.segment_file(str(tmp_path / 'norun'), str(tmp_path / 'a.txt'))


def test_command_line_takes_file_positionally(tiny_run, tmp_path):
  (tmp_path / 'a.txt').write_bytes(TEXT[:200])
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'tokjax.segment',
          '--checkpoint',
          tiny_run,
          str(tmp_path / 'a.txt'),
          '--out',
          str(tmp_path / 'cli'),
      ],
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert (tmp_path / 'cli.json').exists()
  empty = tmp_path / 'e.txt'
  empty.write_bytes(b'')
  out = subprocess.run(
      [sys.executable, '-m', 'tokjax.segment', '--checkpoint', tiny_run, str(empty)],
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert out.returncode == 2 and 'is empty' in out.stderr.strip().splitlines()[-1]
