"""tokjax.significance: standard errors and paired comparisons against hand-computed values, the
clustered error's response to correlated windows, the rule (`judge`) against printed t tables, and
the clusters of a corpus (Shakespeare's works)."""

import math

import numpy as np
import pytest

from tokjax import significance
from tokjax.data import corpora, pipeline
from tokjax.errors import UserError


def test_ratio_and_se_against_hand_computed_values():
  # Documents: (ce nats, bytes) = (10, 10), (30, 20), (20, 30), and one without bytes (left out).
  # R = 60 / 60 = 1; residuals ce - R n = 0, 10, -10; se = sqrt(3 / 2 * 200) / 60 nats.
  bpb, se = significance.ratio_and_se(np.array([10.0, 30.0, 20.0, 0.0]), np.array([10, 20, 30, 0]))
  assert bpb == pytest.approx(1.4426950408889634, rel=1e-12)  # 1 / ln 2.
  assert se == pytest.approx(0.41647018510789063, rel=1e-12)  # sqrt(300) / 60 / ln 2.
  # Not the per-document mean's standard error (0.4096 / ln 2 here): the ratio estimator.
  rates = np.array([1.0, 1.5, 2.0 / 3.0])
  assert se != pytest.approx(rates.std(ddof=1) / math.sqrt(3) / math.log(2), rel=1e-3)
  # Identical per-document rates have no spread; one document has no standard error.
  assert significance.ratio_and_se(np.array([1.0, 2.0]), np.array([1.0, 2.0]))[1] == 0.0
  assert math.isnan(significance.ratio_and_se(np.array([3.0]), np.array([2.0]))[1])


def test_labels():
  assert significance.format_bpb(1.23456, 0.01234) == (
      '1.2346 +- 0.0123 s.e. (ratio estimator over documents)'
  )
  assert significance.SE_LABEL in significance.format_bpb(1.0, 0.1).replace('0.1000 ', '')
  assert significance.format_bpb(1.0, float('nan')) == '1.0000 (one document: no s.e.)'


def test_unit_ids_cut_each_document_into_fixed_windows():
  docs = [b'abc', b'hello world', b'x' * 9]
  ids, count = significance.unit_ids(docs, 4)
  # Positions per document (BOS included): 4, 12, 10 -> windows 1, 3, 3.
  assert count == 7 and len(ids) == len(pipeline.pack_documents(docs))
  np.testing.assert_array_equal(
      ids, [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4 + [6] * 2
  )
  same, n = significance.unit_ids(docs, 0)
  np.testing.assert_array_equal(same, significance.document_ids(docs))
  assert n == 3
  # And back: the document of each window, to sum windows into documents.
  np.testing.assert_array_equal(significance.unit_documents(docs, 4), [0, 1, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(significance.unit_documents(docs, 0), [0, 1, 2])


def test_paired_difference_against_hand_computed_values():
  ce_a, ce_b, nb = (
      np.array([10.0, 4.0, 9.0]),
      np.array([12.0, 3.0, 10.0]),
      np.array([5.0, 2.0, 4.0]),
  )
  p = significance.paired_difference(ce_a, ce_b, nb)
  d = ce_a - ce_b  # -2, 1, -1
  r = d.sum() / nb.sum()
  se = math.sqrt(3 / 2 * np.sum((d - r * nb) ** 2)) / nb.sum() / math.log(2)
  assert p['diff'] == pytest.approx(r / math.log(2))
  assert p['se'] == pytest.approx(se)
  assert p['a_better'] == pytest.approx(2 / 3) and p['b_better'] == pytest.approx(1 / 3)
  assert p['units'] == 3
  # The paired s.e. of a model against a copy shifted by a constant per byte is zero.
  q = significance.paired_difference(ce_b + 0.1 * nb, ce_b, nb)
  assert q['diff'] == pytest.approx(0.1 / math.log(2)) and q['se'] == pytest.approx(0, abs=1e-12)
  with pytest.raises(ValueError, match='unit counts differ'):
    significance.paired_difference(ce_a, ce_b[:2], nb)


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
  p = significance.paired_difference(ce_a, ce_b, nbytes, documents)
  assert p['diff'] == significance.paired_difference(ce_a, ce_b, nbytes)['diff']
  assert p['clustered_se'] > 2.5 * p['se'] and p['clusters'] == docs
  per_doc = lambda x: np.bincount(documents, weights=x)
  assert p['clustered_se'] == pytest.approx(
      significance.ratio_and_se(per_doc(ce_a - ce_b), per_doc(nbytes))[1], rel=1e-12
  )
  # The window error would call this difference found; the clustered error does not.
  assert significance.judge(p['diff'], p['se'], p['units'])['verdict'] == 'one seed'
  assert significance.judge(p['diff'], p['clustered_se'], docs)['verdict'] == 'not found'
  alone = significance.paired_difference(ce_a, ce_b, nbytes, np.arange(docs * windows))
  assert alone['clustered_se'] == pytest.approx(alone['se'], rel=1e-12)
  with pytest.raises(ValueError, match='cluster ids'):
    significance.paired_difference(ce_a, ce_b, nbytes, documents[:-1])


def test_t_quantiles_match_a_printed_table():
  # Student's t, two-sided 95% (t(0.975, df)), as printed in statistics tables.
  for df, t in ((1, 12.706), (2, 4.303), (7, 2.365), (10, 2.228), (math.inf, 1.960)):
    assert significance.margin({'df': df, 'combined_se': 1.0}) == pytest.approx(t, abs=5e-4)
  assert significance.margin({'df': math.nan, 'combined_se': 1.0}) == 0.0


def test_welch_satterthwaite_df_by_hand():
  # (0.01^2 + 0.02^2)^2 / (0.01^4 / 7 + 0.02^4 / 2) = 2.5e-7 / 8.142857e-8 = 3.0702.
  assert significance.welch_df([(0.01, 7), (0.02, 2)]) == pytest.approx(3.0702, abs=1e-4)
  assert significance.welch_df([(0.01, 7)]) == pytest.approx(7)  # One part: its own df.
  assert significance.welch_df([(0.0, 2), (0.01, 7)]) == pytest.approx(
      7
  )  # An exact part adds none.


def test_p_is_the_two_sided_t_tail():
  # Closed forms of the two-sided tail: df 2: 1 - t / sqrt(2 + t^2); df 1: 1 - 2 atan(t) / pi.
  j = significance.judge(0.03, 0.01, clusters=3)
  assert j['df'] == 2 and j['combined_se'] == 0.01 and j['t'] == pytest.approx(3.0)
  assert j['p'] == pytest.approx(1 - 3 / math.sqrt(11), rel=1e-9) and j['verdict'] == 'not found'
  j = significance.judge(-0.05, 0.0, clusters=8, seed_se=0.01, seeds=2)
  assert j['df'] == 1 and j['p'] == pytest.approx(1 - 2 * math.atan(5) / math.pi, rel=1e-9)
  assert significance.judge(0.05, 0.01, 8, 0.01, 9)['verdict'] == 'found'  # t = 3.5, df 14.8.


def test_the_rule_combines_errors_where_the_larger_of_the_two_would_find():
  # Synthetic losses: 8 plays, 3 seeds; model a is 0.019 bpb worse on average, by a seed-dependent
  # amount. The former rule (found beyond 2 x the larger of the clustered and seed errors) finds it.
  rng = np.random.default_rng(0)
  nbytes = np.full(8, 1000.0)
  base = rng.normal(1500.0, 50.0, 8)
  shifts = (0.010, 0.016, 0.030)  # bpb per seed.
  ce_b = [base + rng.normal(0, 1.0, 8) for _ in shifts]
  ce_a = [b + s * math.log(2) * nbytes + rng.normal(0, 1.0, 8) for b, s in zip(ce_b, shifts)]
  p = significance.paired_difference(np.mean(ce_a, 0), np.mean(ce_b, 0), nbytes, np.arange(8))
  per_seed = [significance.paired_difference(a, b, nbytes)['diff'] for a, b in zip(ce_a, ce_b)]
  seed_se = np.std(per_seed, ddof=1) / math.sqrt(3)
  assert abs(p['diff']) > 2 * max(p['clustered_se'], seed_se)  # The former rule: found.
  j = significance.judge(p['diff'], p['clustered_se'], p['clusters'], seed_se, 3)
  assert j['combined_se'] == pytest.approx(math.hypot(p['clustered_se'], seed_se))
  assert 2 < j['df'] < 2.2  # Nearly all of the error is the seeds'.
  assert j['p'] > 0.05 and j['verdict'] == 'not found'
  # One seed: beyond 2 clustered s.e. (the former "one seed") but inside t(0.975, 7) = 2.365 of them.
  assert significance.judge(0.022, 0.01, 8)['verdict'] == 'not found'
  assert significance.judge(0.025, 0.01, 8)['verdict'] == 'one seed'
  assert significance.judge(0.05, math.nan, 8, 0.01, 3)['verdict'] == 'not found'
  assert math.isnan(significance.judge(0.05, 0.01, 1)['p'])  # One cluster has no df.


def test_holm_against_hand_computed_values():
  # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> 0.06 (monotone).
  assert significance.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert significance.holm([0.3, 0.5]) == pytest.approx([0.6, 0.6])
  assert significance.holm([0.6, 0.02, 0.9]) == [1.0, pytest.approx(0.06), 1.0]  # Capped at 1.
  assert significance.holm([0.04]) == [0.04] and significance.holm([]) == []


def test_holm_leaves_comparisons_without_a_p_out_of_the_family():
  adjusted = significance.holm([0.01, None, math.nan, 0.04])
  assert adjusted[0] == pytest.approx(0.02) and adjusted[3] == pytest.approx(0.04)  # m = 2, not 4.
  assert adjusted[1] is None and math.isnan(adjusted[2])
  assert significance.holm([None, math.nan])[0] is None


def test_holm_is_never_below_the_raw_p_and_keeps_its_order():
  rng = np.random.default_rng(0)
  for m in (1, 2, 5, 12):
    for _ in range(50):
      p = rng.uniform(0, 1, m) ** 3  # Many small ones, so the cap and the running max both act.
      adjusted = np.array(significance.holm(p))
      assert np.all(adjusted >= p) and np.all(adjusted <= 1)
      order = np.argsort(p)
      assert np.all(np.diff(adjusted[order]) >= 0)
      assert adjusted[order[-1]] == min(1.0, max(adjusted[order[-2]] if m > 1 else 0, p.max()))


def test_a_family_is_judged_by_its_adjusted_p():
  # Raw p 0.030 (t = 2.4, df 14.8), 0.0020 (t = 4.5, df 8) and a one-seed 0.038 (t = 2.8, df 5).
  judged = [
      significance.judge(0.024, 0.008, 9, 0.006, 9),
      significance.judge(0.045, 0.01, 9, 0.0001, 40),
      significance.judge(0.028, 0.01, 6),
  ]
  assert [j['verdict'] for j in judged] == ['found', 'found', 'one seed']
  out = significance.judge_family(judged + [significance.judge(0.1, math.nan, 8)], 'test')
  assert [j['p_holm'] for j in out[:3]] == pytest.approx(
      significance.holm([j['p'] for j in judged])
  )
  # Holm by hand: 3 x 0.0020, then 2 x 0.030 = 0.060, then max(0.060, 1 x 0.038).
  assert out[1]['p_holm'] == pytest.approx(3 * judged[1]['p'])
  assert out[0]['p_holm'] == out[2]['p_holm'] == pytest.approx(2 * judged[0]['p'])
  assert [j['verdict'] for j in out] == ['not found', 'found', 'not found', 'not found']
  assert {j['family'] for j in out} == {'test'} and {j['family_size'] for j in out} == {3}
  assert out[0]['p'] == judged[0]['p']  # The raw p stays beside the adjusted one.


def test_a_printed_p_stays_on_its_side_of_the_level():
  assert significance.format_p(0.0496) == '0.0496'  # '0.05' would read as not found.
  assert significance.format_p(0.18) == '0.18' and significance.format_p(3.2e-7) == '3.2e-07'
  assert significance.format_p(math.nan) == '-'


def test_shakespeare_pieces_map_to_the_work_they_come_from():
  text = corpora.embedded_bytes('shakespeare')
  works = corpora.shakespeare_works(text)
  titles = [t for _, t in works]
  assert len(works) == 42 and titles[0] == "ALL'S WELL THAT ENDS WELL"
  assert 'HAMLET, PRINCE OF DENMARK' in titles and 'THE SONNETS' in titles
  assert 'THE TRAGEDY OF KING LEAR' in titles  # "THE END" of the play before is not in the title.
  assert all(text[o:].startswith(t.encode()) for o, t in works)
  docs = corpora.load_documents('shakespeare')
  clusters = corpora.document_clusters('shakespeare', docs)
  assert clusters == sorted(clusters)  # Pieces run through the file in order, work after work.
  # Only the two shortest poems (8 and 2 KB) hold the larger share of no 32 KiB piece.
  missing = {titles[k] for k in set(range(42)) - set(clusters)}
  assert missing == {'THE PASSIONATE PILGRIM', 'THE PHOENIX AND THE TURTLE'}
  hamlet = titles.index('HAMLET, PRINCE OF DENMARK')
  start = next(i for i, c in enumerate(clusters) if c == hamlet)
  assert clusters[start + 1] == hamlet  # Consecutive pieces of one play share its cluster.
  assert clusters[start - 1] != hamlet
  # The test split (as the ladder splits it): 8 pieces of 7 works.
  test = pipeline.split_documents(docs)['test']
  assert len(test) == 8 and len(set(corpora.document_clusters('shakespeare', test))) == 7
  with pytest.raises(UserError, match='not a document of corpus'):
    corpora.document_clusters('shakespeare', [b'not a piece of the plays'])


def test_a_folder_corpus_clusters_the_pieces_of_each_file(tmp_path):
  (tmp_path / 'a.txt').write_bytes(b'line of text\n' * 6000)  # 78 KB: cut into 3 pieces.
  (tmp_path / 'b.txt').write_bytes(b'short\n')
  docs = corpora.load_documents(str(tmp_path))
  assert len(docs) == 4
  assert corpora.document_clusters(str(tmp_path), docs[::-1]) == [1, 0, 0, 0]


def test_share_statistics_by_hand():
  share, se = significance.share_and_se([1, 2, 0], [2, 2, 1])
  r = 3 / 5
  resid = np.array([1 - 2 * r, 2 - 2 * r, 0 - r])
  assert share == pytest.approx(r) and se == pytest.approx(np.sqrt(1.5 * np.sum(resid**2)) / 5)
  # A paired difference of a share with itself is exactly zero, with zero spread.
  assert significance.paired_share_difference([1, 2], [2, 2], [1, 2], [2, 2]) == (0.0, 0.0)
  diff, se = significance.paired_share_difference([2, 2], [2, 2], [1, 1], [2, 2])
  assert diff == pytest.approx(0.5) and se == pytest.approx(0.0)
  # Linearised by hand: z_d = (a_d - R_a n_d) / N_a - (b_d - R_b m_d) / N_b.
  diff, se = significance.paired_share_difference([1, 3], [2, 4], [0, 1], [2, 2])
  z = np.array([(1 - 2 / 3 * 2) / 6 - (0 - 0.25 * 2) / 4, (3 - 2 / 3 * 4) / 6 - (1 - 0.25 * 2) / 4])
  assert diff == pytest.approx(2 / 3 - 1 / 4) and se == pytest.approx(np.sqrt(2 * np.sum(z**2)))
  assert np.isnan(significance.paired_share_difference([0], [0], [1], [1])[0])
