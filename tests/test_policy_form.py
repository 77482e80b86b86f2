"""config.boundary.policy.form: the logit's parametrisation, apart from the window.

'auto' is what the policy always computed (plain for w = 1, scaled and softcapped for w > 1);
'plain' and 'scaled' hold the parametrisation fixed while the window changes, so that an ablation of
the window changes the window only.
"""

from conftest import jit_call, tiny_config
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import decoding, models, stages
from tokjax.config import saved
from tokjax.config import validation as config_validation
from tokjax.errors import UserError
from tokjax.models import boundaries as bd

B, L, D = 4, 48, 16


def _h(seed=0):
  return jax.random.normal(jax.random.PRNGKey(seed), (B, L, D))


def _policy(window, form, capacity=L, rate=0.2):
  return bd.BoundaryPolicy(target_rate=rate, window=window, capacity=capacity, form=form)


def _init(policy, h, spread=50.0):
  """Params with the projection `spread` times its init (an untrained policy's logits hardly move
  from the bias, so every decision would look alike)."""
  params = nn.unbox(jit_call(policy.init, jax.random.PRNGKey(1), h, jax.random.PRNGKey(2)))
  params['params']['proj']['kernel'] = params['params']['proj']['kernel'] * spread
  return params


def _apply(policy, params, h, mode='sample', actions=None, key=3):
  return jit_call(policy.apply, params, h, jax.random.PRNGKey(key), mode=mode, actions=actions)


def _todays_logits(params, h, executed, window):
  """The logit as the policy computed it before the form existed (written out independently):
  v + b for w = 1; 6 tanh((v[w-1] + history) / 16 + b) / 6) for w > 1."""
  v = h @ params['params']['proj']['kernel']
  b = params['params']['bias']
  if window == 1:
    return v[..., 0] + b
  hist = sum(
      v[..., window - 1 - k] * jnp.pad(executed, ((0, 0), (k, 0)))[:, :L] for k in range(1, window)
  )
  z = (v[..., window - 1] + hist) / 16.0 + b
  return 6.0 * jnp.tanh(z / 6.0)


@pytest.mark.parametrize('window', [1, 8])
def test_auto_is_the_policy_as_it_was(window):
  """'auto' starts from the bias it always had and computes the same logits, to the bit; naming the
  form 'auto' stands for (plain at w = 1, scaled at w = 8) gives the same draws and logits."""
  h = _h()
  auto = _policy(window, 'auto')
  params = _init(auto, h)
  logit = np.log(0.2 / 0.8).astype(np.float32)
  expected_bias = logit if window == 1 else 6.0 * np.arctanh(logit / 6.0)
  np.testing.assert_allclose(params['params']['bias'], expected_bias, rtol=1e-6)
  out = _apply(auto, params, h)
  np.testing.assert_array_equal(
      out.logits, jax.jit(_todays_logits, static_argnums=3)(params, h, out.actions, window)
  )
  named = _apply(_policy(window, 'plain' if window == 1 else 'scaled'), params, h)
  for field in ('actions', 'logits', 'log_probs'):
    np.testing.assert_array_equal(getattr(out, field), getattr(named, field), err_msg=field)
  assert 0.05 < float(out.actions[:, 1:-1].mean()) < 0.6  # The draws are not all alike.


def test_plain_window_8_without_history_weights_is_the_window_1_policy():
  """w = 8 in the plain form with the 7 history columns of its projection at 0 is w = 1's policy:
  the same initial bias, logits and greedy boundaries (the sequential sampler against the parallel
  one), so a w8 ablation in this form changes what the policy can read, nothing else."""
  h = _h(4)
  one, eight = _policy(1, 'auto'), _policy(8, 'plain', capacity=12)
  p1 = _init(one, h)
  p8 = _init(eight, h)
  np.testing.assert_array_equal(p8['params']['bias'], p1['params']['bias'])
  kernel = (
      jnp.zeros_like(p8['params']['proj']['kernel'])
      .at[:, 7]
      .set(p1['params']['proj']['kernel'][:, 0])
  )
  p8['params']['proj']['kernel'] = kernel
  one = one.clone(capacity=12)  # A small buffer: both drop the same boundaries once it is full.
  g1, g8 = _apply(one, p1, h, 'greedy'), _apply(eight, p8, h, 'greedy')
  np.testing.assert_array_equal(g8.actions, g1.actions)
  assert float(g1.dropped.sum()) > 0 and 0 < float(g1.actions[:, 1:-1].mean()) < 1
  np.testing.assert_allclose(g8.logits, g1.logits, atol=1e-5)
  # With the history weights back, the same form reads the history: the logits move.
  p8['params']['proj']['kernel'] = kernel.at[:, :7].set(1.0)
  moved = _apply(eight, p8, h, 'given', actions=g1.actions)
  assert float(jnp.max(jnp.abs(moved.logits - g1.logits))) > 1.0


def test_scaled_window_1_is_the_sequential_parametrisation_without_history():
  """w = 1 in the scaled form: logit 6 tanh((v / 16 + b) / 6), starting exactly at the target
  rate."""
  h = _h(5)
  policy = _policy(1, 'scaled')
  params = _init(policy, h)
  out = _apply(policy, params, h)
  v = h @ params['params']['proj']['kernel']
  z = v[..., 0] / 16.0 + params['params']['bias']
  np.testing.assert_allclose(out.logits, 6.0 * jnp.tanh(z / 6.0), atol=1e-6)
  params['params']['proj']['kernel'] = jnp.zeros_like(params['params']['proj']['kernel'])
  np.testing.assert_allclose(jax.nn.sigmoid(_apply(policy, params, h).logits), 0.2, atol=1e-6)


def test_plain_sequential_draws_are_what_given_mode_scores():
  """The lax.scan sampler in the plain form: its executed actions fed back in 'given' mode give its
  logits and log-probabilities, and it draws with the probability it reports (E[a_t - p_t] = 0 at
  each free position; a sampler reading the history one step off fails it)."""
  h = _h(6)
  policy = _policy(8, 'plain', capacity=14, rate=0.4)
  params = _init(policy, h, spread=20.0)
  sampled = _apply(policy, params, h)
  given = _apply(policy, params, h, 'given', actions=sampled.actions)
  np.testing.assert_array_equal(sampled.actions, given.actions)
  np.testing.assert_allclose(sampled.log_probs, given.log_probs, atol=1e-6)
  assert float(sampled.actions.sum(-1).max()) <= 14

  w, n, l = 4, 4000, 12
  v = jnp.broadcast_to(jax.random.normal(jax.random.PRNGKey(9), (1, l, w)) * 1.5, (n, l, w))
  u = jax.random.uniform(jax.random.PRNGKey(10), (n, l))
  bias, cap = -0.5, 100
  executed, free, _ = bd.enforce_convention(
      bd.sample_sequential(v, bias, u, 1.0 / 16, cap, scaled=False), cap
  )

  def max_z(history_shift):
    hist = jnp.pad(executed, ((0, 0), (history_shift, 0)))[:, :l]
    x = v[..., w - 1] + bd._history_term(v, hist, w)  # pylint: disable=protected-access
    p = jax.nn.sigmoid(x + bias)
    resid = jnp.where(free, executed - p, 0.0)
    se = jnp.sqrt(jnp.sum(jnp.where(free, p * (1 - p), 0.0), 0)) + 1e-9
    return float(jnp.max(jnp.abs(jnp.sum(resid, 0)) / se))

  assert max_z(0) < 4.5
  assert max_z(1) > 6.0


def test_generation_reads_the_form_through_the_policy_module():
  """decoding.policy_logit (one position of cached generation) gives the plain form's logit."""
  policy = _policy(3, 'plain')
  h = _h(7)[:, :1, :]
  params = _init(policy, jnp.broadcast_to(h, (B, L, D)))
  history = jnp.array([[0.0, 1.0, 1.0]] * B)  # a_{t-3}, a_{t-2}, a_{t-1}.
  got = jax.jit(decoding.policy_logit, static_argnums=0)(policy, params['params'], h[:, 0], history)
  v = h[:, 0] @ params['params']['proj']['kernel']
  np.testing.assert_allclose(got, v[:, 2] + v[:, 1] + v[:, 0] + params['params']['bias'], atol=1e-5)


def test_the_config_field_builds_the_form_and_rejects_others_in_one_line():
  c = tiny_config('')
  assert c.boundary.policy.form == 'auto'
  c.boundary.policy.form = 'scaled'
  assert models.build_model(c, levels=stages.resolve(c)).levels[0].boundary.form == 'scaled'
  old = c.to_dict()
  del old['boundary']['policy']['form']  # A config saved before the field: today's policy.
  new = saved.upgrade(old)
  assert models.build_model(new, levels=stages.resolve(new)).levels[0].boundary.form == 'auto'
  c = tiny_config('')
  c.boundary.policy.form = 'softcap'
  with pytest.raises(UserError, match=r"^config.boundary.policy.form='softcap' must be one of"):
    config_validation.validate(c)
