"""H-Net dynamic chunking (Hwang, Wang, Gu 2025) as a boundary method.

  p_t = (1 - cos(W_q h_t, W_k h_{t-1})) / 2,   p_0 = 1,   boundary where p_t >= 0.5,
with W_q, W_k identity-initialised. In tokjax's convention a_t = 1 closes the chunk at byte t, so a
large change between h_{t-1} and h_t ends a chunk at t (the decision uses bytes <= t only: causal).
The router learns from the LM loss through two paths, both added by the hierarchical model:
  * the straight-through factor on the chosen probability, c_t = p_t if a_t else 1 - p_t, multiplying
    the upsampled chunk output at byte t (forward value 1): `Boundaries.chunk_gate`;
  * EMA smoothing of chunk outputs, zbar_j = P_j z_j + (1 - P_j) zbar_{j-1}, P_j = p at chunk j's last
    byte: `Boundaries.chunk_ema` (see chunking.ema_chunks).
Rate control is H-Net's ratio loss with N = 1 / target_rate,
  L_ratio = N / (N - 1) * ((N - 1) F G + (1 - F)(1 - G)),
F the fraction of (hard) boundaries, G the mean p, over the non-forced valid positions; it enters the
total loss with weight `ratio_weight` (0.03) through `Boundaries.aux_loss`.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from tokjax.models import boundaries as bd
from tokjax.models import registry
from tokjax.models.rivals import common


def _identity(key, shape, dtype=jnp.float32):
  del key
  return jnp.eye(shape[0], shape[1], dtype=dtype)


def ratio_loss(actions, probs, mask, target_rate: float):
  """H-Net's load-balancing loss; actions, probs, mask: [B, L] -> scalar (minimal at F = G = r*)."""
  n = 1.0 / target_rate
  count = jnp.maximum(jnp.sum(mask), 1.0)
  f = jax.lax.stop_gradient(jnp.sum(actions * mask) / count)
  g = jnp.sum(probs * mask) / count
  return n / (n - 1.0) * ((n - 1.0) * f * g + (1.0 - f) * (1.0 - g))


class HNetRouter(nn.Module):
  """Encoder states h: float[B, L, D] -> `Boundaries` (same call signature as BoundaryPolicy)."""

  target_rate: float = 0.2
  capacity: int = 64
  ratio_weight: float = 0.03

  @nn.compact
  def __call__(
      self, h, key, mode: str = 'sample', actions=None, tokens=None, early_logits=None, **unused
  ):
    """mode 'sample' and 'greedy' are the same deterministic rule; 'given' evaluates `actions`."""
    del key, early_logits, unused
    d = h.shape[-1]
    init = nn.with_logical_partitioning(_identity, ('embed', None))
    h32 = h.astype(jnp.float32)
    q = nn.Dense(d, use_bias=False, kernel_init=init, name='q', dtype=jnp.float32)(h32)
    k = nn.Dense(d, use_bias=False, kernel_init=init, name='k', dtype=jnp.float32)(h32)
    k_prev = jnp.pad(k, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    cos = jnp.sum(q * k_prev, -1) * jax.lax.rsqrt(
        jnp.sum(q * q, -1) * jnp.sum(k_prev * k_prev, -1) + 1e-8
    )
    p = jnp.clip((1.0 - cos) / 2.0, 0.0, 1.0)
    p = p.at[:, 0].set(1.0)
    sampled = actions if mode == 'given' else (p >= 0.5).astype(jnp.float32)
    out = common.finish(
        sampled,
        self.capacity,
        probs=p,
        logits=jnp.log(jnp.clip(p, 1e-6, 1.0)) - jnp.log(jnp.clip(1.0 - p, 1e-6, 1.0)),
    )
    mask = common.valid_mask(tokens, p.shape) * (~bd.forced_mask(p.shape))
    loss = ratio_loss(out.actions, p, mask, self.target_rate)
    return dataclasses.replace(
        out,
        aux_loss=self.ratio_weight * loss,
        chunk_gate=common.ste_gate(out.actions, p),
        chunk_ema=p,
        stats={'ratio_loss': loss},
    )


registry.register(
    registry.BoundaryMethod(
        name='hnet',
        build=lambda st, c: HNetRouter(
            target_rate=st.target_rate,
            capacity=st.capacity,
            ratio_weight=st.settings.ratio_weight,
        ),
        defaults=dict(ratio_weight=0.03),  # Weight of H-Net's ratio loss in the total loss.
        inner_stages=True,
        description='H-Net dynamic chunking: cosine routing, straight-through, ratio loss',
    )
)
