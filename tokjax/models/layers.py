"""Transformer building blocks shared by every tokjax model (Gemma-2 style).

A block is RMSNorm before *and* after each sublayer, rotary position embeddings (RoPE) at explicit
positions, and a GeGLU MLP. Attention is causal; with `window > 0` it is sliding-window causal and, for
sequences longer than the window, computed block-locally at O(L x window) cost instead of O(L^2).

Every parameter carries logical axis names (`embed`, `heads`, `kv`, `mlp`, `vocab`), which
`tokjax.sharding` maps onto mesh axes; on one device they are inert.

Shape names: B batch, L sequence length, D model width, H heads, K head width, F MLP width, W window.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any

_NEG_INF = -1e9  # Finite, so fully masked rows (padding) give a uniform softmax, not NaNs.


def _init(scale: float, axes: tuple[str, ...]):
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=scale), axes)


class RMSNorm(nn.Module):
  """RMSNorm with a zero-initialised (1 + scale) gain, as in Gemma."""

  eps: float = 1e-6
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = self.param(
        'scale',
        nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
        (x.shape[-1],),
        jnp.float32,
    )
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * (1.0 + scale)).astype(self.dtype)


def apply_rope(x, positions, max_wavelength: float = 10_000.0):
  """Rotates x: [B, L, H, K] by angles set by integer positions: [B, L] (which need not be 0..L-1)."""
  half = x.shape[-1] // 2
  freq = max_wavelength ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions[..., None, None].astype(jnp.float32) * freq  # [B, L, 1, K/2]
  sin, cos = jnp.sin(angle), jnp.cos(angle)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _softmax_attend(q, k, v, mask):
  """q: [..., Q, H, K], k/v: [..., S, H, K], mask: bool[..., Q, S] -> [..., Q, H, K]."""
  scores = jnp.einsum('...qhk,...shk->...hqs', q, k).astype(jnp.float32) / jnp.sqrt(q.shape[-1])
  scores = jnp.where(mask[..., None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('...hqs,...shk->...qhk', probs, v)


def full_causal_attention(q, k, v, q_pos, k_pos, key_valid=None, window: int = 0):
  """Dense causal attention over explicit positions (byte positions of chunks, for instance).

  q: [B, Q, H, K], k/v: [B, S, H, K], q_pos: [B, Q], k_pos: [B, S], key_valid: bool[B, S] or None.
  A query attends to keys with k_pos <= q_pos (and q_pos - k_pos < window when window > 0).
  """
  mask = k_pos[:, None, :] <= q_pos[:, :, None]
  if window > 0:
    mask &= (q_pos[:, :, None] - k_pos[:, None, :]) < window
  if key_valid is not None:
    mask &= key_valid[:, None, :]
  return _softmax_attend(q, k, v, mask)


def local_causal_attention(q, k, v, window: int):
  """Sliding-window causal attention at O(L x window): each block of W queries sees its own block and
  the previous one, masked to the last W positions. q/k/v: [B, L, H, K] at positions 0..L-1."""
  b, l, h, d = q.shape
  pad = (-l) % window
  if pad:  # Padding goes at the end, so it is never attended by real (earlier) queries.
    q, k, v = (jnp.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0))) for t in (q, k, v))
  n = (l + pad) // window
  blocks = lambda t: t.reshape(b, n, window, h, d)
  qb, kb, vb = blocks(q), blocks(k), blocks(v)
  prev = lambda t: jnp.pad(t, ((0, 0), (1, 0), (0, 0), (0, 0), (0, 0)))[:, :-1]
  k2 = jnp.concatenate([prev(kb), kb], axis=2)  # [B, n, 2W, H, K]
  v2 = jnp.concatenate([prev(vb), vb], axis=2)
  qi = jnp.arange(window)[:, None] + window  # Query offsets in the 2W-long key frame.
  ki = jnp.arange(2 * window)[None, :]
  mask = (ki <= qi) & (qi - ki < window)
  first = mask & (ki >= window)  # Block 0 has no previous block.
  mask = jnp.where((jnp.arange(n) == 0)[:, None, None], first, mask)  # [n, W, 2W]
  out = _softmax_attend(qb, k2, v2, jnp.broadcast_to(mask, (b, n, window, 2 * window)))
  return out.reshape(b, n * window, h, d)[:, :l]


class Attention(nn.Module):
  """Multi-head causal self-attention with RoPE; sliding-window when `window > 0`."""

  num_heads: int
  window: int = 0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, positions, key_valid=None):
    """x: [B, L, D], positions: int[B, L], key_valid: bool[B, L] or None -> [B, L, D]."""
    d = x.shape[-1]
    head_dim = d // self.num_heads
    proj = lambda name: nn.DenseGeneral(
        (self.num_heads, head_dim),
        use_bias=False,
        dtype=self.dtype,
        name=name,
        kernel_init=_init(d**-0.5, ('embed', 'heads', 'kv')),
    )(x)
    q, k, v = proj('query'), proj('key'), proj('value')
    q, k = apply_rope(q, positions), apply_rope(k, positions)
    # Byte layers run at positions 0..L-1 with no padding inside a row, which block-local attention
    # relies on; anything else (chunks, short sequences) takes the dense path.
    if self.window > 0 and key_valid is None and x.shape[1] > 2 * self.window:
      out = local_causal_attention(q, k, v, self.window)
    else:
      out = full_causal_attention(q, k, v, positions, positions, key_valid, self.window)
    return nn.DenseGeneral(
        d,
        axis=(-2, -1),
        use_bias=False,
        dtype=self.dtype,
        name='out',
        kernel_init=_init(d**-0.5, ('heads', 'kv', 'embed')),
    )(out)


class GeGLU(nn.Module):
  """Gated MLP: down(gelu(gate(x)) * up(x)), hidden width F."""

  hidden: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    dense = lambda n, name, axes, fan_in: nn.Dense(
        n, use_bias=False, dtype=self.dtype, name=name, kernel_init=_init(fan_in**-0.5, axes)
    )
    gate = dense(self.hidden, 'gate', ('embed', 'mlp'), d)(x)
    up = dense(self.hidden, 'up', ('embed', 'mlp'), d)(x)
    h = nn.with_logical_constraint(nn.gelu(gate) * up, ('batch', 'length', 'mlp'))
    return dense(d, 'down', ('mlp', 'embed'), self.hidden)(h)


class Block(nn.Module):
  """Gemma-2 block: x + post_norm(attn(pre_norm(x))), then x + post_norm(mlp(pre_norm(x)))."""

  num_heads: int
  mlp_hidden: int
  window: int = 0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, positions, key_valid=None):
    h = Attention(self.num_heads, self.window, self.dtype, name='attn')(
        RMSNorm(dtype=self.dtype, name='pre_attn_norm')(x), positions, key_valid
    )
    x = x + RMSNorm(dtype=self.dtype, name='post_attn_norm')(h)
    h = GeGLU(self.mlp_hidden, self.dtype, name='mlp')(
        RMSNorm(dtype=self.dtype, name='pre_mlp_norm')(x)
    )
    x = x + RMSNorm(dtype=self.dtype, name='post_mlp_norm')(h)
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))


class Stack(nn.Module):
  """`num_layers` blocks in sequence."""

  num_layers: int
  num_heads: int
  mlp_hidden: int
  window: int = 0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, positions, key_valid=None):
    for i in range(self.num_layers):
      x = Block(self.num_heads, self.mlp_hidden, self.window, self.dtype, name=f'block_{i}')(
          x, positions, key_valid
      )
    return x


class Embed(nn.Module):
  """Byte (+ special) embedding: ids int[B, L] -> [B, L, D]."""

  vocab_size: int
  d_model: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, ids):
    table = self.param(
        'embedding', _init(1.0, ('vocab', 'embed')), (self.vocab_size, self.d_model), jnp.float32
    )
    # Without the constraint the gathered rows inherit the table's fsdp split of `embed`, and XLA
    # rematerialises the whole activation to reshard it for the first block.
    return nn.with_logical_constraint(
        jnp.take(table, ids, axis=0).astype(self.dtype), ('batch', 'length', 'embed')
    )


class LMHead(nn.Module):
  """Final RMSNorm and an untied projection to next-byte logits: [B, L, D] -> float32[B, L, V]."""

  vocab_size: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = RMSNorm(dtype=self.dtype, name='norm')(x)
    logits = nn.Dense(
        self.vocab_size,
        use_bias=False,
        dtype=self.dtype,
        name='proj',
        kernel_init=_init(x.shape[-1] ** -0.5, ('embed', 'vocab')),
    )(x)
    return logits.astype(jnp.float32)
