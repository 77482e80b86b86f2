"""The LM heads compute logits in float32 in a bfloat16 model, so the rewards CE_early - CE_full are
not differences of rounded logits.

The reference computes each head by hand in float32 (norm, then matmul) on the very hidden states the
bfloat16 model feeds it, taken with a flax method interceptor; everything below the heads is the
model's own bfloat16 computation in both runs. Run with `-s` to see the reward error it measures.
"""

import functools

from conftest import jit_call
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import losses, models, stages
from tokjax.config import defaults as config_defaults
from tokjax.models import layers


def _reference_head(next_fun, args, kwargs, context):
  """float32 logits of an LMHead from its own parameters; other modules run as they are."""
  if not (isinstance(context.module, layers.LMHead) and context.method_name == '__call__'):
    return next_fun(*args, **kwargs)
  p = context.module.variables['params']
  x = args[0].astype(jnp.float32)
  y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
  y = y * (1.0 + p['norm']['scale'])
  return jnp.einsum('bld,dv->blv', y, p['proj']['kernel'], precision='highest')


def _rewards(model, params, batch, key, reference):
  def run():
    out = jit_call(model.apply, {'params': params}, batch['inputs'], key, mode='greedy')
    early = losses.cross_entropy(out.early_logits, batch['targets'])
    full = losses.cross_entropy(out.logits, batch['targets'])
    return out, early - full

  if reference:
    with nn.intercept_methods(_reference_head):
      return run()
  return run()


B, L = 2, 64


@functools.lru_cache(maxsize=None)
def _compiled():
  """(params, jitted rewards of the model and of the reference), built once for every scale:
  the scale only changes parameter values, so both programs compile once for the file."""
  c = config_defaults.base_config()
  c.model.update(d_model=32, capacity=32, num_heads=2, main_layers=1, dtype='bfloat16')
  model = models.build_model(c, levels=stages.resolve(c))
  params = jax.jit(model.init)(jax.random.PRNGKey(0), *models.init_args(c, B, L))
  rewards = {
      reference: jax.jit(functools.partial(_rewards, model, reference=reference))
      for reference in (False, True)
  }
  return nn.unbox(params)['params'], rewards


@pytest.mark.parametrize('scale', [1.0, 4.0])
def test_bfloat16_model_rewards_match_float32_heads(scale):
  params, rewards = _compiled()
  b, l = B, L
  params = dict(params)
  # A trained model's logits reach |logit| 8-32; scaling the head kernels by 4 puts them there.
  for head in ('head', 'early_head'):
    proj = dict(params[head]['proj'], kernel=params[head]['proj']['kernel'] * scale)
    params[head] = dict(params[head], proj=proj)
  rng = np.random.default_rng(0)
  batch = {
      'inputs': jnp.asarray(rng.integers(0, 256, (b, l)), jnp.int32),
      'targets': jnp.asarray(rng.integers(0, 256, (b, l)), jnp.int32),
  }
  key = jax.random.PRNGKey(1)
  out, r = rewards[False](params, batch, key)
  ref_out, r_ref = rewards[True](params, batch, key)
  assert out.logits.dtype == jnp.float32
  # Same boundaries in both runs: the heads feed nothing below them.
  np.testing.assert_array_equal(out.boundaries.actions, ref_out.boundaries.actions)
  err = np.abs(np.asarray(r) - np.asarray(r_ref))
  max_logit = float(jnp.abs(ref_out.logits).max())
  print(
      f'head scale {scale}: max |logit| {max_logit:.1f}, reward error vs float32 heads: '
      f'max {err.max():.2e}, mean {err.mean():.2e}, reward std {float(np.std(r_ref)):.3f}'
  )
  # float32 heads agree with the reference to float32 rounding; bfloat16 heads were off by 1e-2 and
  # more (see the printed numbers).
  assert err.max() < 1e-4
