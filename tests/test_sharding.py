"""Tests of the sharded train step on a simulated 8-device mesh (tokjax.sharding, trainer_lib, checkpointing).

The sharded computations run in subprocesses started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (the flag must be set before jax is imported): this
file doubles as their script (`python tests/test_sharding.py GROUP`), which prints one JSON line of
measurements that the tests below check. The two groups run side by side to keep the file short.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# The score-function method and the straight-through rivals checked against one device. A rival
# needs tokjax.models.rivals; without it, its test is skipped (never silently passed).
POLICY_METHODS = ('policy',)
STRAIGHT_THROUGH_METHODS = ('hnet',)

SINGLE = (1, 1, 1)
# (data, fsdp, tensor). SOURCE ("2x4": data 2, fsdp 4) writes the checkpoint that TARGET ("2x2x2",
# whose tensor axis splits what SOURCE keeps whole) and one device restore.
SOURCE, TARGET = (2, 4, 1), (2, 2, 2)
POLICY_MESHES = (SINGLE, TARGET, SOURCE)
RIVAL_MESHES = (SINGLE, (2, 2, 2))
STEPS = 3
TOL = 1e-5  # Losses and metrics.
# Adam's first moments (the clipped gradients, summed over steps) relative to their largest entry:
# summing in another order over 8 shards moves them by up to 1.5e-5 of it (measured); a per-shard
# baseline or a missing cross-device sum is off by O(1).
MU_TOL = 1e-4
LR = 1e-3
# Adam's first update, lr * g / (|g| + 1e-8), turns float round-off in a gradient entry near 1e-8
# into a parameter difference of up to lr / 2 (measured: 1e-6 to 2e-5 at lr 2e-4..1e-2), so the
# parameters are compared at that scale and the gradients themselves through Adam's first moment
# mu (linear in the gradients) at MU_TOL.
PARAM_TOL = 0.5 * LR


# ------------------------------------------------------------------------------ subprocess side


def _config(method):
  from tokjax.config import defaults as config_defaults

  c = config_defaults.base_config()
  c.model.update(
      d_model=32,
      num_heads=2,
      encoder_layers=1,
      main_layers=1,
      decoder_layers=1,
      byte_window=8,
      capacity=16,
  )
  c.data.update(seq_len=32, batch_size=8)
  c.boundary.method = method
  # Constant learning rate. Adam's first update is about lr * sign(grad), so gradient magnitudes
  # that differ between meshes show in grad_norm and in the later steps' losses.
  c.optim.update(lr=LR, warmup_steps=1, warmup_init_factor=1.0, min_lr_factor=1.0)
  c.train.steps = 100
  return c


def _batches(n, b=8, l=32, seed=0):
  """n batches of random bytes with spaces; row 7 is padded after 24 targets (mask 0)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    toks = rng.integers(97, 123, (b, l + 1)).astype(np.int32)
    toks[rng.random((b, l + 1)) < 0.2] = 32
    mask = np.ones((b, l), np.float32)
    mask[7, 24:] = 0.0
    out.append(dict(inputs=toks[:, :-1], targets=toks[:, 1:], mask=mask))
  return out


def _max_diff(a, b):
  import jax  # pylint: disable=g-import-not-at-top

  return max(
      float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def _gate_kernel(tree):
  return tree['main']['block_0']['mlp']['gate']['kernel']


def _shard_shapes(x):
  return sorted({tuple(s.data.shape) for s in x.addressable_shards})


def _run_meshes(method, meshes, checkpoint_dir=None):
  """Trains STEPS steps on each mesh from the same init, batches and key; measures the differences."""
  import jax  # pylint: disable=g-import-not-at-top

  from tokjax import sharding  # pylint: disable=g-import-not-at-top
  from tokjax import trainer as trainer_lib

  config = _config(method)
  batches = _batches(STEPS + 1)
  key = jax.random.PRNGKey(1)
  trainers, states, out = {}, {}, {'meshes': {}}
  init = None  # The single-device initial state, on the host.
  for shape in meshes:
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    mesh = sharding.make_mesh(config.mesh, jax.devices()[: int(np.prod(shape))])
    trainer = trainer_lib.Trainer(config, mesh)
    if shape in (SINGLE, meshes[1]):
      state = trainer.init(jax.random.PRNGKey(0))
    else:  # Compiling init for every mesh would double this file's run time; reshard one instead.
      state = jax.device_put(init, trainer.state_sharding)
    if shape == SINGLE:
      init = jax.device_get(state)
    if shape == meshes[1]:  # Sharded random init draws the same numbers as on one device.
      out['init_diff'] = _max_diff(jax.device_get(state.params), init.params)
    metrics = []
    for i in range(STEPS):
      state, m = trainer.train_step(state, sharding.global_batch(batches[i], mesh), key)
      metrics.append({k: float(v) for k, v in jax.device_get(m).items()})
    trainers[shape], states[shape] = trainer, state
    out['meshes'][str(shape)] = {
        'metrics': metrics,
        'gate_shards': _shard_shapes(_gate_kernel(state.params)),
        'gate_mu_shards': _shard_shapes(_gate_kernel(state.opt_state[1][0].mu)),
        'embed_shards': _shard_shapes(state.params['embed']['embedding']),
        'num_shards': len(_gate_kernel(state.params).addressable_shards),
    }
  base = jax.device_get(states[SINGLE].params)
  out['moved'] = _max_diff(base, init.params)
  mu = lambda shape: jax.device_get(states[shape].opt_state[1][0].mu)
  out['mu_scale'] = max(float(np.abs(x).max()) for x in jax.tree.leaves(mu(SINGLE)))
  for shape in meshes:
    out['meshes'][str(shape)]['param_diff'] = _max_diff(jax.device_get(states[shape].params), base)
    out['meshes'][str(shape)]['mu_diff'] = _max_diff(mu(shape), mu(SINGLE))
  if checkpoint_dir:
    out['checkpoint'] = _checkpoint_roundtrip(
        config, trainers, states, batches[STEPS], key, checkpoint_dir
    )
  return out


def _checkpoint_roundtrip(config, trainers, states, batch, key, directory):
  """Saves SOURCE's state, restores it on TARGET and on one device, and takes one more step on each."""
  import jax  # pylint: disable=g-import-not-at-top

  from tokjax import checkpointing, sharding  # pylint: disable=g-import-not-at-top

  mgr = checkpointing.manager(directory)
  checkpointing.save(mgr, STEPS, states[SOURCE], None, config)
  out = {}
  for shape in (SOURCE, TARGET, SINGLE):
    trainer = trainers[shape]
    if shape == SOURCE:
      state = states[SOURCE]
    else:
      state, step = checkpointing.restore(mgr, trainer.abstract_state)
      out[f'restored_step_{shape}'] = int(step)
    out[f'gate_shards_{shape}'] = _shard_shapes(_gate_kernel(state.params))
    out[f'state_step_{shape}'] = int(state.step)
    state, m = trainer.train_step(state, sharding.global_batch(batch, trainer.mesh), key)
    out[f'loss_{shape}'] = float(m['loss'])
    out[f'params_{shape}'] = jax.device_get(state.params)
  for shape in (TARGET, SINGLE):
    out[f'param_diff_{shape}'] = _max_diff(out[f'params_{shape}'], out[f'params_{SOURCE}'])
  return {k: v for k, v in out.items() if not k.startswith('params_')}


def _advantages():
  """The batch-relative advantage under a 4x2 batch split, against the global and per-shard means."""
  import jax  # pylint: disable=g-import-not-at-top

  from tokjax import estimator, sharding  # pylint: disable=g-import-not-at-top
  from tokjax.config import defaults as config_defaults  # pylint: disable=g-import-not-at-top

  c = config_defaults.base_config()
  c.mesh.data, c.mesh.fsdp = 4, 2
  mesh = sharding.make_mesh(c.mesh)
  rng = np.random.default_rng(0)
  # Rows of different shards have very different rewards, so a per-shard mean would be far off.
  r = (rng.normal(size=(16, 8)) + 10.0 * np.arange(16)[:, None]).astype(np.float32)
  mask = (rng.random((16, 8)) < 0.8).astype(np.float32)
  batch = sharding.global_batch(dict(r=r, mask=mask), mesh)
  with sharding.use(mesh, c.mesh):
    adv = jax.jit(estimator.batch_relative_advantages)(batch['r'], batch['mask'])
  mean = lambda x, m: (x * m).sum(0) / np.maximum(m.sum(0), 1.0)
  want = (r - mean(r, mask)) * mask
  rows = 16 // 8
  per_shard = np.concatenate(
      [
          (r[i : i + rows] - mean(r[i : i + rows], mask[i : i + rows])) * mask[i : i + rows]
          for i in range(0, 16, rows)
      ]
  )
  return {
      'vs_global': float(np.abs(np.asarray(adv) - want).max()),
      'per_shard_vs_global': float(np.abs(per_shard - want).max()),
      'input_shards': _shard_shapes(batch['r']),
  }


def _occupied_prefix():
  """A chunk stack run on its occupied prefix (`layers.on_occupied_prefix`: a switch whose backward
  recomputes) with rows split 4 x 2 over data and fsdp, against one device: output and gradients."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from tokjax import sharding  # pylint: disable=g-import-not-at-top
  from tokjax.config import defaults as config_defaults  # pylint: disable=g-import-not-at-top
  from tokjax.models import layers  # pylint: disable=g-import-not-at-top

  c = config_defaults.base_config()
  c.mesh.data, c.mesh.fsdp = 4, 2
  mesh = sharding.make_mesh(c.mesh)
  stack = layers.Stack(layers.StackSettings(num_layers=1, num_heads=2, mlp_hidden=64))
  rng = np.random.default_rng(0)
  counts = rng.integers(20, 100, 8)  # Every row fits the 128-slot prefix of a 256-slot buffer.
  valid = np.arange(256)[None] < counts[:, None]
  host = dict(
      x=rng.normal(size=(8, 256, 32)).astype(np.float32),
      positions=np.where(valid, 2 * np.arange(256)[None], 512).astype(np.int32),
      valid=valid,
  )
  params = stack.init(jax.random.PRNGKey(0), host['x'], host['positions'], host['valid'])
  run = lambda p, *a: stack.apply(p, *a)

  def loss(params, x, batch):
    y = layers.on_occupied_prefix(
        run, params, x, batch['positions'], batch['valid'], layers.prefix_lengths(256)
    )
    return jnp.sum(jnp.sin(y))

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  step = lambda params, batch, step=step: step(params, batch['x'], batch)
  single = step(params, host)
  with sharding.use(mesh, c.mesh):
    batch = sharding.global_batch(host, mesh)
    sharded = step(params, batch)
  return {
      'prefix_sharded_diff': max(  # Relative to each array's largest entry.
          float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(a)).max())
          for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded))
      ),
      'prefix_input_shards': _shard_shapes(batch['x']),
  }


def _multiprocess_worker():
  """One of 2 processes (4 CPU devices each) joined by distributed.maybe_initialize via JAX_* env."""
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  from tokjax import distributed, sharding  # pylint: disable=g-import-not-at-top
  from tokjax.config import defaults as config_defaults

  joined = distributed.maybe_initialize('auto')
  c = config_defaults.base_config()
  c.mesh.update(data=2, fsdp=4, tensor=1)
  mesh = sharding.make_mesh(c.mesh)
  pid, rows = jax.process_index(), 16
  full = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)  # An eval batch, on every process.
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  # Row sums and row-index-weighted sums: the second tells whether rows sit in their global order.
  stats = jax.jit(
      lambda a: (a.sum(0), (a * np.arange(a.shape[0])[:, None]).sum(0)), out_shardings=replicated
  )
  from_global = sharding.global_batch_from_global({'x': full}, mesh)['x']
  from_local = sharding.global_batch({'x': full[pid::2]}, mesh)['x']  # This process's train rows.
  naive = sharding.global_batch({'x': full}, mesh)['x']  # Eval batch mistaken for local rows.
  return {
      'joined': joined,
      'processes': jax.process_count(),
      'devices': len(jax.devices()),
      'from_global': [np.asarray(v).tolist() for v in stats(from_global)],
      'want': [full.sum(0).tolist(), (full * np.arange(rows)[:, None]).sum(0).tolist()],
      'from_local_rows': from_local.shape[0],
      'from_local_sum': np.asarray(stats(from_local)[0]).tolist(),
      'naive_rows': naive.shape[0],
  }


def _worker(group):
  if group == 'multiprocess':
    return _multiprocess_worker()
  if group == 'policy':
    with tempfile.TemporaryDirectory() as tmp:
      out = {'policy': _run_meshes('policy', POLICY_MESHES, os.path.join(tmp, 'run'))}
    out['advantages'] = _advantages()
    out['occupied_prefix'] = _occupied_prefix()
    return out
  out = {}
  for method in STRAIGHT_THROUGH_METHODS:
    out[method] = _run_meshes(method, RIVAL_MESHES)
  return out


# ------------------------------------------------------------------------------ pytest side


def _rivals_available():
  try:
    import tokjax.models.rivals  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import

    return True
  except ImportError:
    return False


@pytest.fixture(scope='module')
def results():
  """Runs both groups in parallel subprocesses on 8 simulated CPU devices; {group: JSON result}."""
  from conftest import XLA_FAST_COMPILE  # pylint: disable=g-import-not-at-top  (a script too)

  env = dict(
      os.environ,
      XLA_FLAGS=f'--xla_force_host_platform_device_count=8 {XLA_FAST_COMPILE}',
      JAX_PLATFORMS='cpu',
      TF_CPP_MIN_LOG_LEVEL='3',
  )
  groups = ['policy'] + (['rivals'] if _rivals_available() else [])
  procs = {
      g: subprocess.Popen(
          [sys.executable, __file__, g],
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for g in groups
  }
  out = {}
  for g, p in procs.items():
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, f'worker {g} failed:\n{stderr[-4000:]}'
    out.update(json.loads(stdout.strip().splitlines()[-1]))
  return out


def _free_port():
  import socket  # pylint: disable=g-import-not-at-top

  with socket.socket() as sock:
    sock.bind(('localhost', 0))
    return sock.getsockname()[1]


def test_two_processes_build_the_same_global_batches():
  """Multi-host data path on 2 CPU processes: maybe_initialize joins them, eval batches keep their
  global rows and order, train batches are assembled from each process's own rows."""
  from conftest import XLA_FAST_COMPILE  # pylint: disable=g-import-not-at-top  (a script too)

  port = _free_port()
  procs = []
  for pid in range(2):
    env = dict(
        os.environ,
        XLA_FLAGS=f'--xla_force_host_platform_device_count=4 {XLA_FAST_COMPILE}',
        JAX_PLATFORMS='cpu',
        JAX_COORDINATOR_ADDRESS=f'localhost:{port}',
        JAX_NUM_PROCESSES='2',
        JAX_PROCESS_ID=str(pid),
        TF_CPP_MIN_LOG_LEVEL='3',
    )
    procs.append(
        subprocess.Popen(
            [sys.executable, __file__, 'multiprocess'],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
  outs = []
  for p in procs:
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr[-4000:]
    outs.append(json.loads(stdout.strip().splitlines()[-1]))
  for out in outs:
    assert out['joined'] and out['processes'] == 2 and out['devices'] == 8
    assert out['from_global'] == out['want']  # Same rows, same order as the batch itself.
    assert out['from_local_rows'] == 16 and out['from_local_sum'] == out['want'][0]
    assert out['naive_rows'] == 32  # What treating a global eval batch as local rows would do.


def test_detect_multihost_from_environment():
  from tokjax import distributed  # pylint: disable=g-import-not-at-top

  assert not distributed.detect_multihost({})
  assert distributed.detect_multihost({'JAX_COORDINATOR_ADDRESS': 'h:1234'})
  assert distributed.detect_multihost({'SLURM_JOB_ID': '7', 'SLURM_STEP_NUM_TASKS': '16'})
  # The batch script of a many-task allocation is still one process.
  assert not distributed.detect_multihost(
      {'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '16', 'SLURM_STEP_NUM_TASKS': '1'}
  )
  assert distributed.detect_multihost({'OMPI_COMM_WORLD_SIZE': '4'})
  assert not distributed.detect_multihost({'TPU_WORKER_HOSTNAMES': 'localhost'})
  assert distributed.detect_multihost({'TPU_WORKER_HOSTNAMES': 'w0,w1,w2,w3'})


def test_bad_mesh_and_multihost_settings_are_user_errors():
  import ml_collections  # pylint: disable=g-import-not-at-top

  from tokjax import distributed, sharding  # pylint: disable=g-import-not-at-top
  from tokjax.errors import UserError  # pylint: disable=g-import-not-at-top

  mesh_config = lambda d, f, t: ml_collections.ConfigDict(dict(data=d, fsdp=f, tensor=t))
  assert sharding.mesh_shape(mesh_config(-1, 2, 2), 8) == (2, 2, 2)
  for bad in [(-1, -1, 1), (3, 1, 1), (-1, 3, 1), (0, 1, 1)]:
    with pytest.raises(UserError, match='config.mesh'):
      sharding.mesh_shape(mesh_config(*bad), 8)
  with pytest.raises(UserError, match='multihost'):
    distributed.maybe_initialize('yes')
  assert distributed.maybe_initialize('off') is False


def test_indivisible_dimensions_replicate():
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top

  from tokjax import sharding  # pylint: disable=g-import-not-at-top

  class FakeMesh:  # fit_spec only reads axis sizes.
    shape = {'data': 2, 'fsdp': 2, 'tensor': 4}

  assert sharding.fit_spec(P('tensor', 'fsdp'), (258, 64), FakeMesh()) == P(None, 'fsdp')
  assert sharding.fit_spec(P('fsdp', 'tensor'), (64, 256), FakeMesh()) == P('fsdp', 'tensor')
  assert sharding.fit_spec(P(('data', 'fsdp')), (6, 3), FakeMesh()) == P(None, None)


def _check_same_as_single_device(run, meshes):
  base = run['meshes'][str(SINGLE)]['metrics']
  for shape in meshes[1:]:
    got = run['meshes'][str(shape)]
    for step, (m, m0) in enumerate(zip(got['metrics'], base)):
      for k in m0:
        assert m[k] == pytest.approx(m0[k], rel=TOL, abs=TOL), (shape, step, k, m[k], m0[k])
    assert got['mu_diff'] < MU_TOL * run['mu_scale'], (shape, got['mu_diff'], run['mu_scale'])
    assert got['param_diff'] < PARAM_TOL, (shape, got['param_diff'])
  assert run['moved'] > 4 * PARAM_TOL  # The steps really updated the parameters.


@pytest.mark.parametrize('method', POLICY_METHODS)
def test_sharded_step_equals_single_device_score_function(results, method):
  run = results[method]
  _check_same_as_single_device(run, POLICY_MESHES)
  assert run['meshes'][str(SINGLE)]['metrics'][0]['policy_loss'] != 0.0  # The estimator is on.


@pytest.mark.parametrize('method', STRAIGHT_THROUGH_METHODS)
def test_sharded_step_equals_single_device_straight_through(results, method):
  if not _rivals_available():
    pytest.skip('tokjax.models.rivals is missing')
  _check_same_as_single_device(results[method], RIVAL_MESHES)


def test_batch_relative_mean_is_over_the_global_batch(results):
  adv = results['advantages']
  assert adv['input_shards'] == [[2, 8]]  # 16 rows really split over 8 devices.
  assert adv['per_shard_vs_global'] > 1.0  # A per-shard mean would be visibly wrong here...
  assert adv['vs_global'] < 1e-4  # ...and the sharded computation uses the global one.


def test_a_chunk_stack_on_its_occupied_prefix_shards_like_one_device(results):
  r = results['occupied_prefix']
  assert r['prefix_input_shards'] == [[1, 256, 32]]  # 8 rows over 8 devices.
  assert r['prefix_sharded_diff'] < 1e-5, r


def test_parameters_and_optimizer_state_are_sharded(results):
  assert results['policy']['init_diff'] == 0.0  # Sharded init draws the single-device numbers.
  meshes = results['policy']['meshes']
  # main/block_0/mlp/gate/kernel: [embed=32, mlp=128] -> ('fsdp', 'tensor').
  assert meshes[str(SINGLE)]['gate_shards'] == [[32, 128]]
  assert meshes[str((2, 2, 2))]['gate_shards'] == [[16, 64]]
  assert meshes[str((2, 2, 2))]['gate_mu_shards'] == [[16, 64]]
  assert meshes[str(SOURCE)]['gate_shards'] == [[8, 128]]
  assert meshes[str(SOURCE)]['num_shards'] == 8
  # embed/embedding: [vocab=258, embed=32] -> ('tensor', 'fsdp').
  assert meshes[str((2, 2, 2))]['embed_shards'] == [[129, 16]]


def test_checkpoint_restores_on_other_meshes_and_training_continues(results):
  ck = results['policy']['checkpoint']
  assert ck[f'gate_shards_{SOURCE}'] == [[8, 128]]
  # Restored with the target's own layout, not the source's.
  assert ck[f'gate_shards_{TARGET}'] == [[16, 64]]
  for shape in (TARGET, SINGLE):
    assert ck[f'restored_step_{shape}'] == STEPS and ck[f'state_step_{shape}'] == STEPS
    assert ck[f'loss_{shape}'] == pytest.approx(ck[f'loss_{SOURCE}'], rel=TOL, abs=TOL)
    assert ck[f'param_diff_{shape}'] < PARAM_TOL


if __name__ == '__main__':
  print(json.dumps(_worker(sys.argv[1])))
