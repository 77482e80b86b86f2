"""tokjax.significance: standard errors and paired comparisons against hand-computed values, the
clustered error's response to correlated windows, and the seed rule."""

import math

import numpy as np
import pytest

from tokjax import significance
from tokjax.data import pipeline


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
  assert p['clustered_se'] > 2.5 * p['se'] and p['documents'] == docs
  per_doc = lambda x: np.bincount(documents, weights=x)
  assert p['clustered_se'] == pytest.approx(
      significance.ratio_and_se(per_doc(ce_a - ce_b), per_doc(nbytes))[1], rel=1e-12
  )
  # The window error would call this difference found; the clustered error does not.
  assert abs(p['diff']) > 2 * p['se'] and significance.verdict(
      p['diff'], p['clustered_se'], None
  ) == ('not found')
  alone = significance.paired_difference(ce_a, ce_b, nbytes, np.arange(docs * windows))
  assert alone['clustered_se'] == pytest.approx(alone['se'], rel=1e-12)
  with pytest.raises(ValueError, match='document ids'):
    significance.paired_difference(ce_a, ce_b, nbytes, documents[:-1])


def test_the_seed_rule_judges_by_the_larger_of_the_clustered_and_the_seed_error():
  assert significance.judged_se(0.01, None) == 0.01 and significance.judged_se(0.01, 0.03) == 0.03
  assert significance.verdict(0.05, 0.01, 0.02) == 'found'
  assert significance.verdict(-0.05, 0.01, 0.02) == 'found'
  assert significance.verdict(0.05, 0.01, 0.03) == 'not found'  # 0.05 < 2 x 0.03 (the seed error).
  assert significance.verdict(0.05, 0.03, 0.01) == 'not found'  # 0.05 < 2 x 0.03 (clustered).
  assert significance.verdict(0.05, 0.01, None) == 'one seed'
  assert significance.verdict(0.01, 0.01, None) == 'not found'
  assert significance.verdict(0.05, math.nan, 0.01) == 'not found'


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
