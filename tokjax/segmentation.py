"""Showing a learned tokenization: run a model's boundary method on text and mark each chunk end."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tokjax.data import BOS_ID, PAD_ID


def encode_window(text: bytes, seq_len: int) -> np.ndarray:
  """BOS + the first seq_len - 1 bytes of text, padded with PAD: int32[1, seq_len]."""
  ids = [BOS_ID] + list(text[: seq_len - 1])
  return np.asarray([ids + [PAD_ID] * (seq_len - len(ids))], np.int32)


def boundaries_for(model, params, text: bytes, seq_len: int, key, mode: str = 'greedy'):
  """-> (bytes shown, executed boundaries float[n], boundary probabilities float[n]) for text's
  first seq_len - 1 bytes (the BOS position is dropped)."""
  tokens = encode_window(text, seq_len)
  out = _boundary_fn(model, mode)(params, jnp.asarray(tokens), key)
  n = min(len(text), seq_len - 1)
  # The last real byte is forced to be a boundary only when it is the last position of the window.
  return text[:n], np.asarray(out.actions[0, 1 : n + 1]), np.asarray(out.probs[0, 1 : n + 1])


def split_chunks(text: bytes, actions) -> list[bytes]:
  """Cuts text after every byte whose action is 1; the pieces concatenate back to text."""
  chunks, start = [], 0
  for i, a in enumerate(actions[: len(text)]):
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
  """Text with `delimiter` after each chunk's last byte (newline chunks keep the line layout).

  terminal: escape non-printable bytes (see `escape`) for printing; otherwise invalid UTF-8 becomes
  U+FFFD, as in the files `tokjax.segment` writes.
  """
  decode = escape if terminal else (lambda c: c.decode('utf-8', errors='replace'))
  shown = delimiter.join(decode(c) for c in split_chunks(text, actions))
  lines = shown.split('\n')
  return '\n'.join(lines[:max_lines] if max_lines else lines)


def preview(text: bytes, actions, width: int = 110) -> str:
  """One line: the first `width` bytes rendered with '|' at chunk ends and newlines shown as '⏎'."""
  return render(text[:width], actions[:width], terminal=True).replace('\n', '⏎')


@functools.lru_cache(maxsize=16)
def _boundary_fn(model, mode: str):
  """The jitted boundary draw of a model (cached, so repeated calls reuse one compilation)."""
  return jax.jit(lambda p, t, k: model.apply({'params': p}, t, k, mode=mode)['boundaries'])


def window_overlap(config) -> int:
  """Bytes of left context each window of `segment_text` re-reads: the receptive field of the encoder
  (which alone feeds the boundary decisions), capped at half a window for full-attention encoders.
  """
  m, seq_len = config.model, config.data.seq_len
  field = m.encoder_layers * (m.byte_window - 1) if m.byte_window > 0 else seq_len
  return max(0, min(field, (seq_len - 2) // 2))


def segment_text(
    model,
    params,
    text: bytes,
    seq_len: int,
    key,
    mode: str = 'greedy',
    overlap: int = 0,
    batch_size: int = 16,
):
  """Boundaries of a text of any length: (actions float32[n], probs float32[n]) for its n bytes.

  The text is cut into windows of seq_len tokens: [BOS] + `overlap` bytes already decided (context
  only) + new bytes. Only the new bytes' decisions are kept, and the window's last position is never
  kept either (the convention forces a boundary there): it is decided again, with context, by the next
  window. With overlap >= the encoder's receptive field (`window_overlap`), every kept decision of an
  independent (w = 1) policy equals the one it would make in one long sequence, so windows leave no
  seams; the first window starts the text after BOS, as a document starts in training. A sequential
  (w > 1) policy restarts its history at each window, which can change the first few decisions after
  the overlap. Sampled batches of windows use the keys fold_in(key, batch index). The text's last byte is not
  forced to be a boundary.
  """
  n = len(text)
  if n == 0:
    return np.zeros(0, np.float32), np.zeros(0, np.float32)
  step = seq_len - 2 - overlap
  if step < 1:
    raise ValueError(f'overlap {overlap} leaves no new bytes in a window of {seq_len}')
  starts = list(range(0, n, step))  # Window k decides text[starts[k]:starts[k] + step].
  windows, keep = [], []
  for s in starts:
    ctx = min(overlap, s)
    windows.append(encode_window(text[s - ctx : s + step + 1], seq_len)[0])
    keep.append((1 + ctx, min(step, n - s)))
  fn = _boundary_fn(model, mode)
  actions, probs = np.zeros(n, np.float32), np.zeros(n, np.float32)
  for b in range(0, len(windows), batch_size):
    tokens = np.stack(windows[b : b + batch_size])
    pad = batch_size - len(tokens)  # Fixed batch shape: one compilation.
    tokens = np.pad(tokens, ((0, pad), (0, 0)), constant_values=PAD_ID)
    out = fn(params, jnp.asarray(tokens), jax.random.fold_in(key, b // batch_size))
    acts, ps = np.asarray(out.actions), np.asarray(out.probs)
    for i in range(len(tokens) - pad):
      first, count = keep[b + i]
      s = starts[b + i]
      actions[s : s + count] = acts[i, first : first + count]
      probs[s : s + count] = ps[i, first : first + count]
  return actions, probs


def chunk_offsets(actions) -> list[tuple[int, int]]:
  """[(start, end)] byte offsets (end exclusive) of the chunks `split_chunks` cuts: they tile the text."""
  ends = [i + 1 for i, a in enumerate(actions) if a > 0.5]
  if not ends or ends[-1] != len(actions):
    ends.append(len(actions))
  return [(s, e) for s, e in zip([0] + ends[:-1], ends) if e > s]
