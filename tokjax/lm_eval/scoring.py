"""Log-likelihood of byte strings under a tokjax checkpoint, in windows of the model's sequence length.

This is the computation behind the lm-evaluation-harness adapter (`tokjax.lm_eval.model`); it needs no
lm-eval. A request is a text (bytes) and the offset where its scored part begins: lm-eval's
(context, continuation) is text = context + continuation scored from len(context), a rolling document
is the text scored from 0.

Windows. Every window is a row of the model's seq_len L input positions predicting text[start:end]
(at most L bytes; the logits at the last input predict nothing scored). Position 0 holds what
training puts there. Training cuts its windows anywhere in a stream of BOS + document, so BOS only
ever precedes a document's first byte and a window that starts inside a document reads a plain byte
at position 0. So a row at the text's start (start = 0) reads BOS, text[0:end-1]; a row cut from
the left (start > 0: a context longer than the window, a rolling window after the first) reads
text[start-1:end-1], the cut text from position 0 with no BOS (the byte before start where BOS was).
Measured: on `python -m tokjax.train --config configs/compare.py:policy --config.train.workdir=RUN`
(600 steps, val bpb 2.377), `python -m tokjax.lab.bos --checkpoint RUN --split test` scores the same
bytes of 475 windows cut inside the 20 test documents after BOS and as a training window reads
them: BOS before the cut text costs +0.017 bpb with greedy boundaries (2.642 against 2.624;
clustered s.e. 0.002) and +0.008 with sampled ones (2.630 against 2.622; clustered s.e. 0.003).
`windows` lays them out:
  - when the scored part fits in one row, one row holding it and as much of the text before it as
    fits (a context longer than the window is truncated from the left);
  - otherwise (a rolling document longer than L) the first row scores text[0:L] and every later row
    scores the next L - overlap bytes with the `overlap` bytes before them as context (the last row
    takes as much context as fits), so every byte is scored exactly once.

Boundaries are drawn by the model over the whole row, context included, as in training:
  - greedy: one pass with the greedy boundary decisions;
  - sample: K draws z_1..z_K of the boundary policy. A draw gives log p(x | z), and
    p(x) = E_{z ~ policy}[p(x | z)] (the policy decides a_t from x_{<=t} only, so it is the prior of
    the boundaries in the model's joint distribution). A single draw's cross-entropy -log p(x | z)
    bounds -log p(x) from above in expectation (Jensen); log-mean-exp over K draws,
    log (1/K sum_k p(x | z_k)), is a tighter estimate whose expectation rises to log p(x) with K
    (Burda et al., 2016). For a scored part after a context, the window's estimate is
    log sum_k p(context, scored | z_k) - log sum_k p(context | z_k): the draws weighted by how well
    they explain the context (self-normalised importance sampling of p(scored | context)); with K = 1
    it is the single draw's log p(scored | context, z_1).
Each row draws with fold_in(fold_in(key, crc32 of its text), draw), so a text's score does not depend
on the batch it lands in, nor on the other requests.

Rows are batched into static shapes (batch_size, length) with length the smallest of `row_lengths` that
holds the row, so the forward compiles once per shape. The forward is `tokjax.evaluator._forward`,
the Evaluator's, run on one row at a time under vmap (per-row keys); the argmax of its logits (for
is_greedy: over the 256 byte values, as generation draws bytes) is read from the model's output
through `flax.linen.intercept_methods` instead of a second forward.

Shape names: R rows of a batch, L row length, K draws.
"""

import dataclasses
import functools
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tokjax import evaluator
from tokjax.data import BOS_ID, PAD_ID
from tokjax.errors import UserError

MODES = ('greedy', 'sample')


def windows(n: int, score_from: int, length: int, overlap: int) -> list[tuple[int, int, int]]:
  """The rows that score text[score_from:n] with at most `length` bytes each (see the module docs).

  Returns [(start, end, first)]: the row predicts text[start:end] (after BOS when start = 0, after
  text[start - 1] otherwise) and scores the bytes text[first:end]; the scored spans are disjoint and
  cover [score_from, n).
  """
  if not 0 <= overlap < length:
    raise UserError(f'the rolling overlap must be in [0, {length}), got {overlap}.')
  out: list[tuple[int, int, int]] = []
  s = score_from
  while s < n:
    if n - s <= (length if not out else length - overlap):
      e = n  # The rest fits: one row with as much context as fits.
    else:
      e = max(length, s + length - overlap) if not out else s + length - overlap
    out.append((max(0, e - length), e, s))
    s = e
  return out


def row_lengths(seq_len: int, smallest: int = 128) -> tuple[int, ...]:
  """The static row lengths: powers of two from `smallest` below seq_len, then seq_len itself."""
  lengths, n = [], smallest
  while n < seq_len:
    lengths.append(n)
    n *= 2
  return tuple(lengths) + (seq_len,)


@dataclasses.dataclass(frozen=True)
class Score:
  """A request's score: summed log-probability (nats) of its scored bytes, their count, and whether
  every scored byte is the argmax of its logits (under the first draw)."""

  logprob: float
  num_bytes: int
  is_greedy: bool


def _text_key(key, text: bytes):
  return jax.random.fold_in(key, zlib.crc32(text) & 0x7FFFFFFF)


class Scorer:
  """Scores byte strings with a restored checkpoint (`tokjax.inspection.load_checkpoint`).

  mode: 'greedy' or 'sample' boundaries (a flat model has none: its one pass is used for both);
  draws: K, sample only; batch_size: rows per forward; overlap: context bytes of rolling windows after
  the first (default seq_len // 2); key: the base key of the boundary draws.
  """

  def __init__(self, ckpt, mode='greedy', draws=1, batch_size=8, overlap=None, key=None):
    if mode not in MODES:
      raise UserError(f'--boundaries={mode!r} is not valid; use greedy or sample.')
    if draws < 1:
      raise UserError(f'--draws={draws} must be at least 1.')
    if draws > 1 and mode != 'sample':
      raise UserError(
          f'--draws={draws} needs --boundaries=sample: greedy boundaries are one deterministic draw.'
      )
    if batch_size < 1:
      raise UserError(f'--batch_size={batch_size} must be at least 1.')
    self.config = ckpt.config
    self.model, self.params = ckpt.model, ckpt.params
    if not self.model.num_stages and draws > 1:
      raise UserError('a flat model has no boundaries to draw; drop --draws.')
    self.mode, self.draws, self.batch_size = mode, draws, batch_size
    self.seq_len = self.config.data.seq_len
    self.overlap = self.seq_len // 2 if overlap is None else overlap
    self.key = jax.random.PRNGKey(0) if key is None else key
    self.lengths = row_lengths(self.seq_len)
    # A model without boundaries: the Evaluator's only mode; otherwise the boundaries asked for.
    self.forward_mode = mode if mode in self.model.boundary_modes else 'sample'
    self._forward = jax.jit(
        jax.vmap(
            functools.partial(_row_forward, self.model, self.forward_mode), in_axes=(None, 0, 0)
        )
    )

  def _rows(self, texts, score_from):
    """Every (request, window, draw) row: (request, window, draw, start, end, first, text)."""
    rows = []
    for i, (text, c) in enumerate(zip(texts, score_from)):
      for w, (start, end, first) in enumerate(windows(len(text), c, self.seq_len, self.overlap)):
        for k in range(self.draws):
          rows.append((i, w, k, start, end, first, text))
    return rows

  def score(self, texts: list[bytes], score_from: list[int]) -> list[Score]:
    """The score of text[score_from:] of each text (see the module docstring)."""
    rows = self._rows(texts, score_from)
    full = np.zeros(len(rows))  # Log-probability of text[start:end] in each row.
    ctx = np.zeros(len(rows))  # ... of text[start:first], the row's context.
    greedy = np.zeros(len(rows), bool)
    by_len: dict[int, list[int]] = {}
    for r, (*_, start, end, _, _) in enumerate(rows):
      length = next(n for n in self.lengths if n >= end - start)
      by_len.setdefault(length, []).append(r)
    for length, members in sorted(by_len.items()):
      for b in range(0, len(members), self.batch_size):
        chunk = members[b : b + self.batch_size]
        batch, keys = self._batch([rows[r] for r in chunk], length)
        ce, hit = jax.device_get(self._forward(self.params, batch, keys))
        for j, r in enumerate(chunk):
          *_, start, end, first, _ = rows[r]
          full[r] = -ce[j, : end - start].sum(dtype=np.float64)
          ctx[r] = -ce[j, : first - start].sum(dtype=np.float64)
          greedy[r] = bool(hit[j, first - start : end - start].all())
    out: list[Score] = []
    groups: dict[tuple[int, int], list[int]] = {}
    for r, (i, w, *_) in enumerate(rows):
      groups.setdefault((i, w), []).append(r)
    logprob = np.zeros(len(texts))
    is_greedy = np.ones(len(texts), bool)
    for (i, _), members in groups.items():
      f, c = full[members], ctx[members]
      # log sum_k p(ctx, scored | z_k) - log sum_k p(ctx | z_k); for K = 1 simply f - c.
      logprob[i] += _logsumexp(f) - _logsumexp(c)
      is_greedy[i] &= greedy[members[0]]
    for i, (text, start) in enumerate(zip(texts, score_from)):
      out.append(Score(float(logprob[i]), len(text) - start, bool(is_greedy[i])))
    return out

  def _batch(self, rows, length):
    """Inputs/targets/mask int32/float32[R, length] (R = batch_size, unused rows masked) and the
    rows' keys."""
    inputs = np.full((self.batch_size, length), PAD_ID, np.int32)
    targets = np.full((self.batch_size, length), PAD_ID, np.int32)
    mask = np.zeros((self.batch_size, length), np.float32)
    keys = [self.key] * self.batch_size
    for j, (_, _, k, start, end, _, text) in enumerate(rows):
      ids = np.frombuffer(text[start:end], np.uint8).astype(np.int32)
      inputs[j, 0] = BOS_ID if start == 0 else text[start - 1]  # See the module docstring.
      inputs[j, 1 : end - start] = ids[:-1]
      targets[j, : end - start] = ids
      mask[j, : end - start] = 1.0
      keys[j] = jax.random.fold_in(_text_key(self.key, text[start:end]), k)
    batch = {'inputs': inputs, 'targets': targets, 'mask': mask}
    return batch, jnp.stack(keys)


def _logsumexp(x) -> float:
  m = np.max(x)
  return float(m + np.log(np.sum(np.exp(x - m)))) if np.isfinite(m) else float(m)


def _row_forward(model, mode, params, row, key):
  """`evaluator._forward` on one row: row {inputs, targets, mask}: [L] -> (CE nats float32[L],
  whether each target is the argmax of the model's byte logits bool[L])."""
  captured = {}
  depth = [0]

  def outermost_logits(next_fun, args, kwargs, context):
    if context.method_name != '__call__' or type(context.module) is not type(model):
      return next_fun(*args, **kwargs)
    top = depth[0] == 0
    depth[0] += 1
    try:
      out = next_fun(*args, **kwargs)
    finally:
      depth[0] -= 1
    if top:  # The model's own __call__, entered first by model.apply inside _forward.
      captured['argmax'] = jnp.argmax(out.logits[..., :256], axis=-1)
    return out

  with nn.intercept_methods(outermost_logits):
    ce, _ = evaluator._forward(  # pylint: disable=protected-access
        model, mode, params, {k: v[None] for k, v in row.items()}, key
    )
  return ce[0], captured['argmax'][0] == row['targets']
