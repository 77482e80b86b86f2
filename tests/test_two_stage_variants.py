"""configs/two_stage.py's variants through the one trainer: each trains (finite loss, gradients only
where its methods have them) and each level executes the rule its method declares."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import sharding, stages
from tokjax import trainer as trainer_lib
from tokjax.config import files as config_files
from tokjax.config import validation as config_validation
from tokjax.models import hierarchical

VARIANTS = list(config_files.load_module('two_stage').VARIANTS)
TEXT = b'the king and queen of a far land went to see thy noble lord with all her men. ' * 4


def _trainer(variant):
  c = config_files.load('two_stage', f'{variant},tiny')
  c.mesh.data = 1
  config_validation.validate(c)
  return c, trainer_lib.Trainer(c, sharding.make_mesh(c.mesh, jax.devices()[:1]))


def _batch(c):
  b, l = c.data.batch_size, c.data.seq_len
  ids = np.frombuffer(TEXT, np.uint8).astype(np.int32)
  rows = np.stack([ids[i * 7 : i * 7 + l + 1] for i in range(b)])
  return dict(
      inputs=jnp.asarray(rows[:, :-1]),
      targets=jnp.asarray(rows[:, 1:]),
      mask=jnp.ones((b, l), jnp.float32),
  )


def test_every_variant_is_tested():
  # learned / learned trains in tests/test_multistage.py (resume, sharding); the rivals here.
  assert set(VARIANTS) == {'learned', 'hnet', 'whitespace', 'stride'}


@pytest.mark.parametrize('variant', ['hnet', 'whitespace', 'stride'])
def test_variant_trains_and_each_level_follows_its_method(variant):
  c, trainer = _trainer(variant)
  batch = _batch(c)
  state = trainer.init(jax.random.PRNGKey(0))
  if variant != 'stride':  # Fixed rules at both levels have no boundary parameters to train.
    before = jax.device_get(state.params)
    state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(1))
    assert np.isfinite(float(metrics['loss'])) and 'stage1_rate' in metrics
    learned = [st.method == 'policy' for st in stages.resolve(c)]
    assert ['policy_loss' in metrics, 'stage1_policy_loss' in metrics] == learned
    # Every boundary method with parameters (policy, H-Net's router) was updated, at both levels.
    after = jax.device_get(state.params)
    for name in ('boundary', 'inner_boundaries_0'):
      if c.boundary.method == 'whitespace' and name == 'boundary':
        continue
      moved = jax.tree.map(lambda x, y: float(np.abs(x - y).max()), after[name], before[name])
      assert jax.tree.leaves(moved) and all(v > 0 for v in jax.tree.leaves(moved)), (name, moved)

  apply = jax.jit(lambda p, t, key: trainer.model.apply({'params': p}, t, key))
  out = apply(state.params, batch['inputs'], jax.random.PRNGKey(2))
  levels = [np.asarray(a) for a in hierarchical.boundaries_in_bytes(out)]
  assert np.all(levels[1] <= levels[0])  # A stage-1 chunk ends where a stage-0 chunk ends.
  assert np.all(levels[1][:, -1] == 1)  # The last byte closes a chunk at every level.
  inner = out.stages[1]
  valid, acts = np.asarray(inner.valid), np.asarray(inner.boundaries.actions)
  if variant == 'stride':
    # Stage 0: every 5th byte; stage 1: every 3rd stage-0 chunk (forced first and last aside).
    assert np.array_equal(levels[0][0, 4:-1:5], np.ones_like(levels[0][0, 4:-1:5]))
    n = int(valid[0].sum())
    assert np.array_equal(acts[0, 2 : n - 1 : 3], np.ones_like(acts[0, 2 : n - 1 : 3]))
    assert acts[0, 1 : n - 1].sum() == len(range(2, n - 1, 3))
  if variant == 'whitespace':
    # Stage-0 chunks end at spaces (and at the forced first and last byte).
    tokens = np.asarray(batch['inputs'])
    ends = levels[0][:, 1:-1] > 0
    assert np.all(np.isin(tokens[:, 1:-1][ends], [32, 46]))


def test_leave_one_out_baseline_applies_at_every_stage():
  """estimator.baseline='rloo' draws K boundary sets per sequence at both levels; each stage's
  advantages are then leave-one-out over the K draws, so at every stage and byte they sum to zero
  over the draws (with the batch baseline they sum to zero over the batch instead)."""
  from tokjax import estimator, losses, models  # pylint: disable=g-import-not-at-top

  c = config_files.load('two_stage', 'learned,tiny')
  c.estimator.update(baseline='rloo', gamma=1.0)
  c.estimator.rloo.k = 2
  config_validation.validate(c)
  model, batch = models.build_model(c, levels=stages.resolve(c)), _batch(c)
  init = jax.jit(lambda t: model.init(jax.random.PRNGKey(0), t, jax.random.PRNGKey(1)))
  params = init(batch['inputs'])['params']
  k, b = 2, c.data.batch_size
  draw = jax.jit(lambda p, t, key: model.apply({'params': p}, t, key, k, method='sample_k'))
  out = draw(params, batch['inputs'], jax.random.PRNGKey(2))
  tile = lambda x: jnp.tile(x, (k, 1))
  targets, mask = tile(batch['targets']), tile(batch['mask'])
  ce_full = losses.cross_entropy(out.logits, targets) * mask
  # The two draws differ at both levels.
  levels = hierarchical.boundaries_in_bytes(out)
  assert all(not np.array_equal(x[:b], x[b:]) for x in map(np.asarray, levels))
  ce_early = losses.cross_entropy(out.stages[1].early_logits, targets) * mask
  r = estimator.rewards(ce_full, ce_early, c.estimator.reward) * mask
  adv, _, _, _ = estimator.advantages_and_returns(r, mask, c.estimator)
  np.testing.assert_allclose(np.asarray(adv[:b] + adv[b:]), 0.0, atol=1e-5)
  objective = jax.jit(losses.objective(c, model, levels=stages.resolve(c)))
  loss, (metrics, _) = objective(params, batch, jax.random.PRNGKey(2), 0)
  assert np.isfinite(float(loss)) and float(metrics['stage1_policy_loss']) != 0.0


@pytest.mark.parametrize('method', ['hnet', 'gumbel'])
def test_inner_straight_through_factor_follows_the_executed_action(method):
  """At an inner stage the last valid position is a forced boundary (`restrict_to_valid`), so the
  straight-through factor there is p (the executed action is 1), never 1 - p, whatever the method's
  rule drew: at every position the gate's value and gradient are `ste_gate(executed, p)`'s."""
  from tokjax import models  # pylint: disable=g-import-not-at-top
  from tokjax.models.rivals import common  # pylint: disable=g-import-not-at-top

  c = config_files.load('two_stage', 'hnet,tiny')
  c.stages.s1.boundary.method = method
  config_validation.validate(c)
  model, batch = models.build_model(c, levels=stages.resolve(c)), _batch(c)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), batch['inputs'], jax.random.PRNGKey(1))
  tokens = batch['inputs']

  def gates(p):
    # Greedy: Gumbel's relaxed value is sigmoid(logit / tau) = its probs at tau = 1.
    out = model.apply(p, tokens, jax.random.PRNGKey(2), mode='greedy')
    bnd = out.stages[1].boundaries
    return bnd.chunk_gate, common.ste_gate(jax.lax.stop_gradient(bnd.actions), bnd.probs)

  @jax.jit
  def measure(p):
    """Both gates, the inner boundaries and the gradients of a weighted sum of each gate."""
    out = model.apply(p, tokens, jax.random.PRNGKey(2), mode='greedy').stages[1]
    weights = jax.random.normal(jax.random.PRNGKey(3), out.valid.shape) * out.valid
    (got, want), pullback = jax.vjp(gates, p)
    zero = jnp.zeros_like(got)
    grads = (pullback((weights, zero))[0], pullback((zero, weights))[0])
    return got, want, out, grads

  got, want, out, (g_got, g_want) = measure(params)
  valid = np.asarray(out.valid)
  n = valid.sum(-1)
  probs = np.asarray(out.boundaries.probs)[np.arange(len(n)), n - 1]
  # The rule alone would not close the last valid position in some row (so the factor there matters).
  assert np.any((probs < 0.5) & (n < valid.shape[1])), probs
  np.testing.assert_allclose(got, want, atol=1e-6)
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(g_want))
  assert scale > 0
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5 * scale, rtol=1e-4), g_got, g_want
  )
