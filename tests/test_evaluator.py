"""tokjax.evaluation: the statistics against hand-computed values, the document bookkeeping from the
pipeline's own batch positions, and agreement with the trainer's compiled eval step."""

import math

from conftest import tiny_config
import jax
import numpy as np
import pytest

from tokjax import boundary_stats, evaluation, sharding, train_state
from tokjax.data import pipeline


def test_ratio_and_se_against_hand_computed_values():
  # Documents: (ce nats, bytes) = (10, 10), (30, 20), (20, 30), and one without bytes (left out).
  # R = 60 / 60 = 1; residuals ce - R n = 0, 10, -10; se = sqrt(3 / 2 * 200) / 60 nats.
  bpb, se = evaluation.ratio_and_se(np.array([10.0, 30.0, 20.0, 0.0]), np.array([10, 20, 30, 0]))
  assert bpb == pytest.approx(1.4426950408889634, rel=1e-12)  # 1 / ln 2.
  assert se == pytest.approx(0.41647018510789063, rel=1e-12)  # sqrt(300) / 60 / ln 2.
  # Not the per-document mean's standard error (0.4096 / ln 2 here): the ratio estimator.
  rates = np.array([1.0, 1.5, 2.0 / 3.0])
  assert se != pytest.approx(rates.std(ddof=1) / math.sqrt(3) / math.log(2), rel=1e-3)
  # Identical per-document rates have no spread; one document has no standard error.
  assert evaluation.ratio_and_se(np.array([1.0, 2.0]), np.array([1.0, 2.0]))[1] == 0.0
  assert math.isnan(evaluation.ratio_and_se(np.array([3.0]), np.array([2.0]))[1])


def test_labels():
  assert evaluation.format_bpb(1.23456, 0.01234) == (
      '1.2346 +- 0.0123 s.e. (ratio estimator over documents)'
  )
  assert evaluation.SE_LABEL in evaluation.format_bpb(1.0, 0.1).replace('0.1000 ', '')
  assert evaluation.format_bpb(1.0, float('nan')) == '1.0000 (one document: no s.e.)'


def test_document_ids_and_batch_positions_follow_the_packed_stream():
  docs = [b'abc', b'hello world', b'x' * 70, b'tail']
  stream = pipeline.pack_documents(docs)
  ids = evaluation.document_ids(docs)
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
  trainer = train_state.Trainer(c, sharding.make_mesh(c.mesh))
  params = trainer.init(jax.random.PRNGKey(0)).params
  key = jax.random.PRNGKey(7)
  docs = data.splits['val']
  res = evaluation.Evaluator(trainer).run(params, docs, key, batches=data.val_batches)
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


def test_unit_ids_cut_each_document_into_fixed_windows():
  docs = [b'abc', b'hello world', b'x' * 9]
  ids, count = evaluation.unit_ids(docs, 4)
  # Positions per document (BOS included): 4, 12, 10 -> windows 1, 3, 3.
  assert count == 7 and len(ids) == len(pipeline.pack_documents(docs))
  np.testing.assert_array_equal(
      ids, [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4 + [6] * 2
  )
  same, n = evaluation.unit_ids(docs, 0)
  np.testing.assert_array_equal(same, evaluation.document_ids(docs))
  assert n == 3
  # And back: the document of each window, to sum windows into documents.
  np.testing.assert_array_equal(evaluation.unit_documents(docs, 4), [0, 1, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(evaluation.unit_documents(docs, 0), [0, 1, 2])


def test_paired_difference_against_hand_computed_values():
  ce_a, ce_b, nb = (
      np.array([10.0, 4.0, 9.0]),
      np.array([12.0, 3.0, 10.0]),
      np.array([5.0, 2.0, 4.0]),
  )
  p = evaluation.paired_difference(ce_a, ce_b, nb)
  d = ce_a - ce_b  # -2, 1, -1
  r = d.sum() / nb.sum()
  se = math.sqrt(3 / 2 * np.sum((d - r * nb) ** 2)) / nb.sum() / math.log(2)
  assert p['diff'] == pytest.approx(r / math.log(2))
  assert p['se'] == pytest.approx(se)
  assert p['a_better'] == pytest.approx(2 / 3) and p['b_better'] == pytest.approx(1 / 3)
  assert p['units'] == 3
  # The paired s.e. of a model against a copy shifted by a constant per byte is zero.
  q = evaluation.paired_difference(ce_b + 0.1 * nb, ce_b, nb)
  assert q['diff'] == pytest.approx(0.1 / math.log(2)) and q['se'] == pytest.approx(0, abs=1e-12)
  with pytest.raises(ValueError, match='unit counts differ'):
    evaluation.paired_difference(ce_a, ce_b[:2], nb)


def test_evaluator_units_add_up_to_its_documents(tmp_path):
  """Per-window CE sums of each document add up to the document's, and pooled bpb is unchanged."""
  c = tiny_config(str(tmp_path))
  data = pipeline.build_data(c)
  trainer = train_state.Trainer(c, sharding.make_mesh(c.mesh))
  params = trainer.init(jax.random.PRNGKey(0)).params
  docs = [d[:300] for d in data.splits['val'][:4]]
  ev = evaluation.Evaluator(trainer)
  by_doc = ev.run(params, docs, jax.random.PRNGKey(3), modes=('greedy',))['greedy']
  by_win = ev.run(params, docs, jax.random.PRNGKey(3), modes=('greedy',), unit_bytes=64)['greedy']
  ids, count = evaluation.unit_ids(docs, 64)
  doc_of_unit = np.zeros(count, np.int64)
  doc_of_unit[ids] = evaluation.document_ids(docs)
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
  assert evaluation.ratio_and_se(
      np.bincount(by_win['unit_documents'], weights=by_win['unit_ce']),
      np.bincount(by_win['unit_documents'], weights=by_win['unit_bytes']),
  )[1] == pytest.approx(by_doc['bpb_se'], rel=1e-6)


def test_clustered_error_sees_a_shared_per_document_effect_that_the_window_error_misses():
  """40 documents of 16 windows whose differences share a per-document effect: the windows are not
  independent, so the window s.e. is far below the clustered one, which is the ratio estimator on
  the per-document sums; one window per document makes the two the same."""
  rng = np.random.default_rng(0)
  docs, windows = 40, 16
  documents = np.repeat(np.arange(docs), windows)
  nbytes = np.full(docs * windows, 2048.0)
  doc_effect = rng.normal(0.0, 0.05, docs)[documents]  # Nats per byte, shared by a document.
  ce_b = rng.uniform(1.0, 2.0, docs * windows) * nbytes
  ce_a = ce_b + (0.01 + doc_effect + rng.normal(0.0, 0.01, docs * windows)) * nbytes
  p = evaluation.paired_difference(ce_a, ce_b, nbytes, documents)
  assert p['diff'] == evaluation.paired_difference(ce_a, ce_b, nbytes)['diff']
  assert p['clustered_se'] > 2.5 * p['se'] and p['documents'] == docs
  per_doc = lambda x: np.bincount(documents, weights=x)
  assert p['clustered_se'] == pytest.approx(
      evaluation.ratio_and_se(per_doc(ce_a - ce_b), per_doc(nbytes))[1], rel=1e-12
  )
  # The window error would call this difference found; the clustered error does not.
  assert abs(p['diff']) > 2 * p['se'] and evaluation.verdict(
      p['diff'], p['clustered_se'], None
  ) == ('not found')
  alone = evaluation.paired_difference(ce_a, ce_b, nbytes, np.arange(docs * windows))
  assert alone['clustered_se'] == pytest.approx(alone['se'], rel=1e-12)
  with pytest.raises(ValueError, match='document ids'):
    evaluation.paired_difference(ce_a, ce_b, nbytes, documents[:-1])


def test_the_seed_rule_judges_by_the_larger_of_the_clustered_and_the_seed_error():
  assert evaluation.judged_se(0.01, None) == 0.01 and evaluation.judged_se(0.01, 0.03) == 0.03
  assert evaluation.verdict(0.05, 0.01, 0.02) == 'found'
  assert evaluation.verdict(-0.05, 0.01, 0.02) == 'found'
  assert evaluation.verdict(0.05, 0.01, 0.03) == 'not found'  # 0.05 < 2 x 0.03 (the seed error).
  assert evaluation.verdict(0.05, 0.03, 0.01) == 'not found'  # 0.05 < 2 x 0.03 (clustered).
  assert evaluation.verdict(0.05, 0.01, None) == 'one seed'
  assert evaluation.verdict(0.01, 0.01, None) == 'not found'
  assert evaluation.verdict(0.05, math.nan, 0.01) == 'not found'


def test_evaluator_scores_a_callers_reference_at_every_level_from_its_counts(tiny_two_stage_run):
  """A reference passed by name is scored at both levels of a two-stage model like the builtin
  ones (one counting code), and the returned counts are the sums behind every statistic."""
  from tokjax import checkpointing  # pylint: disable=g-import-not-at-top

  ckpt = checkpointing.load_checkpoint(tiny_two_stage_run[0])
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
  from tokjax import checkpointing  # pylint: disable=g-import-not-at-top

  ckpt = checkpointing.load_checkpoint(tiny_two_stage_run[0])
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


def test_share_statistics_by_hand():
  share, se = evaluation.share_and_se([1, 2, 0], [2, 2, 1])
  r = 3 / 5
  resid = np.array([1 - 2 * r, 2 - 2 * r, 0 - r])
  assert share == pytest.approx(r) and se == pytest.approx(np.sqrt(1.5 * np.sum(resid**2)) / 5)
  # A paired difference of a share with itself is exactly zero, with zero spread.
  assert evaluation.paired_share_difference([1, 2], [2, 2], [1, 2], [2, 2]) == (0.0, 0.0)
  diff, se = evaluation.paired_share_difference([2, 2], [2, 2], [1, 1], [2, 2])
  assert diff == pytest.approx(0.5) and se == pytest.approx(0.0)
  # Linearised by hand: z_d = (a_d - R_a n_d) / N_a - (b_d - R_b m_d) / N_b.
  diff, se = evaluation.paired_share_difference([1, 3], [2, 4], [0, 1], [2, 2])
  z = np.array([(1 - 2 / 3 * 2) / 6 - (0 - 0.25 * 2) / 4, (3 - 2 / 3 * 4) / 6 - (1 - 0.25 * 2) / 4])
  assert diff == pytest.approx(2 / 3 - 1 / 4) and se == pytest.approx(np.sqrt(2 * np.sum(z**2)))
  assert np.isnan(evaluation.paired_share_difference([0], [0], [1], [1])[0])
