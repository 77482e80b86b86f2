"""The training state (step, parameters, optimizer state), the optimizer, and the jitted train and eval
steps, sharded over the device mesh with `jax.jit(in_shardings=, out_shardings=)`.

Gradient accumulation (config.optim.grad_accum_steps = n > 1) splits the global batch of B rows into
n micro-batches of B / n rows (micro-batch i holds rows i, i + n, i + 2n, ...: strided, so that each
one spreads over every data shard) and sums their gradients in a `lax.scan` inside the jitted step,
so activations are held for B / n rows at a time. The step then applies mean_i grad(loss_i), where
loss_i is the objective on micro-batch i with key fold_in(key, i). What couples rows of a batch is
therefore computed per micro-batch, and this is how the accumulated step differs from the plain one:
  - the score function's batch-relative baseline ('batch': estimator.baseline, or
    stages.sK.estimator.baseline for stage K) is the mean over the micro-batch's m = B / n rows, not over all B (and
    leave-one-out groups stay within a micro-batch). That mean includes the row's own reward, so
    the advantage is r - mean = (1 - 1/m) (r - mean of the other m - 1 rows) = (1 - n/B) x the
    micro-batch's leave-one-out advantage (the plain step's scale is 1 - 1/B); at B / n = 1 every
    advantage is 0, so `check_accumulation` rejects micro-batches of one row when any stage uses
    that baseline;
  - the rate loss's stop-gradient controller uses the micro-batch's mean boundary probability;
  - boundaries are drawn with a key per micro-batch, so the draws differ from the plain step's;
  - masked means are per micro-batch, then averaged with equal weights: equal to the global mean when
    every micro-batch holds the same number of valid targets (training batches are full rows).
A model whose rows are independent (the flat model; fixed-rule boundaries) gets the plain step's
loss and update up to float rounding (tests/test_accumulation.py checks both statements).
"""

import functools

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from tokjax import losses, models, sharding, stages
from tokjax.errors import UserError
from tokjax.models import hierarchical


@flax.struct.dataclass
class TrainState:
  """nonfinite counts steps whose loss or gradient was not finite: they leave params untouched, so a
  NaN never reaches a checkpoint; the loop stops with a message when the count grows."""

  step: jax.Array
  params: dict
  opt_state: optax.OptState
  nonfinite: jax.Array


def learning_rate_schedule(optim, total_steps: int):
  """Linear warmup from warmup_init_factor * lr to lr, then cosine to min_lr_factor * lr."""
  warmup = max(1, min(optim.warmup_steps, total_steps - 1))
  return optax.warmup_cosine_decay_schedule(
      init_value=optim.lr * optim.warmup_init_factor,
      peak_value=optim.lr,
      warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1),
      end_value=optim.lr * optim.min_lr_factor,
  )


def make_optimizer(config):
  o = config.optim
  # Decay matrices only: norms' gains and the policy's bias keep their meaning at zero decay.
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  steps = [
      optax.clip_by_global_norm(o.grad_clip),
      optax.adamw(
          learning_rate_schedule(o, config.train.steps),
          b1=o.b1,
          b2=o.b2,
          weight_decay=o.weight_decay,
          mask=decay_mask,
      ),
  ]
  if o.policy_lr_factor != 1.0:  # Only then: the optimizer state (and checkpoints) stay as before.
    steps.append(optax.masked(optax.scale(o.policy_lr_factor), _boundary_mask))
  return optax.chain(*steps)


def _boundary_mask(params):
  """True on the parameters of every stage's boundary method."""
  return {
      k: jax.tree.map(lambda _, b=hierarchical.is_boundary_module(k): b, v)
      for k, v in params.items()
  }


def validate(config) -> None:
  """Raises UserError naming the first bad field of config.train or config.optim (its
  grad_accum_steps is checked against the batch and the mesh by `check_accumulation`)."""
  for field in ('steps', 'log_every', 'eval_every', 'checkpoint_every'):
    if not config.train[field] > 0:
      raise UserError(f'config.train.{field}={config.train[field]!r} must be a positive number.')
  keep = config.train.keep_checkpoints
  if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
    # 0 would keep no checkpoint at all (nothing to resume or evaluate), and orbax rejects < 0.
    raise UserError(
        f'config.train.keep_checkpoints={keep!r} must be a whole number of at least 1 (the newest '
        'checkpoints kept in the workdir); e.g. --config.train.keep_checkpoints=2.'
    )
  for field in ('lr', 'policy_lr_factor'):
    if not config.optim[field] > 0:
      raise UserError(f'config.optim.{field}={config.optim[field]!r} must be positive.')


class Trainer:
  """Holds the model, optimizer, mesh and the compiled steps for one config.

  levels: config's levels as its entry point resolved them (`config.validation.validate` returns
  them); a caller that has none (a test, a lab script) leaves it None and the Trainer, an entry
  point itself, resolves them here. Everything it builds reads them from `Trainer.levels`.
  """

  def __init__(self, config, mesh, *, levels: stages.Levels | None = None):
    self.config, self.mesh = config, mesh
    self.levels = stages.resolve(config) if levels is None else levels
    self.model = models.build_model(config, levels=self.levels)
    self.tx = make_optimizer(config)
    b, l = config.data.batch_size, config.data.seq_len
    self.accum_steps = check_accumulation(config, mesh, levels=self.levels)
    self._init_args = self.model.init_args(b, l)
    with sharding.use(mesh, config.mesh):
      boxed = jax.eval_shape(self._boxed_state, jax.random.PRNGKey(0))
      self.state_sharding = sharding.tree_shardings(boxed, mesh, config.mesh)
    self.abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        nn.unbox(boxed),
        self.state_sharding,
    )
    self.num_params = sum(x.size for x in jax.tree.leaves(self.abstract_state.params))
    data_sharding = sharding.batch_sharding(mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    train_objective = losses.objective(config, self.model, 'sample', levels=self.levels)
    self._train_step = jax.jit(
        functools.partial(_train_step, train_objective, self.tx, self.accum_steps),
        in_shardings=(self.state_sharding, data_sharding, replicated),
        out_shardings=(self.state_sharding, replicated),
        donate_argnums=(0,),
    )
    self._eval_steps = {
        mode: jax.jit(
            functools.partial(
                _eval_step, losses.objective(config, self.model, mode, levels=self.levels)
            ),
            in_shardings=(self.state_sharding.params, data_sharding, replicated),
            out_shardings=replicated,
        )
        for mode in self.model.boundary_modes
    }
    self._init = jax.jit(self._init_state, out_shardings=self.state_sharding)

  def _boxed_state(self, key):
    params = self.model.init(key, *self._init_args)['params']
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=self.tx.init(params),
        nonfinite=jnp.zeros((), jnp.int32),
    )

  def _init_state(self, key):
    return nn.unbox(self._boxed_state(key))

  def init(self, key) -> TrainState:
    with sharding.use(self.mesh, self.config.mesh):
      return self._init(key)

  def train_step(self, state, batch, key):
    """-> (new state, metrics). `batch` must already be global arrays (see sharding.global_batch)."""
    with sharding.use(self.mesh, self.config.mesh):
      return self._train_step(state, batch, key)

  def eval_step(self, params, batch, key, mode='sample'):
    """-> {'ce_sum', 'bytes', boundary metrics...} for one batch with boundaries drawn by `mode`."""
    with sharding.use(self.mesh, self.config.mesh):
      return self._eval_steps[mode](params, batch, key)

  def lower_train_step(self, state, batch, key) -> jax.stages.Lowered:
    """The jitted train step lowered for this mesh (`.compile()` it) on state, batch and key: arrays
    or `jax.ShapeDtypeStruct`s (e.g. `abstract_state`), as `train_step` takes them."""
    with sharding.use(self.mesh, self.config.mesh):
      return self._train_step.lower(state, batch, key)

  def lower_eval_step(self, params, batch, key, mode='sample') -> jax.stages.Lowered:
    """The jitted eval step of boundary mode `mode` (one of the model's `boundary_modes`) lowered
    for this mesh; arguments as for `eval_step`, or `jax.ShapeDtypeStruct`s."""
    with sharding.use(self.mesh, self.config.mesh):
      return self._eval_steps[mode].lower(params, batch, key)


def check_accumulation(config, mesh, *, levels: stages.Levels) -> int:
  """config.optim.grad_accum_steps, checked against the batch, each stage's baseline (levels:
  config's) and the mesh before compiling."""
  n = config.optim.grad_accum_steps
  b = config.data.batch_size
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise UserError(f'config.optim.grad_accum_steps={n!r} must be a positive integer (1 = off).')
  if b % n:
    raise UserError(
        f'config.optim.grad_accum_steps={n} does not divide config.data.batch_size={b}; choose a '
        f'divisor of {b} (micro-batches hold batch_size / grad_accum_steps rows).'
    )
  zeroed = _batch_baseline_stages(config, levels) if b // n == 1 else ()
  if zeroed:
    st = zeroed[0]
    field = st.where('estimator.baseline')
    fix = 'none' if field != 'config.estimator.baseline' else 'rloo'
    raise UserError(
        f'micro-batches of one row (data.batch_size={b} / optim.grad_accum_steps={n}) make every '
        f"batch-relative advantage 0 ({field.removeprefix('config.')}='batch' subtracts the row's "
        f"own reward), so stage {st.level}'s policy gets no gradient; use at least 2 rows per "
        f'micro-batch or another baseline: --{field}={fix}.'
    )
  shards = mesh.shape['data'] * mesh.shape['fsdp']
  if (b // n) % shards:
    raise UserError(
        f'micro-batches of {b // n} rows (data.batch_size={b} / optim.grad_accum_steps={n}) '
        f'cannot be split over data*fsdp = {shards} devices; make batch_size / grad_accum_steps '
        f'a multiple of {shards}.'
    )
  return n


def _batch_baseline_stages(config, levels: stages.Levels) -> stages.Levels:
  """The stages of config's model trained by the score function with the batch-relative baseline
  (each its own `Stage.estimator.baseline`)."""
  return tuple(
      st
      for st in levels[: models.num_stages(config)]
      if models.trains_score_function(config, st) and st.estimator.baseline == 'batch'
  )


def micro_batches(batch, n: int):
  """[B, ...] leaves -> [n, B / n, ...]; micro-batch i holds rows i, i + n, i + 2n, ..."""
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1), batch)


def accumulated_grads(grad_fn, params, batch, key, step, n: int):
  """(mean loss, mean metrics, mean gradient) over n micro-batches (see the module docstring).

  grad_fn: value_and_grad of the objective (params, batch, key, step) with aux (metrics, ce).
  """

  def run(micro, i):
    micro = jax.tree.map(
        lambda x: nn.with_logical_constraint(x, ('batch',) + (None,) * (x.ndim - 1)), micro
    )
    (loss, (metrics, _)), grads = grad_fn(params, micro, jax.random.fold_in(key, i), step)
    return loss, metrics, grads

  micro = micro_batches(batch, n)
  first = jax.tree.map(lambda x: x[0], micro)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(run, first, 0))

  def body(total, inputs):
    return jax.tree.map(jnp.add, total, run(*inputs)), None

  total, _ = jax.lax.scan(body, zeros, (micro, jnp.arange(n)))
  return jax.tree.map(lambda x: x / n, total)


def _train_step(objective, tx, accum_steps, state, batch, key):
  key = jax.random.fold_in(key, state.step)
  grad_fn = jax.value_and_grad(objective, has_aux=True)
  if accum_steps == 1:
    (loss, (metrics, _)), grads = grad_fn(state.params, batch, key, state.step)
  else:
    loss, metrics, grads = accumulated_grads(
        grad_fn, state.params, batch, key, state.step, accum_steps
    )
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics['grad_norm'] = optax.tree.norm(grads)
  ok = jnp.isfinite(loss) & jnp.isfinite(metrics['grad_norm'])
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
  return (
      TrainState(
          step=state.step + 1,
          params=keep(params, state.params),
          opt_state=keep(opt_state, state.opt_state),
          nonfinite=state.nonfinite + (~ok).astype(jnp.int32),
      ),
      metrics,
  )


def _eval_step(objective, params, batch, key):
  _, (metrics, ce) = objective(params, batch, key, jnp.asarray(1 << 30))
  metrics = dict(metrics, ce_sum=jnp.sum(ce), bytes=jnp.sum(batch['mask']))
  return metrics
