"""Select-downsampling of bytes into chunks and distribute-add upsampling back (static shapes).

Both follow the boundary convention of `tokjax.models.boundaries` (a_t = 1: byte t ends its chunk).
Causality: byte t only ever receives the output of chunks that end at or before t, so no byte sees a
chunk that summarises bytes after it. The classic off-by-one (upsampling the chunk that *contains* t
instead of the latest *complete* one) would leak the future; tests/test_models.py guards it.
"""

import jax
import jax.numpy as jnp

from tokjax.models import boundaries as bd


def downsample(x, actions, capacity: int):
  """Gathers the state at each chunk's last byte into a fixed-size buffer.

  x: [B, L, D], actions: {0,1}[B, L] (at most `capacity` boundaries per row) ->
    chunks: [B, C, D], ends: int32[B, C] (byte position of each chunk's last byte, used as its RoPE
    position), valid: bool[B, C]. Slots past a row's last chunk are zeros, marked invalid, and get
    position L so that no valid chunk attends to them.
  """
  b, l = actions.shape
  is_end = actions > 0.5
  slot = jnp.where(is_end, bd.chunk_index(actions), capacity)  # Slot C is out of range: dropped.
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, l))
  ends = (
      jnp.full((b, capacity), l, jnp.int32)
      .at[rows, slot]
      .set(jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l)), mode='drop')
  )
  valid = ends < l
  chunks = jnp.take_along_axis(x, jnp.minimum(ends, l - 1)[..., None], axis=1)
  return chunks * valid[..., None].astype(x.dtype), ends, valid


def upsample(x, chunk_out, actions, gate=None):
  """Distribute-add: y_t = x_t + gate_t * Y[j(t)], Y[j(t)] the latest chunk ending at or before t.

  x: [B, L, D], chunk_out: [B, C, D], actions: {0,1}[B, L], gate: optional [B, L] -> [B, L, D].
  """
  j = jnp.clip(bd.chunk_index(actions), 0, chunk_out.shape[1] - 1)
  y = jnp.take_along_axis(chunk_out, j[..., None], axis=1)
  if gate is not None:
    y = y * gate[..., None].astype(y.dtype)
  return x + y


def ema_chunks(chunk_out, probs, ends):
  """H-Net smoothing: zbar_j = P_j z_j + (1 - P_j) zbar_{j-1}, P_j = probs at chunk j's last byte.

  chunk_out: [B, C, D], probs: float32[B, L], ends: int32[B, C] (L for empty slots, which take P = 1 and
  are never read by valid bytes) -> [B, C, D]. Causal: zbar_j mixes only chunks ending at or before
  chunk j's end. Gradient reaches `probs`, which is how H-Net's router learns from the LM loss.
  """
  l = probs.shape[1]
  p = jnp.take_along_axis(probs, jnp.minimum(ends, l - 1), axis=1)
  p = jnp.where(ends < l, p, 1.0)[..., None].astype(chunk_out.dtype)  # [B, C, 1]

  def combine(left, right):  # Linear recurrence z -> a z + b composed associatively.
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2

  _, smoothed = jax.lax.associative_scan(combine, (1.0 - p, p * chunk_out), axis=1)
  return smoothed
