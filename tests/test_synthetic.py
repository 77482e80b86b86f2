"""Tests of the synthetic planted-segment corpus and the boundary F1 of tokjax/lab/synthetic.py."""

import numpy as np
import pytest

from tokjax.data import BOS_ID, PAD_ID
from tokjax.lab import synthetic
from tokjax.models.rivals import rules

N_BYTES = 127


def _words(doc):
  """The document cut after every planted end (the cut-off last word, if any, is dropped)."""
  starts = np.concatenate([[0], doc.ends[:-1] + 1])
  return [doc.text[s : e + 1] for s, e in zip(starts, doc.ends)]


@pytest.mark.parametrize(
    'spec', [synthetic.CorpusSpec(), synthetic.CorpusSpec(lexicon_size=16, terminator=b'')]
)
def test_planted_ends_are_word_ends(spec):
  lexicon = synthetic.make_lexicon(np.random.default_rng(3), spec)
  docs = synthetic.make_corpus(seed=1, lexicon_seed=3, num_docs=20, n_bytes=N_BYTES, spec=spec)
  for doc in docs:
    assert len(doc.text) == N_BYTES and len(doc.copied) == N_BYTES
    words = _words(doc)
    assert b''.join(words) == doc.text[: doc.ends[-1] + 1]
    # Only the last word may be cut: what follows the last planted end is shorter than a word.
    assert N_BYTES - 1 - doc.ends[-1] < spec.max_len
    for w in words:
      assert spec.min_len <= len(w) <= spec.max_len
      if spec.terminator:
        assert w.endswith(spec.terminator) and spec.terminator not in w[: -len(spec.terminator)]
      else:
        assert w in lexicon
    if spec.terminator == b' ':  # Every space is a planted end and nothing else is.
      spaces = [i for i, c in enumerate(doc.text) if c == ord(' ')]
      assert spaces == doc.ends.tolist()


def test_copied_half_repeats_the_block_before_it():
  doc = synthetic.make_corpus(seed=2, lexicon_seed=0, num_docs=1, n_bytes=1000)[0]
  words = _words(doc)
  starts = np.concatenate([[0], doc.ends[:-1] + 1])
  flags = [bool(doc.copied[s]) for s in starts]
  runs, i = 0, 0
  while i < len(words):
    if flags[i]:
      j = i
      while j < len(words) and flags[j]:
        j += 1
      k, block = j - i, 0  # The copy's length, and the original block's (the run before it).
      while block < i and not flags[i - 1 - block]:
        block += 1
      assert 3 <= block <= 6 and (k == block or j == len(words))  # The end may cut a copy short.
      assert words[i:j] == words[i - block : i - block + k]
      runs, i = runs + 1, j
    else:
      i += 1
  assert runs >= 5
  assert 0.4 < doc.copied.mean() < 0.6


def test_deterministic_by_seed():
  a = synthetic.make_corpus(seed=5, lexicon_seed=0, num_docs=4, n_bytes=N_BYTES)
  b = synthetic.make_corpus(seed=5, lexicon_seed=0, num_docs=4, n_bytes=N_BYTES)
  c = synthetic.make_corpus(seed=6, lexicon_seed=0, num_docs=4, n_bytes=N_BYTES)
  assert [d.text for d in a] == [d.text for d in b]
  assert all(np.array_equal(x.ends, y.ends) for x, y in zip(a, b))
  assert [d.text for d in a] != [d.text for d in c]


def test_planted_rate_matches_target():
  docs = synthetic.make_corpus(seed=0, lexicon_seed=0, num_docs=200, n_bytes=N_BYTES)
  rate = np.mean([len(d.ends) for d in docs]) / N_BYTES
  assert abs(rate - 0.2) < 0.01


def test_boundary_f1_hand_made():
  got = synthetic.boundary_f1([0, 1, 0, 1, 1], [0, 1, 0, 0, 1], 5)
  assert got['precision'] == pytest.approx(2 / 3) and got['recall'] == 1.0
  assert got['f1'] == pytest.approx(0.8) and got['rate'] == pytest.approx(0.6)
  assert synthetic.boundary_f1([0, 0, 0], [1, 0, 1], 3)['f1'] == 0.0
  assert synthetic.boundary_f1([1, 0, 1], [1, 0, 1], 3)['f1'] == 1.0
  # Positions from n on are ignored.
  assert synthetic.boundary_f1([1, 0, 1, 1], [1, 0, 1, 0], 3)['f1'] == 1.0
  # Micro average over rows: row 1 has tp 1 of 2 predicted, row 2 tp 0 of 1; 3 planted in all.
  got = synthetic.boundary_f1([[1, 1, 0], [0, 0, 1]], [[1, 0, 0], [0, 1, 0]], 3)
  assert got['precision'] == pytest.approx(1 / 3) and got['recall'] == pytest.approx(1 / 2)


def test_eval_arrays_align_with_the_boundary_convention():
  docs = synthetic.make_corpus(seed=0, lexicon_seed=0, num_docs=3, n_bytes=N_BYTES)
  arr = synthetic.eval_arrays(docs, N_BYTES + 1)
  assert (arr['tokens'][:, 0] == BOS_ID).all() and (arr['targets'][:, -1] == PAD_ID).all()
  np.testing.assert_array_equal(arr['tokens'][:, 1:], arr['targets'][:, :-1])
  assert (arr['oracle'][:, 0] == 1).all() and (arr['oracle'][:, -1] == 1).all()
  for i, d in enumerate(docs):  # Input position t holds byte t - 1.
    np.testing.assert_array_equal(
        np.flatnonzero(arr['oracle'][i, 1:-1]), d.ends[d.ends < N_BYTES - 1]
    )
  # The 'oracle' run's whitespace rule executes exactly the planted ends.
  rule = np.asarray(rules.whitespace_rule(arr['tokens']))
  np.testing.assert_array_equal(rule[:, 1:-1], arr['oracle'][:, 1:-1])
  with pytest.raises(synthetic.UserError):
    synthetic.eval_arrays(docs, N_BYTES)
