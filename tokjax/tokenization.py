"""Showing a learned tokenization: run a model's boundary methods on text and mark each chunk end.

A model with S stages (config.model.stages) has S levels of boundaries on bytes: level 0 holds the
chunk ends of stage 0 (over bytes), level s those of stage s (over the chunks of stage s - 1), each a
subset of the level below. Boundaries are therefore float32[S, n] arrays (S = 1 for the one-stage
model); the functions that only read them also take a single level float[n]. Rendered text repeats
the delimiter once per level ending at a byte: '|' after a stage-0 chunk, '||' where a stage-1 chunk
ends too.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tokjax import stages as stages_lib
from tokjax.data import BOS_ID, PAD_ID
from tokjax.models import interface


def encode_window(text: bytes, seq_len: int) -> np.ndarray:
  """BOS + the first seq_len - 1 bytes of text, padded with PAD: int32[1, seq_len]."""
  ids = [BOS_ID] + list(text[: seq_len - 1])
  return np.asarray([ids + [PAD_ID] * (seq_len - len(ids))], np.int32)


def boundaries_for(model, params, text: bytes, seq_len: int, key, mode: str = 'greedy'):
  """-> (bytes shown, executed boundaries float32[S, n], boundary probabilities float32[S, n]) for
  text's first n = seq_len - 1 bytes at most (the BOS position is dropped); S: the model's stages
  (see `level_boundaries` for the probabilities of the levels above 0)."""
  tokens = encode_window(text, seq_len)
  actions, probs = _boundary_fn(model, mode)(params, jnp.asarray(tokens), key)
  n = min(len(text), seq_len - 1)
  # The last real byte is forced to be a boundary only when it is the last position of the window.
  return text[:n], np.asarray(actions[0, :, 1 : n + 1]), np.asarray(probs[0, :, 1 : n + 1])


def as_levels(actions) -> np.ndarray:
  """Boundaries of one level float[n] or of S levels float[S, n] -> float[S, n]."""
  a = np.asarray(actions)
  if a.ndim == 1:
    return a[None]
  if a.ndim != 2:
    raise ValueError(f'boundaries must have shape [n] or [levels, n], not {a.shape}')
  return a


def level_boundaries(out):
  """Every stage's chunk ends and boundary probabilities on bytes, from the model's output.

  Returns (actions, probs): float32[B, S, L]. Level 0 is stage 0's own (per byte). At level s >= 1,
  actions is 1 at the last byte of each stage-s chunk (`interface.boundaries_in_bytes`) and probs
  holds stage s's probability for the stage-(s-1) chunk ending at that byte (0 at bytes that end no
  stage-(s-1) chunk, where stage s decides nothing).
  """
  first = out.boundaries
  b, l = first.probs.shape
  probs = [first.probs]
  for stage in out.stages[1:]:
    at = jnp.where(stage.valid, stage.positions, l)  # Padding lands out of range: dropped.
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], at.shape)
    zeros = jnp.zeros((b, l), first.probs.dtype)
    probs.append(zeros.at[rows, at].set(stage.boundaries.probs, mode='drop'))
  actions = jnp.stack(interface.boundaries_in_bytes(out), axis=1)
  return actions.astype(jnp.float32), jnp.stack(probs, axis=1).astype(jnp.float32)


def split_chunks(text: bytes, actions, level: int = 0) -> list[bytes]:
  """Cuts text after every byte whose action at `level` is 1 (actions: float[n] or float[S, n]); the
  pieces concatenate back to text."""
  chunks, start = [], 0
  for i, a in enumerate(as_levels(actions)[level, : len(text)]):
    if a > 0.5:
      chunks.append(text[start : i + 1])
      start = i + 1
  if start < len(text):
    chunks.append(text[start:])
  return chunks


def escape(chunk: bytes) -> str:
  r"""chunk as terminal-safe text: invalid UTF-8 bytes and control characters other than newline and
  tab shown as \xNN escapes, so a binary corpus cannot drive the terminal."""
  out = chunk.decode('utf-8', errors='backslashreplace')
  return ''.join(
      f'\\x{ord(c):02x}' if (ord(c) < 32 and c not in '\n\t') or 127 <= ord(c) < 160 else c
      for c in out
  )


def render(
    text: bytes,
    actions,
    delimiter: str = '|',
    max_lines: int | None = None,
    terminal: bool = False,
) -> str:
  """Text with `delimiter` after each chunk's last byte (newline chunks keep the line layout), repeated
  once per level ending there: with actions float[S, n], '|' ends a stage-0 chunk and '||' a stage-1
  chunk too. actions may also be one level, float[n]. No delimiter follows the text's last chunk.

  terminal: escape non-printable bytes (see `escape`) for printing; otherwise invalid UTF-8 becomes
  U+FFFD, as in the files `tokjax.segment` writes.
  """
  decode = escape if terminal else (lambda c: c.decode('utf-8', errors='replace'))
  levels = as_levels(actions)[:, : len(text)]
  depth = np.sum(levels > 0.5, axis=0)  # Levels whose chunk ends at each byte.
  ends = np.flatnonzero(levels[0] > 0.5)
  chunks = split_chunks(text, levels[0])
  shown = ''.join(
      (delimiter * int(depth[ends[k - 1]]) if k else '') + decode(c) for k, c in enumerate(chunks)
  )
  lines = shown.split('\n')
  return '\n'.join(lines[:max_lines] if max_lines else lines)


def legend(stages: int, delimiter: str = '|') -> str:
  """What the delimiters of `render` mean for a model of `stages` levels of boundaries."""
  if stages == 1:
    return f'{delimiter} ends a chunk'
  return ', '.join(f'{delimiter * (s + 1)} ends a stage-{s} chunk' for s in range(stages))


def preview(text: bytes, actions, width: int = 110) -> str:
  """One line: the first `width` bytes rendered with '|' at chunk ends ('||' at stage-1 ends ...) and
  newlines shown as '⏎'."""
  levels = as_levels(actions)
  return render(text[:width], levels[:, :width], terminal=True).replace('\n', '⏎')


@functools.lru_cache(maxsize=16)
def _boundary_fn(model, mode: str):
  """The jitted boundary draw of a model, (params, tokens int32[B, L], key) -> `level_boundaries`'s
  (actions, probs) float32[B, S, L] (cached, so repeated calls reuse one compilation)."""
  return jax.jit(lambda p, t, k: level_boundaries(model.apply({'params': p}, t, k, mode=mode)))


def window_overlap(config, *, levels: stages_lib.Levels) -> int:
  """Bytes of left context each window of `segment_text` re-reads: the receptive field of the encoder
  (which alone feeds the boundary decisions), capped at half a window for full-attention encoders.

  With several stages the decisions of stage s >= 1 also read chunks, whose length in bytes has no
  bound, so the window re-reads the cap (half a window): long-range decisions near a seam may differ
  from one pass over the whole text. levels: config's (`stages.resolve`).
  """
  first, seq_len = levels[0], config.data.seq_len
  field = first.encoder_layers * (first.window - 1) if first.window > 0 else seq_len
  if len(levels) > 1:
    field = seq_len
  return max(0, min(field, (seq_len - 2) // 2))


def segment_windows(text: bytes, seq_len: int, overlap: int = 0):
  """The windows `segment_text` runs a model on, cut from text as training cuts a document.

  Window 0 is BOS and the text's first bytes, as a document starts in training; every later window
  is seq_len bytes of the text with no BOS, as a training window cut from inside a document is
  (BOS before cut text changes every decision the encoder reads it into). A later window holds
  overlap + 1 bytes already decided (context only; BOS's place holds one of them), then
  step = seq_len - 2 - overlap new bytes, then the byte after them, whose decision is not kept: the
  convention forces a boundary at a window's last position. PAD fills a window past the text's end.

  Returns (tokens int32[W, seq_len], kept): kept[k] = (start, first, count) says that positions
  first .. first + count - 1 of window k decide text[start : start + count]; the kept ranges tile
  the text.
  """
  step = seq_len - 2 - overlap
  if step < 1:
    raise ValueError(f'overlap {overlap} leaves no new bytes in a window of {seq_len}')
  tokens, kept = [], []
  for start in range(0, len(text), step):
    context = min(overlap + 1, start)
    ids = ([] if start else [BOS_ID]) + list(text[start - context : start + step + 1])
    tokens.append(ids + [PAD_ID] * (seq_len - len(ids)))
    kept.append((start, context + (0 if start else 1), min(step, len(text) - start)))
  return np.asarray(tokens, np.int32).reshape(-1, seq_len), kept


def segment_text(
    model,
    params,
    text: bytes,
    seq_len: int,
    key,
    *,
    mode: str = 'greedy',
    overlap: int = 0,
    batch_size: int = 16,
):
  """Boundaries of a text of any length at every level: (actions, probs) float32[S, n] for its n bytes
  (S: the model's stages; level s as in `level_boundaries`).

  The text is cut into windows of seq_len tokens as training cuts a document (`segment_windows`):
  the first starts with BOS, every later one with `overlap` + 1 bytes already decided (context only)
  and no BOS; then the new bytes. Only the new bytes' decisions are kept, and the window's last
  position is never kept either (the convention forces a boundary there): it is decided again, with
  context, by the next window. With overlap >= the encoder's receptive field (`window_overlap`),
  every kept decision of an independent (w = 1) policy equals the one it would make in one long
  sequence, so windows leave no seams. A sequential (w > 1) policy restarts its history at each
  window, which can change the first few decisions after the overlap, and so can the decisions of
  stages above 0 (they read whole chunks). All levels of a byte come from the same window, so each
  level's ends stay a subset of the level below. Sampled batches of windows use the keys
  fold_in(key, batch index). The text's last byte is not forced to be a boundary.
  """
  n = len(text)
  if n == 0:
    stages = interface.byte_levels(model)
    return np.zeros((stages, 0), np.float32), np.zeros((stages, 0), np.float32)
  windows, keep = segment_windows(text, seq_len, overlap)
  fn = _boundary_fn(model, mode)
  actions = probs = None
  for b in range(0, len(windows), batch_size):
    tokens = np.stack(windows[b : b + batch_size])
    pad = batch_size - len(tokens)  # Fixed batch shape: one compilation.
    tokens = np.pad(tokens, ((0, pad), (0, 0)), constant_values=PAD_ID)
    acts, ps = map(
        np.asarray, fn(params, jnp.asarray(tokens), jax.random.fold_in(key, b // batch_size))
    )
    if actions is None:
      actions, probs = np.zeros((acts.shape[1], n), np.float32), np.zeros(
          (ps.shape[1], n), np.float32
      )
    assert probs is not None  # Set with actions.
    for i in range(len(tokens) - pad):
      s, first, count = keep[b + i]
      actions[:, s : s + count] = acts[i, :, first : first + count]
      probs[:, s : s + count] = ps[i, :, first : first + count]
  return actions, probs


def chunk_offsets(actions, level: int = 0) -> list[tuple[int, int]]:
  """[(start, end)] byte offsets (end exclusive) of the chunks of `level` that `split_chunks` cuts
  (actions: float[n] or float[S, n]): they tile the text."""
  row = as_levels(actions)[level]
  ends = [i + 1 for i, a in enumerate(row) if a > 0.5]
  if not ends or ends[-1] != len(row):
    ends.append(len(row))
  return [(s, e) for s, e in zip([0] + ends[:-1], ends) if e > s]
