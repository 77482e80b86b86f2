"""Showing a learned tokenization: run a model's boundary method on text and mark each chunk end."""

import jax
import jax.numpy as jnp
import numpy as np

from tokjax.data import BOS_ID, PAD_ID


def encode_window(text: bytes, seq_len: int) -> np.ndarray:
  """BOS + the first seq_len - 1 bytes of text, padded with PAD: int32[1, seq_len]."""
  ids = [BOS_ID] + list(text[:seq_len - 1])
  return np.asarray([ids + [PAD_ID] * (seq_len - len(ids))], np.int32)


def boundaries_for(model, params, text: bytes, seq_len: int, key, mode: str = 'greedy'):
  """-> (bytes shown, executed boundaries float[n], boundary probabilities float[n]) for text's
  first seq_len - 1 bytes (the BOS position is dropped)."""
  tokens = encode_window(text, seq_len)
  out = jax.jit(lambda p, t, k: model.apply({'params': p}, t, k, mode=mode)['boundaries'])(
      params, jnp.asarray(tokens), key)
  n = min(len(text), seq_len - 1)
  # The last real byte is forced to be a boundary only when it is the last position of the window.
  return text[:n], np.asarray(out.actions[0, 1:n + 1]), np.asarray(out.probs[0, 1:n + 1])


def split_chunks(text: bytes, actions) -> list[bytes]:
  """Cuts text after every byte whose action is 1; the pieces concatenate back to text."""
  chunks, start = [], 0
  for i, a in enumerate(actions[:len(text)]):
    if a > 0.5:
      chunks.append(text[start:i + 1])
      start = i + 1
  if start < len(text):
    chunks.append(text[start:])
  return chunks


def render(text: bytes, actions, delimiter: str = '|', max_lines: int | None = None) -> str:
  """Text with `delimiter` after each chunk's last byte (newline chunks keep the line layout)."""
  shown = delimiter.join(c.decode('utf-8', errors='replace') for c in split_chunks(text, actions))
  lines = shown.split('\n')
  return '\n'.join(lines[:max_lines] if max_lines else lines)
