"""The score-function estimator: returns, advantages, signs, and unbiasedness against enumeration."""

from conftest import hierarchical_model, jit_call
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tokjax import estimator, losses
from tokjax.config import defaults as config_defaults
from tokjax.lab import estimators as lab
from tokjax.models import boundaries as bd


@pytest.mark.parametrize('gamma', [0.0, 0.5, 0.9, 0.99, 1.0])
def test_discounted_returns_equal_a_direct_loop(gamma):
  a = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (3, 17)))
  expected = np.zeros_like(a)
  for b in range(a.shape[0]):
    g = 0.0
    for t in reversed(range(a.shape[1])):
      g = a[b, t] + gamma * g
      expected[b, t] = g
  np.testing.assert_allclose(
      estimator.discounted_returns(jnp.asarray(a), gamma), expected, rtol=1e-5, atol=1e-5
  )


def test_batch_relative_advantage_is_a_masked_per_position_mean():
  r = jnp.array([[1.0, 2.0, 3.0], [3.0, 6.0, 100.0], [5.0, 1.0, 7.0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0], [1, 0, 1]], jnp.float32)
  adv = estimator.batch_relative_advantages(r * mask, mask)
  np.testing.assert_allclose(adv, [[-2, -2, -2], [0, 2, 0], [2, 0, 2]], atol=1e-6)


def test_rewards_are_detached_and_early_exit_relative():
  ce_full, ce_early = jnp.array([[1.0, 2.0]]), jnp.array([[1.5, 1.0]])
  np.testing.assert_allclose(estimator.rewards(ce_full, ce_early, 'early_exit'), [[0.5, -1.0]])
  np.testing.assert_allclose(estimator.rewards(ce_full, ce_early, 'plain'), [[-1.0, -2.0]])
  assert jax.grad(lambda c: estimator.rewards(c, ce_early, 'early_exit').sum())(ce_full).sum() == 0


def test_policy_loss_raises_log_prob_of_actions_followed_by_high_returns():
  """One gradient step on the loss makes an action with positive return more likely."""
  returns = jnp.array([[2.0, -2.0]])
  free = jnp.array([[True, True]])
  grad = jax.grad(lambda lp: estimator.policy_loss(lp, returns, free))(jnp.zeros((1, 2)))
  assert grad[0, 0] < 0 < grad[0, 1]  # Descent raises log pi(a_0), lowers log pi(a_1).


def test_rate_loss_pushes_the_rate_toward_the_target():
  mask = jnp.ones((1, 4))
  for bias, sign in (
      (2.0, 1.0),
      (-4.0, -1.0),
  ):  # Rate above target -> positive grad -> lower logits.
    g = jax.grad(lambda z: estimator.rate_loss(z, jax.nn.sigmoid(z), mask, 0.2))(
        jnp.full((1, 4), bias)
    )
    assert np.all(np.sign(g) == sign)


def _tiny_model(window):
  policy = bd.BoundaryPolicy(target_rate=0.3, window=window, scale=1.0, capacity=8)
  return hierarchical_model(policy, d_model=16, capacity=8, window=4)


def _setup(window, n_rows):
  model = _tiny_model(window)
  tokens1 = jax.random.randint(jax.random.PRNGKey(11), (1, 8), 0, 256)
  targets1 = jax.random.randint(jax.random.PRNGKey(12), (1, 8), 0, 256)
  params = nn.unbox(jit_call(model.init, jax.random.PRNGKey(13), tokens1, jax.random.PRNGKey(0)))[
      'params'
  ]
  # Spread the policy's probabilities so the gradient is far from zero.
  params['boundary']['proj']['kernel'] = params['boundary']['proj']['kernel'] * 60.0
  tile = lambda x, n: jnp.tile(x, (n, 1))
  return model, params, tokens1, targets1, tile


def _per_row_ce(model, params, tokens, targets, key, mode, actions=None):
  out = jit_call(model.apply, {'params': params}, tokens, key, mode=mode, actions=actions)
  return losses.cross_entropy(out.logits, targets), out.boundaries


@pytest.mark.parametrize('window', [1, 3])
def test_score_function_gradient_is_unbiased_against_exact_enumeration(window):
  """gamma = 1, plain rewards: the Monte Carlo mean of the gradient of `score_function_terms`'s loss
  (the function training calls, at training's default lambda_rl) equals lambda_rl times the exact
  gradient of E_a[sum_t CE(t)] / L computed over all 2^6 boundary vectors of n = 8 positions. The
  rate loss is off here: its gradient is no expectation over draws (the next test checks it).

  The rewards are centred by a per-position constant (fixed before sampling, so still unbiased): with
  raw CE of ~5.5 nats per byte the noise would bury the signal at any affordable sample size.

  The exact gradient is many standard errors away from zero, so an estimator that lost its gradient
  or its sign would fail the same comparison: the test has the power to catch a broken estimator.
  (Subtler biases, like dropping the future from the return, need far more samples than a unit test.)
  """
  n_samples = 30000
  model, params, tokens1, targets1, tile = _setup(window, n_samples)
  cfg = config_defaults.base_config().estimator
  cfg.update(reward='plain', baseline='none', gamma=1.0, rate_loss=False)
  assert cfg.lambda_rl == 0.01  # Training's scale, not 1.
  l = tokens1.shape[1]

  # Exact: every free pattern (positions 1..6), forced ends.
  patterns = lab.all_patterns(l)
  n_pat = patterns.shape[0]
  ce_all, bnd_all = _per_row_ce(
      model, params, tile(tokens1, n_pat), tile(targets1, n_pat), None, 'given', patterns
  )
  f = jax.lax.stop_gradient(ce_all.sum(-1))  # Loss of each pattern: does not depend on the policy.
  log_pi_all = jnp.sum(jnp.where(bnd_all.free, bnd_all.log_probs, 0.0), axis=-1)
  assert abs(float(jnp.sum(jnp.exp(log_pi_all))) - 1.0) < 1e-4  # Enumeration covers everything.

  def expected_loss(p):
    _, bnd = _per_row_ce(
        model, p, tile(tokens1, n_pat), tile(targets1, n_pat), None, 'given', patterns
    )
    log_pi = jnp.sum(jnp.where(bnd.free, bnd.log_probs, 0.0), axis=-1)
    return jnp.sum(jnp.exp(log_pi) * f) / l

  exact = jax.tree.map(lambda g: cfg.lambda_rl * g, jax.grad(expected_loss)(params)['boundary'])

  tokens, targets = tile(tokens1, n_samples), tile(targets1, n_samples)
  key = jax.random.PRNGKey(42)
  _, bnd = _per_row_ce(model, params, tokens, targets, key, 'sample')
  actions = bnd.actions

  centre = jnp.mean(ce_all, axis=0)  # [L], a constant baseline.

  def row_loss(boundary_params, tok, tgt, act):
    p = dict(params, boundary=boundary_params)
    ce_s, b = _per_row_ce(model, p, tok[None], tgt[None], None, 'given', act[None])
    mask = jnp.ones_like(ce_s)
    return estimator.score_function_terms(ce_s - centre, jnp.zeros_like(ce_s), b, mask, cfg)[0]

  per_row_grads = jax.jit(jax.vmap(jax.grad(row_loss), in_axes=(None, 0, 0, 0)))

  # Every row has the same bytes, so a row's gradient depends on its actions only: compute it once
  # per distinct action vector (at most 2^6) and give each row the one of its own actions.
  distinct, row_of = np.unique(np.asarray(actions), axis=0, return_inverse=True)
  n_distinct = distinct.shape[0]
  grads = per_row_grads(
      params['boundary'],
      tile(tokens1, n_distinct),
      tile(targets1, n_distinct),
      jnp.asarray(distinct),
  )
  grads = jax.tree.map(lambda g: np.asarray(g)[row_of.reshape(-1)], grads)
  z_bias, z_signal = [], []
  for sample, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(exact)):
    sample, ref = np.asarray(sample).reshape(n_samples, -1), np.asarray(ref).reshape(-1)
    se = sample.std(0) / np.sqrt(n_samples) + 1e-9
    z_bias.append(np.abs(sample.mean(0) - ref) / se)
    z_signal.append(np.abs(ref) / se)
  assert np.max(np.concatenate(z_bias)) < 4.0, z_bias
  assert np.max(np.concatenate(z_signal)) > 8.0, z_signal


def test_score_function_terms_use_the_config_switches():
  """Switching off the batch-relative baseline or the rate loss, or changing gamma, the reward or
  lambda_rl, changes the loss; lambda_rl = 0 removes the policy gradient from the policy's logits,
  leaving exactly the rate loss's."""
  cfg = ml_collections.ConfigDict(
      dict(
          reward='early_exit',
          baseline='batch',
          gamma=0.99,
          lambda_rl=0.01,
          lambda_rate=0.01,
          rate_loss=True,
          target_rate=0.2,
      )
  )
  key = jax.random.PRNGKey(0)
  ce_full = jax.random.uniform(key, (4, 8)) * 3
  ce_early = ce_full + jax.random.normal(jax.random.PRNGKey(1), (4, 8))
  logits = jax.random.normal(jax.random.PRNGKey(2), (4, 8))
  actions = (jax.random.uniform(jax.random.PRNGKey(3), (4, 8)) < 0.3).astype(jnp.float32)
  actions, free, dropped = bd.enforce_convention(actions, 8)
  mask = jnp.ones((4, 8))

  def loss(z, c):
    """The loss as a function of the policy's logits z: float32[4, 8]."""
    bnd = bd.Boundaries(
        actions=actions,
        logits=z,
        probs=jax.nn.sigmoid(z),
        log_probs=bd.bernoulli_log_prob(z, actions),
        free=free,
        dropped=dropped,
    )
    return estimator.score_function_terms(ce_full, ce_early, bnd, mask, c)[0]

  def but(field, value):
    other = ml_collections.ConfigDict(cfg.to_dict())
    other[field] = value
    return other

  base = loss(logits, cfg)
  for field, value in (
      ('baseline', 'none'),
      ('rate_loss', False),
      ('gamma', 1.0),
      ('reward', 'plain'),
      ('lambda_rl', 0.0),
  ):
    assert not np.isclose(base, loss(logits, but(field, value))), field
  rate_only = jax.grad(
      lambda z: cfg.lambda_rate
      * estimator.rate_loss(z, jax.nn.sigmoid(z), free, cfg.target_rate, per=mask.size)
  )(logits)
  assert np.abs(rate_only).max() > 0
  np.testing.assert_allclose(jax.grad(loss)(logits, but('lambda_rl', 0.0)), rate_only, atol=1e-9)
  # With lambda_rl > 0 the policy gradient is there: the check above can fail.
  assert np.abs(jax.grad(loss)(logits, cfg) - rate_only).max() > 1e-4
