"""tokjax.evaluator: the document bookkeeping from the pipeline's own batch positions, and agreement
with the trainer's compiled eval step."""

import math

from conftest import tiny_config
import jax
import numpy as np
import pytest

from tokjax import boundary_stats, sharding, significance
from tokjax import evaluator as evaluator_lib
from tokjax import trainer as trainer_lib
from tokjax.data import pipeline


def test_document_ids_and_batch_positions_follow_the_packed_stream():
  docs = [b'abc', b'hello world', b'x' * 70, b'tail']
  stream = pipeline.pack_documents(docs)
  ids = significance.document_ids(docs)
  assert len(ids) == len(stream)
  for k, d in enumerate(docs):
    assert bytes(stream[ids == k][1:].astype(np.uint8)) == d
  batches = pipeline.make_eval_batches(docs, seq_len=8, batch_size=5)
  seen = []
  for batch in batches:
    pos = pipeline.stream_positions(batch)
    real = batch['mask'] > 0
    np.testing.assert_array_equal(batch['targets'][real], stream[pos[real] + 1])
    inside = (pos >= 0) & (pos < len(stream))
    np.testing.assert_array_equal(batch['inputs'][inside], stream[pos[inside]])
    seen += list(pos[real] + 1)
  assert sorted(seen) == [p for p in range(len(stream)) if stream[p] < 256]  # Each byte once.


def test_evaluator_matches_the_trainers_eval_step_on_the_same_batches_and_key(tmp_path):
  """bpb pooled over bytes from the evaluator equals the sum of the trainer's per-batch CE sums over
  the same batches and keys, for sampled and greedy boundaries; per-document sums add up."""
  c = tiny_config(str(tmp_path))
  data = pipeline.build_data(c)
  trainer = trainer_lib.Trainer(c, sharding.make_mesh(c.mesh))
  params = trainer.init(jax.random.PRNGKey(0)).params
  key = jax.random.PRNGKey(7)
  docs = data.splits['val']
  res = evaluator_lib.Evaluator(trainer).run(params, docs, key, batches=data.val_batches)
  for mode in ('sample', 'greedy'):
    ce = nbytes = 0.0
    for i, batch in enumerate(data.val_batches):
      placed = sharding.global_batch_from_global(pipeline.model_batch(batch), trainer.mesh)
      m = jax.device_get(trainer.eval_step(params, placed, jax.random.fold_in(key, i), mode))
      ce, nbytes = ce + float(m['ce_sum']), nbytes + float(m['bytes'])
    assert res[mode]['bpb'] == pytest.approx(ce / nbytes / math.log(2), rel=1e-5), mode
    assert res[mode]['bytes'] == nbytes
  assert res['sample']['bpb'] != res['greedy']['bpb']
  m = res['sample']
  assert m['documents'] >= 1 and (math.isnan(m['bpb_se']) == (m['documents'] < 2))


def test_evaluator_units_add_up_to_its_documents(tmp_path):
  """Per-window CE sums of each document add up to the document's, and pooled bpb is unchanged."""
  c = tiny_config(str(tmp_path))
  data = pipeline.build_data(c)
  trainer = trainer_lib.Trainer(c, sharding.make_mesh(c.mesh))
  params = trainer.init(jax.random.PRNGKey(0)).params
  docs = [d[:300] for d in data.splits['val'][:4]]
  ev = evaluator_lib.Evaluator(trainer)
  by_doc = ev.run(params, docs, jax.random.PRNGKey(3), modes=('greedy',))['greedy']
  by_win = ev.run(params, docs, jax.random.PRNGKey(3), modes=('greedy',), unit_bytes=64)['greedy']
  ids, count = significance.unit_ids(docs, 64)
  doc_of_unit = np.zeros(count, np.int64)
  doc_of_unit[ids] = significance.document_ids(docs)
  np.testing.assert_allclose(
      np.bincount(doc_of_unit, weights=by_win['unit_ce'], minlength=len(docs)),
      by_doc['unit_ce'],
      rtol=1e-6,
  )
  assert len(by_doc['unit_ce']) == len(docs) and sum(by_win['unit_bytes']) == by_doc['bytes']
  assert by_win['bpb'] == pytest.approx(by_doc['bpb'], rel=1e-9)
  # Each window carries its document: the clustered error of the windows is the documents' error.
  assert by_win['unit_documents'] == doc_of_unit.tolist()
  assert by_doc['unit_documents'] == list(range(len(docs)))
  assert significance.ratio_and_se(
      np.bincount(by_win['unit_documents'], weights=by_win['unit_ce']),
      np.bincount(by_win['unit_documents'], weights=by_win['unit_bytes']),
  )[1] == pytest.approx(by_doc['bpb_se'], rel=1e-6)


def test_evaluator_scores_a_callers_reference_at_every_level_from_its_counts(tiny_two_stage_run):
  """A reference passed by name is scored at both levels of a two-stage model like the builtin
  ones (one counting code), and the returned counts are the sums behind every statistic."""
  from tokjax import inspection  # pylint: disable=g-import-not-at-top

  ckpt = inspection.load_checkpoint(tiny_two_stage_run[0])
  docs = [d[:400] for d in pipeline.load_splits(ckpt.config.data)['val'][:3]]
  key = jax.random.PRNGKey(4)
  refs = {'space_too': boundary_stats.whitespace, 'letter_a': lambda t, p: t == ord('a')}
  m = ckpt.evaluator.run(ckpt.params, docs, key, modes=('sample',), references=refs, counts=True)
  m = m['sample']
  plain = ckpt.evaluator.run(ckpt.params, docs, key, modes=('sample',))['sample']
  assert {k: v for k, v in m.items() if k in plain} == plain  # Extra references change nothing.
  levels = m['counts']
  assert len(levels) == 2 and sorted(levels[0]) == [
      'letter_a',
      'line',
      'space_too',
      'whitespace',
      'word_end',
  ]
  for s, prefix in enumerate(('', 'stage1_')):
    for k in ('precision', 'recall', 'f1'):
      assert m[f'{prefix}space_too_{k}'] == m[f'{prefix}whitespace_{k}']
      assert m[f'{prefix}letter_a_{k}'] == getattr(levels[s]['letter_a'], k)
    assert m[f'{prefix}line_recall'] == levels[s]['line'].recall
  c0, c1 = levels[0]['whitespace'], levels[1]['whitespace']
  assert c0.valid == m['bytes'] and m['rate'] == c0.ends / c0.valid
  assert m['stage1_rate'] == c1.ends / c0.ends and 0 < c1.ends < c0.ends
  # Letters are no whitespace: the counts of the two references differ.
  assert levels[0]['letter_a'].refs != c0.refs
  with pytest.raises(ValueError, match='bpe'):
    ckpt.evaluator.run(ckpt.params, docs, key, references={'bpe': boundary_stats.whitespace})


def test_stage_lift_is_the_precision_gain_over_the_stage_below_at_unforced_positions(
    tiny_two_stage_run,
):
  """stage1_{whitespace,line}_lift, computed per document, pools to the same number as the
  counts of references restricted to unforced positions (the other counting path)."""
  from tokjax import inspection  # pylint: disable=g-import-not-at-top

  ckpt = inspection.load_checkpoint(tiny_two_stage_run[0])
  docs = [d[:400] for d in pipeline.load_splits(ckpt.config.data)['val'][:3]]

  def unforced(tokens, positions=None):
    del positions
    m = np.zeros(np.shape(tokens), bool)
    m[:, 1:-1] = True
    return m

  refs = {
      'free': unforced,
      'ws_free': lambda t, p: boundary_stats.whitespace(t, p) & unforced(t),
      'line_free': lambda t, p: boundary_stats.line_end(t, p) & unforced(t),
  }
  m = ckpt.evaluator.run(
      ckpt.params, docs, jax.random.PRNGKey(4), modes=('sample',), references=refs, counts=True
  )['sample']
  level0, level1 = m['counts']
  for name, ref in (('whitespace', 'ws_free'), ('line', 'line_free')):
    share1, share0 = (level[ref].hits / level['free'].hits for level in (level1, level0))
    assert m[f'stage1_{name}_lift'] == pytest.approx(share1 - share0, abs=1e-12)
    assert m[f'stage1_{name}_lift_se'] > 0
  assert 'whitespace_lift' not in m  # Stage 0 has no stage below it.
