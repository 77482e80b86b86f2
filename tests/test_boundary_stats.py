"""tokjax.boundary_stats: each reference's marks on hand-made bytes, counts against hand counts,
merging, and the jit (training) and host (evaluation) paths agreeing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import boundary_stats as bs
from tokjax.data import pipeline


def _bytes(text: bytes) -> np.ndarray:
  return np.frombuffer(text, np.uint8).astype(np.int32)[None]


def test_builtin_references_mark_whitespace_line_ends_and_word_ends():
  tokens = _bytes(b'a b\tc\nd\re.')
  refs = bs.masks(bs.BUILTIN, tokens)
  assert sorted(refs) == ['line', 'whitespace', 'word_end']
  np.testing.assert_array_equal(np.flatnonzero(refs['whitespace'][0]), [1, 3, 5, 7])
  np.testing.assert_array_equal(np.flatnonzero(refs['line'][0]), [5])
  np.testing.assert_array_equal(np.flatnonzero(refs['word_end'][0]), [0, 2, 4, 6])
  # A word end is the last byte before a gap: not inside a run of whitespace, and not a row's last
  # byte (its next byte is unknown).
  np.testing.assert_array_equal(np.flatnonzero(bs.word_end(_bytes(b'ab  c d'))[0]), [1, 4])
  # The same marks from jax arrays (the training metrics' path).
  for name, ref in bs.BUILTIN.items():
    np.testing.assert_array_equal(ref(jnp.asarray(tokens), None), refs[name])


def test_phrase_end_reference_marks_punctuation_and_the_whitespace_after_it():
  tokens = _bytes(b'hi, you. ok!\nno ;x')
  # ',' 2, ' ' 3 after it, '.' 7, ' ' 8, '!' 11, '\n' 12; ' ' at 15 follows 'o'; ';' 16.
  np.testing.assert_array_equal(np.flatnonzero(bs.phrase_end(tokens)[0]), [2, 3, 7, 8, 11, 12, 16])
  # Row starts have no previous byte: a leading space is no phrase end.
  np.testing.assert_array_equal(bs.phrase_end(_bytes(b' .'))[0], [False, True])


def test_stream_reference_reads_document_marks_at_the_batch_stream_positions():
  docs = [b'abcd', b'xyz', b'hello']
  marks = [np.array([1, 0, 1, 0], bool), np.array([0, 1, 1], bool), np.array([1, 0, 0, 0, 1], bool)]
  ref = bs.stream_reference(marks)
  stream = pipeline.pack_documents(docs)
  found = {}
  for batch in pipeline.make_eval_batches(docs, seq_len=4, batch_size=2):
    pos = pipeline.stream_positions(batch)
    m = ref(batch['inputs'], pos)
    outside = (pos < 0) | (pos >= len(stream))
    assert not m[outside].any()  # PAD rows and positions past the stream are unmarked.
    pos, m = np.where(outside, -1, pos), np.where(outside, False, m)
    for p, v in zip(pos[pos >= 0], m[pos >= 0]):
      found[int(p)] = bool(v)
  # Each document's BOS is unmarked; byte j of a document is marked as marks[j] says.
  expected = np.concatenate([np.concatenate([[False], m]) for m in marks])
  assert len(expected) == len(stream)
  assert found == {p: bool(expected[p]) for p in found} and len(found) >= len(stream) - 1
  with pytest.raises(ValueError, match='stream positions'):
    ref(batch['inputs'], None)


def test_counts_against_a_hand_count():
  ends = np.array([[1, 0, 1, 1, 0, 1], [0, 1, 0, 0, 1, 1]], bool)
  ref = np.array([[1, 1, 0, 1, 0, 0], [0, 1, 1, 0, 0, 1]], bool)
  valid = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], bool)
  c = bs.count(ends, valid, ref)
  # Valid ends: row 0 at 0, 2, 3; row 1 at 1, 4, 5 -> 6. Valid marks: 0, 1, 3 and 1, 2, 5 -> 6.
  # Hits: row 0 at 0, 3; row 1 at 1, 5 -> 4. Valid positions: 11.
  assert (c.hits, c.ends, c.refs, c.valid) == (4, 6, 6, 11)
  assert c.precision == pytest.approx(4 / 6) and c.recall == pytest.approx(4 / 6)
  assert c.f1 == pytest.approx(4 / 6) and c.rate == pytest.approx(6 / 11)
  assert c.base == pytest.approx(6 / 11) and c.bytes_per_chunk == pytest.approx(11 / 6)
  # Unequal precision and recall: 2 hits of 4 ends and 8 marks.
  d = bs.Counts(hits=2.0, ends=4.0, refs=8.0, valid=10.0)
  assert (d.precision, d.recall) == (0.5, 0.25) and d.f1 == pytest.approx(1 / 3)
  # Empty sides give 0, no boundaries give inf bytes per chunk.
  e = bs.count(np.zeros((1, 3), bool), np.ones((1, 3), bool), np.zeros((1, 3), bool))
  assert (e.precision, e.recall, e.f1, e.rate) == (0, 0, 0, 0) and e.bytes_per_chunk == np.inf


def test_counts_of_two_halves_merge_to_the_whole():
  rng = np.random.default_rng(0)
  ends, ref, valid = (rng.random((6, 40)) < p for p in (0.3, 0.2, 0.9))
  whole = bs.count(ends, valid, ref)
  halves = bs.count(ends[:2], valid[:2], ref[:2]) + bs.count(ends[2:], valid[2:], ref[2:])
  assert halves == whole and whole.hits > 0
  # The same through merge on per-level dicts, and with None as the empty start.
  a = [bs.count_all(ends[:3], valid[:3], {'r': ref[:3]})]
  b = [bs.count_all(ends[3:], valid[3:], {'r': ref[3:]})]
  assert bs.merge(bs.merge(None, a), b) == [{'r': whole}]
  # Pooled, not averaged: the halves' precisions differ from the whole's in general.
  assert halves.precision != pytest.approx((a[0]['r'].precision + b[0]['r'].precision) / 2)


def test_jit_counts_equal_the_host_counts():
  rng = np.random.default_rng(1)
  tokens = rng.choice([10, 32, 97, 98], size=(4, 32)).astype(np.int32)
  ends = (rng.random((4, 32)) < 0.4).astype(np.float32)
  valid = (rng.random((4, 32)) < 0.8).astype(np.float32)

  @jax.jit
  def stats(tokens, ends, valid):
    c = bs.count(ends, valid, bs.whitespace(tokens))
    return c, c.precision, c.recall, c.rate

  got = jax.device_get(stats(tokens, ends, valid))
  host = bs.count(ends > 0.5, valid > 0, bs.whitespace(tokens))
  assert got[0] == jax.tree.map(np.float32, host)
  np.testing.assert_allclose(got[1:], [host.precision, host.recall, host.rate], rtol=1e-6)


def test_level_rates_and_chunk_histogram():
  # Level 0: 6 ends in 20 scored bytes; level 1: 2 of those 6 chunks.
  assert bs.level_rates([6.0, 2.0], 20.0) == pytest.approx([0.3, 1 / 3])
  ends = np.zeros((2, 12), bool)
  ends[0, [0, 3, 4, 10]] = True  # Chunks of 3, 1, 6 after the first end.
  ends[1, [2]] = True  # One end: no whole chunk.
  hist = bs.chunk_histogram(ends, hist_max=4)
  np.testing.assert_array_equal(hist, [0, 1, 0, 1, 1])  # 6 >= 4 goes to the last bin.
  assert bs.histogram_dict(hist) == {'1': 1, '3': 1, '4+': 1}


def test_a_reference_may_not_shadow_a_builtin():
  assert list(bs.with_references({'mine': bs.whitespace})) == [
      'whitespace',
      'line',
      'word_end',
      'mine',
  ]
  with pytest.raises(ValueError, match='builtin'):
    bs.with_references({'line': bs.whitespace})


def test_training_metrics_against_a_hand_count():
  from tokjax import losses  # pylint: disable=g-import-not-at-top

  tokens = _bytes(b'ab cd\nef g')
  actions = np.array([[0, 1, 1, 0, 0, 1, 0, 1, 0, 1]], np.float32)
  mask = np.array([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0]], np.float32)
  dropped = np.array([[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]], np.float32)
  m = jax.device_get(jax.jit(losses.boundary_metrics)(tokens, actions, mask, dropped))
  # Scored: 9 bytes, 4 boundaries (1, 2, 5, 7); whitespace at 2, 5 (hit) and 8; '\n' at 5 (hit).
  assert sorted(m) == sorted(
      [
          'rate',
          'bytes_per_chunk',
          'whitespace_recall',
          'whitespace_precision',
          'line_precision',
          'word_end_recall',
          'overflow',
          'overflow_rows',
      ]
  )
  # Word ends ('b', 'd', 'f': before ' ', '\n', ' ') at 1, 4, 7; boundaries at 1 and 7.
  np.testing.assert_allclose(m['word_end_recall'], 2 / 3, rtol=1e-6)
  np.testing.assert_allclose(
      [m['rate'], m['bytes_per_chunk'], m['whitespace_recall'], m['whitespace_precision']],
      [4 / 9, 9 / 4, 2 / 3, 2 / 4],
      rtol=1e-6,
  )
  # Overflow: 1 dropped of 1 + 5 placed (the unscored last position's boundary counts too).
  np.testing.assert_allclose([m['line_precision'], m['overflow']], [1 / 4, 1 / 6], rtol=1e-6)
