"""Gradient accumulation inside the jitted train step (config.optim.grad_accum_steps).

Where rows are independent the accumulated step is the plain step; with the score function it is,
as trainer_lib's docstring states, the mean of the plain objective's gradients over the strided
micro-batches, each with its own key and its own batch-relative baseline.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tokjax import estimator, losses, sharding
from tokjax import trainer as trainer_lib
from tokjax.config import defaults as config_defaults
from tokjax.errors import UserError


def _config(kind='hierarchical', method='policy', accum=1):
  c = config_defaults.base_config()
  # One layer per stack: accumulation is over rows, so depth adds compile time and nothing else.
  c.model.update(kind=kind, d_model=32, capacity=16, num_layers=1, main_layers=1, byte_window=8)
  c.data.update(seq_len=32, batch_size=8)
  c.boundary.method = method
  c.optim.grad_accum_steps = accum
  return c


def _batch(mesh, b=8, l=32):
  rng = np.random.default_rng(0)
  mask = np.ones((b, l), np.float32)
  return sharding.global_batch(
      {
          'inputs': rng.integers(0, 256, (b, l), dtype=np.int32),
          'targets': rng.integers(0, 256, (b, l), dtype=np.int32),
          'mask': mask,
      },
      mesh,
  )


def _step(config, batch=None):
  mesh = sharding.make_mesh(config.mesh)
  trainer = trainer_lib.Trainer(config, mesh)
  state = trainer.init(jax.random.PRNGKey(0))
  params0 = jax.device_get(state.params)
  batch = _batch(mesh) if batch is None else batch
  new_state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(1))
  metrics = jax.device_get(metrics)
  # Adam's first moment after one step: linear in the (clipped) gradient, so it compares gradients.
  metrics['mu'] = jax.device_get(optax.tree_utils.tree_get(new_state.opt_state, 'mu'))
  return trainer, params0, batch, jax.device_get(new_state.params), metrics


def _assert_close(a, b, rtol, atol=1e-9):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


@pytest.mark.parametrize('kind,method', [('flat', 'policy'), ('hierarchical', 'stride')])
def test_accumulated_step_equals_plain_step_when_rows_are_independent(kind, method):
  _, params0, _, plain, m_plain = _step(_config(kind, method, 1))
  _, _, _, accum, m_accum = _step(_config(kind, method, 4))
  np.testing.assert_allclose(m_accum['loss'], m_plain['loss'], rtol=1e-6)
  np.testing.assert_allclose(m_accum['grad_norm'], m_plain['grad_norm'], rtol=1e-6)
  # Gradients, through Adam's first moment, to 1e-5 of each tensor's largest entry (measured 4e-6).
  for a, p in zip(jax.tree.leaves(m_accum['mu']), jax.tree.leaves(m_plain['mu'])):
    np.testing.assert_allclose(a, p, rtol=0, atol=1e-5 * np.abs(p).max())
  # Parameters to 1e-6 relative, with a floor: Adam's first update lr * g / (|g| + 1e-8) turns the
  # round-off of a gradient entry that cancels to near 0 into up to lr = 2e-4 (tests/test_sharding.py
  # measures the same for another summation order); measured here: 2e-7 at most.
  _assert_close(accum, plain, rtol=1e-6, atol=1e-6)
  delta = lambda new: jax.tree.map(lambda n, o: n - o, new, params0)
  assert max(float(np.abs(x).max()) for x in jax.tree.leaves(delta(plain))) > 1e-4


def test_score_function_accumulation_is_the_mean_over_micro_batches_with_their_own_baselines():
  config = _config(accum=2)
  trainer, params0, batch, accum, metrics = _step(config)
  objective = losses.objective(config, trainer.model, 'sample', levels=trainer.levels)
  grad_fn = jax.jit(jax.value_and_grad(objective, has_aux=True))
  key = jax.random.fold_in(jax.random.PRNGKey(1), 0)  # The step folds in its step number (0).
  host = jax.device_get(batch)
  micro_losses, grads = [], []
  for i in range(2):
    micro = {k: v[i::2] for k, v in host.items()}  # Strided rows i, i + 2, ...
    (loss, (m, _)), g = grad_fn(params0, micro, jax.random.fold_in(key, i), jnp.asarray(0))
    micro_losses.append(loss)
    grads.append(g)
    # The batch-relative baseline is the micro-batch's own: advantages centred per micro-batch.
    assert float(m['advantage_var']) > 0
  np.testing.assert_allclose(metrics['loss'], np.mean(micro_losses), rtol=1e-6)

  @jax.jit  # One program: eagerly, every leaf's every optimizer operation compiles on its own.
  def mean_update(params, grads):
    mean_grads = jax.tree.map(lambda a, b: (a + b) / 2, *grads)
    updates, _ = trainer.tx.update(mean_grads, trainer.tx.init(params), params)
    return optax.apply_updates(params, updates)

  _assert_close(accum, mean_update(params0, grads), rtol=1e-5)
  # Not the plain step: the per-micro-batch keys and baselines change the update.
  _, _, _, plain, _ = _step(_config(accum=1), batch)
  assert not np.allclose(accum['boundary']['proj']['kernel'], plain['boundary']['proj']['kernel'])


def test_accumulation_steps_must_divide_the_batch():
  mesh = sharding.make_mesh(_config().mesh)
  for accum, match in [(3, 'does not divide'), (0, 'positive integer'), (16, 'does not divide')]:
    with pytest.raises(UserError, match=match):
      trainer_lib.Trainer(_config(accum=accum), mesh)


def test_micro_batches_of_one_row_are_rejected_under_the_batch_relative_baseline():
  mesh = sharding.make_mesh(_config().mesh)
  with pytest.raises(UserError, match='micro-batches of one row'):
    trainer_lib.Trainer(_config(accum=8), mesh)
  # Without a batch-relative baseline, or without a score-function method, one row is a valid batch.
  for config in (_config(accum=8), _config(method='stride', accum=8)):
    if config.boundary.method == 'policy':
      config.estimator.baseline = 'none'
    trainer_lib.Trainer(config, mesh)


def _two_stage(method0, baseline, stage_baseline, accum):
  config = _config(method=method0, accum=accum)
  config.model.stages = 2
  config.stages.s1.boundary.update(method='policy', target_rate=0.4)
  config.stages.s1.model.update(capacity=8, encoder_layers=1, decoder_layers=1, byte_window=0)
  config.stages.s1.estimator.baseline = stage_baseline
  config.estimator.baseline = baseline
  return config


def test_one_row_guard_reads_the_baseline_each_stage_uses():
  mesh = sharding.make_mesh(_config().mesh)
  # Stage 1 overrides the shared 'none' with 'batch': its advantages would all be 0.
  with pytest.raises(
      UserError, match=r"stage 1's policy .*--config.stages.s1.estimator.baseline=none"
  ):
    trainer_lib.Trainer(_two_stage('policy', 'none', 'batch', accum=8), mesh)
  # estimator.baseline='batch' reaches no stage: stage 0's rule has no score function and stage 1
  # overrides it, so one row per micro-batch is a valid batch.
  trainer_lib.Trainer(_two_stage('stride', 'batch', 'none', accum=8), mesh)
  # Two rows per micro-batch are always valid.
  trainer_lib.Trainer(_two_stage('policy', 'none', 'batch', accum=4), mesh)


@pytest.mark.parametrize('m', [1, 2, 4])
def test_batch_relative_advantage_is_the_leave_one_out_advantage_scaled_by_one_minus_one_over_m(m):
  # The scale trainer_lib's docstring states: over m rows, r - mean = (1 - 1/m) (r - others' mean).
  r = jax.random.normal(jax.random.PRNGKey(m), (m, 16))
  adv = estimator.batch_relative_advantages(r, jnp.ones_like(r))
  others = (jnp.sum(r, 0, keepdims=True) - r) / max(m - 1, 1)
  np.testing.assert_allclose(adv, (1 - 1 / m) * (r - others), rtol=1e-5, atol=1e-6)
  if m == 1:
    assert float(jnp.abs(adv).max()) == 0.0
