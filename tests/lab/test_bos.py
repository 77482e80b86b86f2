"""The BOS measurement: both readings score the same bytes of windows cut inside documents."""

import jax
import numpy as np
import pytest

from tokjax import inspection
from tokjax.data import BOS_ID
from tokjax.errors import UserError
from tokjax.lab import bos


def test_windows_are_cut_inside_documents_never_at_their_start():
  docs = [bytes(range(40)), b'short', bytes(range(100, 130))]
  windows, owner = bos.cut_windows(docs, 8, max_windows=100)
  assert owner.tolist() == [0, 0, 0, 0, 2, 2]  # s = 8, 16, 24, 32 of doc 0; 8, 16 of doc 2.
  np.testing.assert_array_equal(windows[0], np.arange(8, 16))
  with pytest.raises(UserError, match='nothing is cut'):
    bos.cut_windows([b'short'], 8, max_windows=10)


def test_both_readings_score_the_same_bytes_after_the_same_text():
  windows = np.arange(12, dtype=np.uint8).reshape(2, 6) + 65
  r = {k: {n: np.asarray(v) for n, v in b.items()} for k, b in bos.readings(windows).items()}
  a, t = r['with_bos'], r['as_trained']
  assert (a['inputs'][:, 0] == BOS_ID).all() and (t['inputs'] == windows).all()
  for row in range(2):
    scored_a = a['targets'][row][a['mask'][row] > 0]
    scored_t = t['targets'][row][t['mask'][row] > 0]
    np.testing.assert_array_equal(scored_a, windows[row, 1:])
    np.testing.assert_array_equal(scored_t, windows[row, 1:])
    # The byte before each scored one is the same text in both readings.
    before_a = a['inputs'][row][a['mask'][row] > 0]
    before_t = t['inputs'][row][t['mask'][row] > 0]
    np.testing.assert_array_equal(before_a, before_t)


def test_measure_pairs_the_readings_on_a_trained_checkpoint(tiny_run):
  ckpt = inspection.load_checkpoint(tiny_run)
  length = ckpt.config.data.seq_len
  rng = np.random.default_rng(0)
  docs = [rng.integers(97, 123, 5 * length, dtype=np.uint8).tobytes() for _ in range(3)]
  out = bos.measure(ckpt, docs, jax.random.PRNGKey(0), max_windows=6, batch_size=4)
  assert out['windows'] == 6 and out['documents'] == 2
  for mode in ckpt.model.boundary_modes:
    r = out[mode]
    assert r['paired']['diff'] == pytest.approx(r['with_bos'] - r['as_trained'], abs=1e-5)
    assert r['with_bos'] != r['as_trained']
