"""Boundary statistics against references: one definition for training, evaluation and experiments.

A reference is a rule that marks the bytes after which a boundary "should" fall (whitespace, line
ends, BPE token starts, a synthetic corpus' planted word ends). It is a function

  reference(tokens: int[B, L], positions: int[B, L] | None) -> bool[B, L]

of the input bytes and, for references tied to documents rather than to byte values, their positions
in the packed eval stream (`pipeline.stream_positions`; None where the caller has none). A boundary
after input byte t matches a reference when the reference marks byte t. `BUILTIN` holds the
references every model is scored against; a caller with more passes them by name
(`with_references`), so a new reference needs no edit here.

`Counts` are the sums the ratios come from (hits, boundaries, reference marks, scored positions).
They are a pytree: `count` runs inside jit for the training metrics (jnp, float32 sums) and on the
host for evaluation (numpy, float64 sums, exact for any realistic corpus), and `+` merges the counts
of two batches (or two halves of one), so every ratio is pooled over positions, not averaged.
"""

from collections.abc import Callable, Mapping
import operator
import types
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

WHITESPACE = (9, 10, 13, 32)  # \t \n \r space: the "spacelike" bytes boundary metrics refer to.
NEWLINE = 10
PHRASE_END = tuple(b'.,;:!?')  # A phrase ends on one of these, or on whitespace right after one.
HIST_MAX = 32  # Chunks of HIST_MAX bytes or more share the last histogram bin.

Reference = Callable[[Any, Any], Any]


def _xp(x):
  """jnp for jax arrays (tracers included), numpy otherwise."""
  return jnp if isinstance(x, jax.Array) else np


def whitespace(tokens, positions=None):
  """bool[B, L]: the byte is whitespace (`WHITESPACE`)."""
  del positions
  xp = _xp(tokens)
  return xp.isin(tokens, xp.array(WHITESPACE))


def line_end(tokens, positions=None):
  """bool[B, L]: the byte is a newline."""
  del positions
  return tokens == NEWLINE


def word_end(tokens, positions=None):
  """bool[B, L]: the byte is not whitespace and the next one is ("word| next", "word,| next").

  The other side of a word gap from `whitespace`: a chunk that ends here leaves the space to start
  the next chunk, as GPT-2's tokens do, and a model may learn words that way round. A word's
  trailing punctuation is part of it here. A row's last byte is unmarked (its next byte is not in
  the row).
  """
  del positions
  xp = _xp(tokens)
  ws = whitespace(tokens)
  before_ws = xp.concatenate([ws[..., 1:], xp.zeros_like(ws[..., :1])], axis=-1)
  return before_ws & ~ws


def unforced(tokens, positions=None):
  """bool[B, L]: input positions 1..L-2 of each row: the first and last position of a row end a
  chunk at every level, so only these carry a boundary decision."""
  del positions
  m = np.zeros(np.shape(tokens), bool)
  m[:, 1:-1] = True
  return m


BUILTIN: Mapping[str, Reference] = types.MappingProxyType(
    {'whitespace': whitespace, 'line': line_end, 'word_end': word_end}
)


def phrase_end(tokens, positions=None):
  """bool[B, L]: a phrase ends after the byte (one of PHRASE_END, or whitespace right after one)."""
  del positions
  tokens = np.asarray(tokens)
  prev = np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], axis=1)
  return np.isin(tokens, PHRASE_END) | (whitespace(tokens) & np.isin(prev, PHRASE_END))


def before_phrase_end(tokens, positions=None):
  """bool[B, L]: the whitespace byte right before a phrase's last word (the next word is closed by
  one of PHRASE_END). A chunk that ends here closes a phrase one word early: its next chunk is the
  phrase's last word, which the phrase so far may already determine."""
  del positions
  tokens = np.asarray(tokens)
  ws, mark = whitespace(tokens), np.isin(tokens, PHRASE_END)
  out = np.zeros(tokens.shape, bool)
  next_is_mark = np.zeros(tokens.shape[0], bool)  # The first delimiter after t is a mark.
  for t in range(tokens.shape[1] - 1, -1, -1):
    out[:, t] = ws[:, t] & next_is_mark
    next_is_mark = np.where(ws[:, t] | mark[:, t], mark[:, t], next_is_mark)
  return out


def after_phrase_start(tokens, positions=None):
  """bool[B, L]: the whitespace byte closing the first word after a phrase end (the mark and its
  whitespace). A chunk that ends here closes a phrase one word late: it has read the next phrase's
  first word, which may already determine the rest of that phrase."""
  del positions
  tokens = np.asarray(tokens)
  ws, mark = whitespace(tokens), np.isin(tokens, PHRASE_END)
  out = np.zeros(tokens.shape, bool)
  gap = np.zeros(tokens.shape[0], bool)  # Past a phrase end, before the next word's first byte.
  first = np.zeros(tokens.shape[0], bool)  # Inside the first word after a phrase end.
  for t in range(tokens.shape[1]):
    letter = ~ws[:, t] & ~mark[:, t]
    out[:, t] = ws[:, t] & first
    first = np.where(letter, first | gap, False)
    gap = np.where(mark[:, t], True, gap & ~letter)
  return out


def with_references(extra: Mapping[str, Reference] | None = None) -> dict[str, Reference]:
  """The builtin references and the caller's `extra` ones (a name may not be redefined)."""
  extra = dict(extra or {})
  clash = sorted(set(extra) & set(BUILTIN))
  if clash:
    raise ValueError(f'references {clash} are builtin; give yours another name.')
  return {**BUILTIN, **extra}


def stream_reference(marks) -> Reference:
  """A reference from per-document marks on bytes (BPE token starts, planted word ends).

  marks: one bool[len(doc)] per document, in the order `pipeline.pack_documents` packs them (each
  document after its BOS). The reference looks the marks up at the tokens' stream positions; a
  document's BOS and positions outside the stream (PAD rows) are unmarked.
  """
  stream = np.concatenate([np.concatenate([[False], np.asarray(m, bool)]) for m in marks])

  def reference(tokens, positions):
    if positions is None:
      raise ValueError('a stream reference needs the stream positions of the tokens.')
    pos = np.asarray(positions)
    inside = (pos >= 0) & (pos < len(stream))
    del tokens
    return stream[np.clip(pos, 0, len(stream) - 1)] & inside

  return reference


def masks(references: Mapping[str, Reference], tokens, positions=None) -> dict:
  """{name: bool[B, L]}: every reference's marks on the tokens."""
  return {name: ref(tokens, positions) for name, ref in references.items()}


@flax.struct.dataclass
class Counts:
  """Sums over scored positions for one reference (scalars, or arrays of the same shape).

  hits: boundaries on bytes the reference marks; ends: boundaries; refs: marked bytes; valid:
  scored positions. Ratios with an empty denominator are 0 (bytes_per_chunk: inf).
  """

  hits: Any
  ends: Any
  refs: Any
  valid: Any

  def __add__(self, other: 'Counts') -> 'Counts':
    return jax.tree.map(operator.add, self, other)

  @property
  def precision(self):
    """Share of boundaries that fall on the reference."""
    return self.hits / _max(self.ends, 1)

  @property
  def recall(self):
    """Share of the reference's marks that a boundary falls on."""
    return self.hits / _max(self.refs, 1)

  @property
  def f1(self):
    p, r = self.precision, self.recall
    return 2 * p * r / _max(p + r, 1e-12)

  @property
  def rate(self):
    """Boundaries per scored position."""
    return self.ends / _max(self.valid, 1)

  @property
  def base(self):
    """Share of scored positions the reference marks: the precision of boundaries placed at random."""
    return self.refs / _max(self.valid, 1)

  @property
  def bytes_per_chunk(self):
    """1 / rate (inf without boundaries; on the host only)."""
    rate = self.rate
    return 1.0 / rate if rate > 0 else float('inf')


def _max(a, b):
  return (jnp if isinstance(a, jax.Array) else np).maximum(a, b)


def count(ends, valid, reference) -> Counts:
  """Counts of boundaries `ends` against `reference` over the positions `valid`, summed over all axes.

  ends: {0,1}[..., L] (bool or float: 1 where a chunk ends after the byte); valid: {0,1}[..., L];
  reference: bool[..., L]. With jax arrays the sums are float32 jnp (jit-able), the products taken
  as in the training metrics; with numpy arrays float64 numpy (exact counts below 2**53).
  """
  if isinstance(ends, jax.Array) or isinstance(valid, jax.Array):
    ends, valid = jnp.asarray(ends, jnp.float32), jnp.asarray(valid, jnp.float32)
    ref = jnp.asarray(reference).astype(jnp.float32) * valid
    return Counts(
        hits=jnp.sum(ends * ref),
        ends=jnp.sum(ends * valid),
        refs=jnp.sum(ref),
        valid=jnp.sum(valid),
    )
  ends, valid = np.asarray(ends, np.float64), np.asarray(valid, np.float64)
  ref = np.asarray(reference, np.float64) * valid
  return Counts(
      hits=np.sum(ends * ref),
      ends=np.sum(ends * valid),
      refs=np.sum(ref),
      valid=np.sum(valid),
  )


def count_all(ends, valid, reference_masks: Mapping[str, Any]) -> dict[str, Counts]:
  """{name: `count`(ends, valid, mask)} for each reference's mask."""
  return {name: count(ends, valid, m) for name, m in reference_masks.items()}


def merge(a, b):
  """The sum of two pytrees of Counts of the same structure (dicts, lists of levels); None + b = b."""
  if a is None:
    return b
  return jax.tree.map(operator.add, a, b)


def level_rates(ends, valid) -> list:
  """Each level's boundaries per input position: per scored byte at level 0, per chunk of level
  s - 1 at level s (a level-s chunk is made of level-(s-1) chunks).

  ends, valid: the total boundaries of each level (S numbers) and the scored bytes.
  """
  below = [valid] + list(ends[:-1])
  return [e / _max(b, 1) for e, b in zip(ends, below)]


def chunk_histogram(ends, hist_max: int = HIST_MAX) -> np.ndarray:
  """int64[hist_max + 1]: lengths (in positions) between consecutive boundaries of each row.

  ends: bool[B, L]. The stretch before a row's first boundary is not a chunk of the row; lengths of
  hist_max or more share the last bin.
  """
  hist = np.zeros(hist_max + 1, np.int64)
  for row in np.asarray(ends, bool):
    lengths = np.diff(np.flatnonzero(row))
    hist += np.bincount(np.minimum(lengths, hist_max), minlength=hist_max + 1)
  return hist


def histogram_dict(hist) -> dict[str, int]:
  """{'1': n, ..., 'HIST_MAX+': n} of the non-empty bins of `chunk_histogram`."""
  last = len(hist) - 1
  return {(f'{k}+' if k == last else str(k)): int(v) for k, v in enumerate(hist) if v}
