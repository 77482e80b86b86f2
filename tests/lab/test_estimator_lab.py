"""The estimator lab: its statistics, and bias against exact enumeration on the tiny model for plain
REINFORCE, the Gumbel straight-through estimator, RLOO and the value baseline (GAE(1, 1))."""

from conftest import jit_call
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tokjax import estimator, stages
from tokjax.lab import estimators as lab


def test_summarize_recovers_the_variance_bias_and_cosine_of_a_known_gaussian():
  """N(mu, diag(s^2)) in 5 dimensions: tr(Cov) = sum s^2; an offset reference has bias |offset|."""
  rng = np.random.default_rng(0)
  mu, s = np.array([1.0, -2.0, 0.5, 0.0, 3.0]), np.array([0.5, 1.0, 2.0, 0.1, 1.5])
  x = mu + s * rng.standard_normal((20000, 5))
  stats = lab.summarize(x, mu)
  assert stats['variance'] == pytest.approx(np.sum(s**2), rel=0.03)
  assert stats['bias'] < 0.05 and stats['cos_mean_ref'] > 0.999
  offset = np.array([0.0, 0.0, 0.3, 0.4, 0.0])  # |offset| = 0.5
  biased = lab.summarize(x, mu + offset)
  assert biased['bias'] == pytest.approx(0.5, abs=0.05)
  assert biased['bias_chi'] > 100
  # cos(single, mean): E[x . mu] / (|x| |mu|) for the known Gaussian, by an independent sample.
  y = mu + s * rng.standard_normal((200000, 5))
  expected_cos = np.mean(y @ mu / (np.linalg.norm(y, axis=1) * np.linalg.norm(mu)))
  assert stats['cos_single_mean'] == pytest.approx(expected_cos, abs=0.01)


@pytest.fixture(scope='module')
def tiny():
  return lab.tiny_setups(seed=0, batch=8)


@pytest.fixture(scope='module')
def measured(tiny):
  variants = [
      lab.Variant('plain', 'plain', 'none', 1.0),
      lab.Variant('early', 'early_exit', 'none', 1.0),
      lab.Variant('batch', 'plain', 'batch', 1.0),
      lab.Variant('rloo', 'plain', 'rloo', 1.0, rloo_k=4),
      lab.Variant('value', 'plain', 'value', 1.0, 1.0),
      lab.Variant('value_gae', 'plain', 'value', 0.9, 0.5),
  ]
  result = lab.run_lab(
      tiny['policy'],
      jax.random.PRNGKey(1),
      6000,
      variants,
      ste_setups={'gumbel': tiny['gumbel']},
      ste_samples=200,
      log=lambda *_: None,
  )
  return {r['name']: r for r in result['rows']}


def test_enumeration_covers_every_boundary_pattern(tiny):
  for setup in (tiny['policy'], tiny['gumbel']):
    _, log_p = lab._enumerated(setup, setup.boundary_params, pathwise=False)
    np.testing.assert_allclose(np.exp(log_p).sum(1), 1.0, atol=1e-5)


def test_pattern_index_inverts_all_patterns():
  pats = lab.all_patterns(8)
  np.testing.assert_array_equal(lab.pattern_index(pats), np.arange(64))


@pytest.mark.parametrize('name', ['plain', 'early', 'rloo', 'value'])
def test_unbiased_estimators_match_exact_enumeration(measured, name):
  """gamma = 1 REINFORCE (with and without the early-exit shift), RLOO (K = 4) and the value baseline
  at gamma = lambda = 1: no coordinate of the mean is more than 4.5 standard errors from the exact
  gradient. Power: the same estimates put the mean close to g* relative to |g*| (so an estimator that
  lost its signal, its sign or its future terms would fail), except for plain REINFORCE, whose noise
  is the reason the paper needs variance reduction."""
  row = measured[name]
  assert row['max_z'] < 4.5, row
  if name != 'plain':
    noise = np.sqrt(row['variance'] / row['n'])
    assert noise < 0.2 * row['ref_norm'], row
    assert row['cos_mean_ref'] > 0.95, row


def test_discounted_gae_is_biased_and_gumbel_straight_through_is_far_off(measured):
  """Controls with power: GAE(0.9, 0.5) and the Gumbel straight-through estimator are biased, and the
  lab sees it (a lab that always reported zero bias would fail here)."""
  gae = measured['value_gae']
  assert gae['max_z'] > 6 and gae['bias_chi'] > 5, gae
  gum = measured['Gumbel straight-through (MLP params)']
  assert gum['rel_bias'] > 0.5 and gum['bias_chi'] > 20 and gum['cos_mean_ref'] < 0.7, gum


def test_rloo_cuts_variance_against_the_batch_baseline_at_equal_draws(measured):
  """A measured claim the lab makes: with K = 4 draws per sequence, RLOO's variance times its draws is
  below the batch-relative method's single-draw variance (averaging 4 of those would only divide by 4).
  """
  assert measured['rloo']['var_x_draws'] < measured['batch']['variance'], measured


def test_leave_one_out_and_gae_formulas():
  r = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 9.0], [7.0, 0.0]])  # K = 2 draws of B = 2 rows.
  mask = jnp.ones_like(r)
  np.testing.assert_allclose(
      estimator.leave_one_out_advantages(r, mask, 2), [[-4, -7], [-4, 4], [4, 7], [4, -4]]
  )
  values = jnp.array([[0.5, 1.0], [2.0, -1.0], [0.0, 0.0], [1.0, 1.0]])
  gae11 = estimator.gae_advantages(r, values, 1.0, 1.0, mask)
  np.testing.assert_allclose(gae11, estimator.discounted_returns(r, 1.0) - values, rtol=1e-6)
  gae0 = estimator.gae_advantages(r, values, 0.9, 0.0, mask)  # lambda = 0: one-step TD error.
  v_next = jnp.pad(values[:, 1:], ((0, 0), (0, 1)))
  np.testing.assert_allclose(gae0, r + 0.9 * v_next - values, rtol=1e-6)


def test_every_baseline_is_one_registry_entry_with_its_config_section():
  """The config's estimator sections come from the baseline declarations, and each baseline gives its
  own coefficients: 'none' is the raw discounted reward, 'batch' centres it, 'rloo' leaves one out.
  """
  from tokjax.config import defaults as config_defaults

  assert set(estimator.BASELINES) >= {'none', 'batch', 'rloo', 'value'}
  est = config_defaults.base_config().estimator
  for name, b in estimator.BASELINES.items():
    assert dict(est.get(name, {})) == b.defaults, name
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  r = jax.random.normal(keys[0], (4, 8))
  mask = jnp.ones((4, 8))
  cfg = ml_collections.ConfigDict(dict(est.to_dict(), gamma=0.9))
  g = {}
  for name in ('none', 'batch', 'rloo'):
    cfg.baseline = name
    cfg.rloo.k = 2
    g[name] = np.asarray(estimator.advantages_and_returns(r, mask, cfg)[1])
  np.testing.assert_allclose(g['none'], estimator.discounted_returns(r, 0.9), rtol=1e-6)
  np.testing.assert_allclose(
      g['batch'],
      estimator.discounted_returns(estimator.batch_relative_advantages(r, mask), 0.9),
      rtol=1e-6,
  )
  np.testing.assert_allclose(
      g['rloo'],
      estimator.discounted_returns(estimator.leave_one_out_advantages(r, mask, 2), 0.9),
      rtol=1e-6,
  )
  assert (
      estimator.BASELINES['rloo'].draws(cfg) == 2 and estimator.BASELINES['batch'].draws(cfg) == 1
  )
  assert [n for n, b in estimator.BASELINES.items() if b.critic] == ['value']


@pytest.mark.parametrize('baseline', ['rloo', 'value'])
def test_training_objective_with_the_new_baselines(baseline):
  """hierarchical_objective on a tiny config: RLOO returns CE for the B rows of the batch (K draws
  inside); the critic gets a gradient from its regression loss while the encoder gets none from it.
  """
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  from tokjax import losses, models  # pylint: disable=g-import-not-at-top
  from tokjax.config import defaults as config_defaults
  from tokjax.config import validation as config_validation

  c = config_defaults.base_config()
  c.model.update(d_model=16, num_heads=2, capacity=16)
  c.data.update(seq_len=16, batch_size=2)
  c.estimator.baseline = baseline
  c.estimator.rloo.k = 3
  config_validation.validate(c)
  model = models.build_model(c, levels=stages.resolve(c))
  params = nn.unbox(jit_call(model.init, jax.random.PRNGKey(0), *models.init_args(c, 2, 16)))[
      'params'
  ]
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 256)
  batch = {'inputs': tokens, 'targets': jnp.roll(tokens, -1, 1), 'mask': jnp.ones((2, 16))}
  levels = stages.resolve(c)
  obj = lambda p: losses.hierarchical_objective(
      model, p, batch, jax.random.PRNGKey(2), 0, cfg=c, levels=levels
  )
  (loss, (metrics, ce)), grads = jax.jit(jax.value_and_grad(obj, has_aux=True))(params)
  assert ce.shape == (2, 16) and np.isfinite(float(loss))
  if baseline == 'value':
    assert 'critic' in params and float(metrics['value_loss']) > 0
    assert float(jnp.abs(grads['critic']['out']['kernel']).sum()) > 0
    only_critic = lambda p: c.estimator.value.weight * estimator.value_loss(
        model.apply({'params': p}, tokens, jax.random.PRNGKey(2)).values,
        jnp.ones((2, 16)),
        jnp.ones((2, 16)),
    )
    g_enc = jax.jit(jax.grad(only_critic))(params)['encoder']
    assert all(float(jnp.abs(x).sum()) == 0 for x in jax.tree.leaves(g_enc))
  else:
    assert 'critic' not in params
    assert float(jnp.abs(grads['boundary']['proj']['kernel']).sum()) > 0


def test_learned_critic_variant_uses_the_models_critic_and_stays_unbiased(tiny):
  """The checkpoint lab's 'learned critic' rows: a critic that outputs 0 gives exactly the no-baseline
  estimates; a random critic of the encoder state changes every estimate yet leaves GAE(1, 1) unbiased
  against exact enumeration (it reads no action)."""
  base = tiny['policy']
  model = base.model.clone(value_head=True)
  init = nn.unbox(
      jit_call(model.init, jax.random.PRNGKey(3), base.tokens[:1], jax.random.PRNGKey(0))
  )['params']
  critic = jax.tree.map(lambda x: x, init['critic'])
  setup = lab.Setup(model, dict(base.params, critic=critic), base.tokens, base.targets, base.mask)
  assert (
      float(jnp.abs(lab.learned_values(setup, lab.encode(setup)[0])).max()) == 0.0
  )  # Zero-init out.
  learned = lab.Variant('learned', 'early_exit', 'value', 1.0, 1.0, critic='learned')
  none = lab.Variant('none', 'early_exit', 'none', 1.0)
  zero = {
      r['name']: r
      for r in lab.run_lab(setup, jax.random.PRNGKey(4), 64, [learned, none], log=lambda *_: None)[
          'rows'
      ]
  }
  assert zero['learned']['variance'] == pytest.approx(zero['none']['variance'], rel=1e-6)
  critic['out']['kernel'] = (
      jax.random.normal(jax.random.PRNGKey(5), critic['out']['kernel'].shape) * 3.0
  )
  setup = lab.Setup(model, dict(base.params, critic=critic), base.tokens, base.targets, base.mask)
  h = lab.encode(setup)[0]
  assert float(jnp.std(lab.learned_values(setup, h))) > 0.5
  rows = {
      r['name']: r
      for r in lab.run_lab(
          setup, jax.random.PRNGKey(4), 6000, [learned, none], log=lambda *_: None
      )['rows']
  }
  assert rows['learned']['variance'] != pytest.approx(rows['none']['variance'], rel=1e-3)
  assert rows['learned']['max_z'] < 4.5, rows['learned']


def test_learned_critic_variants_need_a_critic(tiny):
  from tokjax.errors import UserError  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError, match='baseline="value"'):
    lab.learned_values(tiny['policy'], lab.encode(tiny['policy'])[0])


def test_sampled_reference_agrees_with_enumeration_and_is_precise(tiny):
  """The reference of --config/--checkpoint runs: on the tiny model its distance to the exact gradient is
  what its own reported noise predicts, and that noise is far below |g*|^2 (the old no-baseline
  reference needed ~10x more draws for the same precision; a biased or mis-grouped reference fails).
  """
  setup = tiny['policy']
  h, ce_early = lab.encode(setup)
  exact = lab.flatten(lab.exact_gradient(setup))
  ref, noise, mean_ce = lab.sampled_reference(
      setup, h, ce_early, jax.random.PRNGKey(7), 4000, lab.ce_forward_fn(setup, chunk=500)
  )
  err = float(np.sum((ref - exact) ** 2))
  assert err < 6 * noise, (err, noise)
  assert noise < 0.005 * float(np.sum(exact**2)), noise
  table, log_p = lab._enumerated(setup, setup.boundary_params, pathwise=False)
  exact_mean_ce = jnp.sum(jnp.exp(log_p)[..., None] * table, 1)
  np.testing.assert_allclose(mean_ce, exact_mean_ce, atol=0.15)
