"""Dynamic token pooling (Nawrot et al. 2023) as a boundary method.

A two-layer MLP on the encoder state gives a logit per byte; training draws a relaxed Bernoulli
(Gumbel-sigmoid) s_t = sigmoid((logit_t + log u - log(1 - u)) / tau), u ~ U(0, 1), and the hard boundary
is s_t > 0.5 (greedy: sigmoid(logit_t / tau) > 0.5). tokjax's select-downsample has no soft pooling
matrix for the hard decision to pass a straight-through gradient into, so the gradient uses the same
straight-through factor as H-Net on the chosen relaxed value (c_t = s_t if a_t else 1 - s_t, forward 1)
on the upsampled chunk output. Rate control is the binomial prior: -log Binomial(k; n, r*) / n of the
boundary count k over a row's n valid non-forced bytes, averaged over rows, weight `prior_weight`. As in
Nawrot et al.'s code, k counts the straight-through boundaries (forward: the hard count; gradient: through
the relaxed s_t). A prior on the purely soft count would settle the hard rate below r*, because
E[s_t] > P(s_t > 0.5) for a Gumbel-sigmoid at small probabilities.
Decisions at t use h_t only: causal.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from tokjax.errors import UserError
from tokjax.models import boundaries as bd
from tokjax.models import registry
from tokjax.models.rivals import common


def binomial_prior_loss(soft, mask, target_rate: float):
  """Mean over rows of -log Binomial(k; n, r*) / n, k = sum(soft * mask), n = sum(mask) per row.

  soft: float32[B, L] boundary indicators (continuous values allowed), mask: float32[B, L] -> scalar.
  """
  k = jnp.sum(soft * mask, axis=-1)
  n = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
  k = jnp.clip(k, 0.0, n)
  log_pmf = (
      jax.scipy.special.gammaln(n + 1)
      - jax.scipy.special.gammaln(k + 1)
      - jax.scipy.special.gammaln(n - k + 1)
      + k * jnp.log(target_rate)
      + (n - k) * jnp.log1p(-target_rate)
  )
  return jnp.mean(-log_pmf / n)


class GumbelPooling(nn.Module):
  """Encoder states h: float[B, L, D] -> `Boundaries` (same call signature as BoundaryPolicy)."""

  target_rate: float = 0.2
  capacity: int = 64
  temperature: float = 1.0
  prior_weight: float = 1.0

  @nn.compact
  def __call__(
      self, h, key, mode: str = 'sample', actions=None, tokens=None, early_logits=None, **unused
  ):
    del early_logits, unused
    d = h.shape[-1]
    x = nn.Dense(
        d,
        name='mlp_in',
        dtype=jnp.float32,
        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp')),
    )(h.astype(jnp.float32))
    bias = jnp.log(self.target_rate / (1.0 - self.target_rate))
    logits = nn.Dense(
        1,
        name='mlp_out',
        dtype=jnp.float32,
        kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ('mlp', None)),
        bias_init=nn.initializers.constant(bias),
    )(jax.nn.gelu(x))[..., 0]
    if mode == 'sample':
      u = jax.random.uniform(key, logits.shape, minval=1e-6, maxval=1.0 - 1e-6)
      soft = jax.nn.sigmoid((logits + jnp.log(u) - jnp.log1p(-u)) / self.temperature)
    else:
      soft = jax.nn.sigmoid(logits / self.temperature)
    sampled = actions if mode == 'given' else (soft > 0.5).astype(jnp.float32)
    out = common.finish(sampled, self.capacity, probs=jax.nn.sigmoid(logits), logits=logits)
    mask = common.valid_mask(tokens, logits.shape) * (~bd.forced_mask(logits.shape))
    hard_ste = sampled + soft - jax.lax.stop_gradient(soft)
    prior = binomial_prior_loss(hard_ste, mask, self.target_rate)
    return dataclasses.replace(
        out,
        aux_loss=self.prior_weight * prior,
        chunk_gate=common.ste_gate(out.actions, soft),
        stats={'prior_loss': prior},
    )


def _validate(stage):
  g = stage.settings
  if not g.temperature > 0:
    raise UserError(
        f'{stage.where("settings.temperature")}={g.temperature} must be positive (1.0 is usual).'
    )
  if not g.prior_weight >= 0:
    raise UserError(f'{stage.where("settings.prior_weight")}={g.prior_weight} must be >= 0.')


registry.register(
    registry.BoundaryMethod(
        name='gumbel',
        build=lambda st, c: GumbelPooling(
            target_rate=st.target_rate,
            capacity=st.capacity,
            temperature=st.settings.temperature,
            prior_weight=st.settings.prior_weight,
        ),
        defaults=dict(
            temperature=1.0,  # Gumbel-sigmoid temperature tau.
            prior_weight=1.0,  # Weight of the binomial rate prior.
        ),
        sampling=True,
        inner_stages=True,
        description='dynamic token pooling: Gumbel-sigmoid, straight-through, binomial prior',
        validate=_validate,
    )
)
