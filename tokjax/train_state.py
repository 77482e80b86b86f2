"""The training state (step, parameters, optimizer state), the optimizer, and the jitted train and eval
steps, sharded over the device mesh with `jax.jit(in_shardings=, out_shardings=)`.
"""

import functools

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from tokjax import models, sharding


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
  return optax.chain(
      optax.clip_by_global_norm(o.grad_clip),
      optax.adamw(
          learning_rate_schedule(o, config.train.steps),
          b1=o.b1,
          b2=o.b2,
          weight_decay=o.weight_decay,
          mask=decay_mask,
      ),
  )


class Trainer:
  """Holds the model, optimizer, mesh and the compiled steps for one config."""

  def __init__(self, config, mesh):
    self.config, self.mesh = config, mesh
    self.model = models.build_model(config)
    self.tx = make_optimizer(config)
    b, l = config.data.batch_size, config.data.seq_len
    self._init_args = models.init_args(config, b, l)
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
    train_objective = models.objective(config, self.model, 'sample')
    self._train_step = jax.jit(
        functools.partial(_train_step, train_objective, self.tx),
        in_shardings=(self.state_sharding, data_sharding, replicated),
        out_shardings=(self.state_sharding, replicated),
        donate_argnums=(0,),
    )
    self._eval_steps = {
        mode: jax.jit(
            functools.partial(_eval_step, models.objective(config, self.model, mode)),
            in_shardings=(self.state_sharding.params, data_sharding, replicated),
            out_shardings=replicated,
        )
        for mode in (('sample', 'greedy') if config.model.kind == 'hierarchical' else ('sample',))
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


def _train_step(objective, tx, state, batch, key):
  key = jax.random.fold_in(key, state.step)
  grad_fn = jax.value_and_grad(objective, has_aux=True)
  (loss, (metrics, _)), grads = grad_fn(state.params, batch, key, state.step)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics['grad_norm'] = optax.global_norm(grads)
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
