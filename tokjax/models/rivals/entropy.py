"""Entropy spikes (as in the Byte Latent Transformer) as a boundary method.

H_t is the entropy (nats, detached) of the early-exit head's next-byte distribution at t. A chunk ends at
t when H_t > theta: the next byte is hard to predict, so a new chunk starts there (BLT's global
threshold rule). Causality: H_t depends on bytes <= t, and theta is a single learned scalar, NOT a
per-batch quantile (a quantile over the batch would let future bytes of the same row move the decision
at t). Rate control: theta = THRESHOLD_SCALE * raw is a trainable scalar driven by the proportional
controller  aux = CONTROL_WEIGHT * raw * stopgrad(fraction(H <= theta) - (1 - r*)),  so the optimizer
raises theta while too many bytes spike and lowers it otherwise; the fixed point is the (1 - r*) quantile
of H over training batches. The tiny weight keeps it out of the gradient-norm clip, and Adam's
normalisation still moves theta about lr * THRESHOLD_SCALE nats per step.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from tokjax.models import boundaries as bd
from tokjax.models import registry
from tokjax.models.rivals import common
from tokjax.vocab import VOCAB_SIZE

THRESHOLD_SCALE = 30.0
# Nats. Above the largest possible entropy, ln 258 (uniform over the vocabulary): an untrained early
# head is near uniform, so a lower start ends a chunk at almost every byte (rate 1, the buffer full)
# until the controller catches up; from here the rate starts at 0 and rises as theta comes down to the
# (1 - r*) quantile (a trained byte model's typical entropy is 1-3 nats).
INIT_THRESHOLD = math.log(VOCAB_SIZE) + 0.01
CONTROL_WEIGHT = 0.01


def next_byte_entropy(early_logits):
  """float[B, L, V] -> detached entropy in nats float32[B, L]."""
  logp = jax.nn.log_softmax(jax.lax.stop_gradient(early_logits).astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


class EntropySpikes(nn.Module):
  """Early-exit logits float[B, L, V] -> `Boundaries` (same call signature as BoundaryPolicy)."""

  target_rate: float = 0.2
  capacity: int = 64

  @nn.compact
  def __call__(
      self, h, key, mode: str = 'sample', actions=None, tokens=None, early_logits=None, **unused
  ):
    """'sample' and 'greedy' are the same deterministic rule; 'given' evaluates `actions`."""
    del key, unused
    if early_logits is None:
      raise ValueError('the entropy method needs early_logits (the early-exit head)')
    raw = self.param(
        'threshold', nn.initializers.constant(INIT_THRESHOLD / THRESHOLD_SCALE), (), jnp.float32
    )
    theta = THRESHOLD_SCALE * raw
    ent = next_byte_entropy(early_logits)
    spikes = (ent > jax.lax.stop_gradient(theta)).astype(jnp.float32)
    sampled = actions if mode == 'given' else spikes
    out = common.finish(sampled, self.capacity, probs=spikes, logits=ent - theta)
    mask = common.valid_mask(tokens, ent.shape) * (~bd.forced_mask(ent.shape))
    below = jnp.sum((1.0 - spikes) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    aux = CONTROL_WEIGHT * raw * jax.lax.stop_gradient(below - (1.0 - self.target_rate))
    return dataclasses.replace(out, aux_loss=aux, stats={'entropy_threshold': theta})


registry.register(
    registry.BoundaryMethod(
        name='entropy',
        build=lambda st, c: EntropySpikes(target_rate=st.target_rate, capacity=st.capacity),
        description='entropy spikes (BLT) of the early-exit head, learned threshold',
    )
)
