"""Pieces shared by the rival boundary methods: valid-position masks and the `Boundaries` of a rule.

Every rival returns executed actions that obey `boundaries.enforce_convention` (forced first and last
boundary, capacity rule). None of them has score-function decisions, so `free` is all False and
`log_probs` are zeros, and their registry entries have score_function=False (no policy gradient).
"""

import jax
import jax.numpy as jnp

from tokjax.models import boundaries as bd
from tokjax.vocab import PAD_ID


def valid_mask(tokens, shape):
  """float32[B, L]: 1 at real (non-PAD) positions; all ones when tokens is None."""
  if tokens is None:
    return jnp.ones(shape, jnp.float32)
  return (tokens != PAD_ID).astype(jnp.float32)


def ste_gate(executed, probs):
  """H-Net's straight-through factor: c = p where a boundary was taken, else 1 - p; forward value 1.

  executed, probs: float32[B, L] -> float32[B, L] equal to 1 whose gradient is d c.
  """
  c = jnp.where(executed > 0.5, probs, 1.0 - probs)
  return c + jax.lax.stop_gradient(1.0 - c)


def finish(sampled, capacity: int, probs=None, logits=None, **fields) -> bd.Boundaries:
  """Boundaries of raw decisions sampled: {0,1}[B, L] under the convention (no policy decisions)."""
  executed, _, dropped = bd.enforce_convention(jax.lax.stop_gradient(sampled), capacity)
  zeros = jnp.zeros(executed.shape, jnp.float32)
  probs = executed if probs is None else probs
  logits = zeros if logits is None else logits
  return bd.Boundaries(
      actions=executed,
      logits=logits,
      probs=probs,
      log_probs=zeros,
      free=jnp.zeros(executed.shape, bool),
      dropped=dropped,
      **fields
  )
