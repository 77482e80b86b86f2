"""Shared text between corpora (tokjax/data/overlap.py): exact counts on planted overlaps."""

import numpy as np
import pytest

from tokjax.data import overlap


def _random_bytes(n, seed):
  return np.random.default_rng(seed).integers(1, 256, size=n, dtype=np.uint8).tobytes()


def test_copied_text_is_found_and_fresh_text_is_not():
  train = [_random_bytes(5000, 0), _random_bytes(3000, 1)]
  copied = [train[0][100:2100], train[1][7:1007]]
  fresh = [_random_bytes(4000, 2)]
  assert overlap.verbatim_share(copied, train, num_windows=200) == (1.0, 200)
  assert overlap.verbatim_share(fresh, train, num_windows=200) == (0.0, 200)


def test_share_counts_windows_not_documents():
  train = [_random_bytes(20000, 3)]
  # The first half of the document is training text, the second half is new: windows that start in
  # the first half and end in it are found, the rest are not.
  doc = train[0][:10000] + _random_bytes(10000, 4)
  share, n = overlap.verbatim_share([doc], train, window=64, num_windows=4000, seed=1)
  expected = (10000 - 64 + 1) / (len(doc) - 64 + 1)
  assert n == 4000
  assert share == pytest.approx(expected, abs=0.03)


def test_a_window_across_two_training_documents_is_not_shared():
  a, b = _random_bytes(500, 5), _random_bytes(500, 6)
  doc = a[-32:] + b[:32]  # Exactly one 64-byte window, found only in a + b joined.
  assert overlap.verbatim_share([doc], [a, b], num_windows=10) == (0.0, 10)
  assert overlap.verbatim_share([doc], [a + b], num_windows=10) == (1.0, 10)
  with_separator = a[-20:] + overlap.SEPARATOR + b[:43]
  assert overlap.verbatim_share([with_separator], [a, b], num_windows=5) == (0.0, 5)


def test_documents_shorter_than_a_window_hold_none():
  share, n = overlap.verbatim_share([b'short'], [b'short text'], window=64)
  assert n == 0 and np.isnan(share)
