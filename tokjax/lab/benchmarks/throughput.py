r"""Train-step throughput of the hierarchical model against the flat byte Transformer at equal size.

  python -m tokjax.lab.benchmarks.throughput [--config configs/default.py] [--seq_lens 512,2048]
      [--bytes_per_step 8192] [--models w1,w8,flat]

For each sequence length L (batch = bytes_per_step / L, bytes_per_step defaulting to
config.data.batch_size * config.data.seq_len, so every step sees the same bytes; 8192 gives the
(16, 512) and (4, 2048) shapes) it times the jitted train step of
  * the hierarchical model of the config with an independent (w = 1) and a sequential (w = 8) policy,
  * the flat model with full attention, its layer count chosen to match the hierarchical parameter
    count as closely as possible (both counts are printed),
and reports bytes/s, the share of the hierarchical step spent drawing boundaries (encoder + policy
sampling minus encoder alone, timed as separate jitted functions) and the loss of the first step
from the initial state (what an A/B of two commits compares besides the speed). Random bytes. The
speed depends on the data only through the chunk count: the main network runs on the part of its
buffer the chunks occupy (`layers.on_occupied_prefix`), and an untrained policy draws boundaries
at its target rate whatever the bytes. Numbers are medians over --steps timed steps after two
warm-up steps.
"""

import time

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from tokjax import cli, models, sharding, stages
from tokjax import trainer as trainer_lib

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CONFIG = config_flags.DEFINE_config_file(
      'config', 'configs/default.py', 'Config file (ml_collections).'
  )
  _SEQ_LENS = flags.DEFINE_list('seq_lens', ['512', '2048'], 'Sequence lengths to measure.')
  _STEPS = flags.DEFINE_integer('steps', 5, 'Timed steps per measurement.')
  _BYTES = flags.DEFINE_integer(
      'bytes_per_step', 0, 'Bytes per step (batch x L); 0 = config batch_size x seq_len.'
  )
  _MODELS = flags.DEFINE_list(
      'models', ['w1', 'w8', 'flat'], 'Which of w1, w8 (hierarchical policies), flat to time.'
  )


def median_seconds(fn, steps: int) -> float:
  """Median wall time of fn() (its outputs awaited) over `steps` calls, after two warm-up calls."""
  for _ in range(2):
    jax.block_until_ready(fn())
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def _variant(config, seq_len, batch, **model_fields):
  c = config.copy_and_resolve_references()
  c.data.update(seq_len=seq_len, batch_size=batch)
  c.model.capacity = max(c.model.capacity, int(0.5 * seq_len))
  for k, v in model_fields.items():
    if k == 'window':
      c.boundary.policy.window = v
    else:
      c.model[k] = v
  return c


def _time_train_step(config, steps):
  mesh = sharding.make_mesh(config.mesh)
  trainer = trainer_lib.Trainer(config, mesh)
  state = trainer.init(jax.random.PRNGKey(0))
  b, l = config.data.batch_size, config.data.seq_len
  rng = np.random.default_rng(0)
  batch = sharding.global_batch(
      {
          'inputs': rng.integers(0, 256, (b, l), dtype=np.int32),
          'targets': rng.integers(0, 256, (b, l), dtype=np.int32),
          'mask': np.ones((b, l), np.float32),
      },
      mesh,
  )
  holder = {'state': state}
  losses = []

  def step():
    holder['state'], metrics = trainer.train_step(holder['state'], batch, jax.random.PRNGKey(1))
    losses.append(metrics['loss'])
    return metrics['loss']

  seconds = median_seconds(step, steps)
  return seconds, float(losses[0]), trainer, holder['state'], batch


def _sampling_seconds(trainer, params, batch, steps):
  model, tokens, key = trainer.model, batch['inputs'], jax.random.PRNGKey(2)
  encode = jax.jit(lambda p, t: model.apply({'params': p}, t, method=lambda m, x: m.encode(x)[0]))
  draw = jax.jit(
      lambda p, t, k: model.apply(
          {'params': p}, t, k, method=lambda m, x, kk: m.boundary(m.encode(x)[0], kk).actions
      )
  )
  t_enc = median_seconds(lambda: encode(params, tokens), steps)
  t_draw = median_seconds(lambda: draw(params, tokens, key), steps)
  return max(t_draw - t_enc, 0.0)


def main(argv):
  del argv
  config = _CONFIG.value
  bytes_per_step = _BYTES.value or config.data.batch_size * config.data.seq_len
  steps = _STEPS.value
  chosen = set(_MODELS.value)
  print(
      f'{"L":>5} {"batch":>5} {"model":<26} {"params":>8} {"step ms":>9} {"bytes/s":>9} '
      f'{"sampling share":>15} {"first loss":>11}'
  )
  for seq_len in map(int, _SEQ_LENS.value):
    batch = max(1, bytes_per_step // seq_len)
    hier_params = None
    for window in (1, 8):
      if f'w{window}' not in chosen:
        continue
      c = _variant(config, seq_len, batch, kind='hierarchical', window=window)
      sec, loss, trainer, state, data = _time_train_step(c, steps)
      share = _sampling_seconds(trainer, state.params, data, steps) / sec
      hier_params = trainer.num_params
      print(
          f'{seq_len:>5} {batch:>5} {f"hierarchical w={window}":<26} '
          f'{trainer.num_params / 1e6:>7.2f}M {sec * 1e3:>9.1f} {batch * seq_len / sec:>9.0f} '
          f'{share:>14.1%} {loss:>11.6f}',
          flush=True,
      )
    if 'flat' not in chosen:
      continue
    if hier_params is None:  # Size the flat model against the hierarchical model of the config.
      c = _variant(config, seq_len, batch, kind='hierarchical', window=1)
      shapes = jax.eval_shape(
          models.build_model(c, levels=stages.resolve(c)).init,
          jax.random.PRNGKey(0),
          *models.init_args(c, 1, 8),
      )
      hier_params = sum(x.size for x in jax.tree.leaves(nn.unbox(shapes)))
    # The flat model with the layer count whose size is closest to the hierarchical model's.
    sizes = {}
    for n in range(1, 9):
      c = _variant(config, seq_len, batch, kind='flat', num_layers=n, byte_window=0)
      shapes = jax.eval_shape(
          models.build_model(c, levels=stages.resolve(c)).init,
          jax.random.PRNGKey(0),
          jnp.zeros((1, 8), jnp.int32),
      )
      sizes[n] = sum(x.size for x in jax.tree.leaves(nn.unbox(shapes)))
    n = min(sizes, key=lambda k: abs(sizes[k] - hier_params))
    c = _variant(config, seq_len, batch, kind='flat', num_layers=n, byte_window=0)
    sec, loss, trainer, _, _ = _time_train_step(c, steps)
    print(
        f'{seq_len:>5} {batch:>5} {f"flat ({n} layers)":<26} {trainer.num_params / 1e6:>7.2f}M '
        f'{sec * 1e3:>9.1f} {batch * seq_len / sec:>9.0f} {"-":>15} {loss:>11.6f}',
        flush=True,
    )


if __name__ == '__main__':
  cli.run(main)
