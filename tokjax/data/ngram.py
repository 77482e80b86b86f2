"""A byte n-gram language model with interpolated Witten-Bell smoothing, in numpy.

  model = ngram.fit(train_docs, max_order=8)
  bits = ngram.bits_per_order(model, val_docs)  # float64[max_order]: total bits at orders 1..max

Documents are modelled as tokjax scores them: each one alone, from its start. A document's first
bytes see a context padded with BOS (symbol 256), so no context reaches into the previous document
and the model learns how documents begin. Only bytes are predicted, never BOS or an end-of-document
symbol: tokjax's loss masks BOS targets, so neither side pays for where a document ends. Every
distribution is over the 256 bytes and sums to 1.

Witten-Bell, interpolated: with c(h, w) the training count of byte w after context h (the last
n - 1 symbols), c(h) = sum_w c(h, w) and t(h) the number of distinct bytes seen after h,
  P_n(w | h) = (c(h, w) + t(h) P_{n-1}(w | h')) / (c(h) + t(h))   if c(h) > 0, else P_{n-1}(w | h'),
where h' drops h's oldest symbol; the recursion ends at the uniform 1/256 (below order 1, the
unigram). No well-kept package fits bytes at this speed: nltk.lm scores a few thousand bytes a
second and kenlm estimates only through its command-line binaries.

A context of k <= 6 symbols of 9 bits and the byte after it pack exactly into one uint64 (62 bits),
so the counts of each order are one sort of such keys (no hashing, no collisions) and scoring is a
binary search per order; that caps the order at 7, past Shakespeare's best (its val bpb is lowest
at order 6 and higher at 7 and 8).
"""

from collections.abc import Sequence
import dataclasses

import numpy as np

BOS = 256
MAX_ORDER = 7  # A context of 6 symbols of 9 bits and a byte: 62 bits, within one uint64 key.
_SYMBOL_BITS = 9


@dataclasses.dataclass(frozen=True)
class _Level:
  """Counts of one context length k: sorted unique contexts and (context, byte) pairs."""

  contexts: np.ndarray  # uint64[C], sorted.
  context_count: np.ndarray  # int64[C]: c(h).
  distinct: np.ndarray  # int64[C]: t(h).
  pairs: np.ndarray  # uint64[P], sorted: context << 8 | byte.
  pair_count: np.ndarray  # int64[P]: c(h, w).


@dataclasses.dataclass(frozen=True)
class Model:
  levels: tuple[_Level, ...]  # levels[k]: contexts of k symbols, k = 0 .. max_order - 1.

  @property
  def max_order(self) -> int:
    return len(self.levels)


def _check_order(max_order: int) -> None:
  if not 1 <= max_order <= MAX_ORDER:
    raise ValueError(f'max_order={max_order} must be in 1..{MAX_ORDER}')


def _padded(docs: Sequence[bytes], pad: int) -> tuple[np.ndarray, np.ndarray]:
  """(symbols uint64[N], where the bytes are int64[n]): each document after `pad` BOS symbols."""
  total = sum(len(d) for d in docs) + pad * len(docs)
  symbols = np.full(total, BOS, np.uint64)
  keep = np.zeros(total, bool)
  pos = 0
  for d in docs:
    pos += pad
    symbols[pos : pos + len(d)] = np.frombuffer(d, np.uint8)
    keep[pos : pos + len(d)] = True
    pos += len(d)
  return symbols, np.flatnonzero(keep)


def _contexts(docs: Sequence[bytes], max_order: int):
  """Yields (k, keys uint64[n]) for k = 0 .. max_order - 1: key k of each byte of docs packs the k
  symbols before it (the nearest in the low bits) and the byte itself in the low 8 bits."""
  pad = max_order - 1
  symbols, at = _padded(docs, pad)
  key = symbols[at]
  yield 0, key
  for k in range(1, max_order):
    key = key | (symbols[at - k] << np.uint64(8 + _SYMBOL_BITS * (k - 1)))
    yield k, key


def fit(docs: Sequence[bytes], max_order: int) -> Model:
  """Counts of every context of 0 .. max_order - 1 bytes in docs (each document alone, BOS-padded)."""
  _check_order(max_order)
  if not any(docs):
    raise ValueError('an n-gram model needs at least one training byte')
  levels = []
  for _, key in _contexts(docs, max_order):
    pairs, pair_count = np.unique(key, return_counts=True)
    # Pairs sorted by key are grouped by context: each context starts a run.
    of_pair = pairs >> np.uint64(8)
    starts = np.flatnonzero(np.r_[True, of_pair[1:] != of_pair[:-1]])
    context_count = np.add.reduceat(pair_count, starts)
    distinct = np.diff(np.r_[starts, len(pairs)])
    levels.append(_Level(of_pair[starts], context_count, distinct, pairs, pair_count))
  return Model(tuple(levels))


def _lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(index, found) of each of keys in sorted_keys."""
  index = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
  return index, sorted_keys[index] == keys


def probabilities(model: Model, docs: Sequence[bytes]) -> np.ndarray:
  """float64[max_order, n]: P(byte | its context) of every byte of docs at orders 1 .. max_order."""
  n = sum(len(d) for d in docs)
  p = np.full(n, 1.0 / 256)
  out = np.empty((model.max_order, n))
  for k, key in _contexts(docs, model.max_order):
    level = model.levels[k]
    index, found = _lookup(level.contexts, key >> np.uint64(8))
    c_h = np.where(found, level.context_count[index], 0)
    t_h = np.where(found, level.distinct[index], 0)
    pair_index, pair_found = _lookup(level.pairs, key)
    c_hw = np.where(pair_found, level.pair_count[pair_index], 0)
    p = np.where(c_h > 0, (c_hw + t_h * p) / np.maximum(c_h + t_h, 1), p)
    out[k] = p
  return out


def bits_per_order(model: Model, docs: Sequence[bytes]) -> np.ndarray:
  """float64[max_order]: total bits of docs' bytes at orders 1 .. max_order."""
  return -np.log2(probabilities(model, docs)).sum(axis=1)
