r"""Step time and per-device memory of the sharded train step for 1, 2, 4 and 8 devices.

  python -m tokjax.lab.benchmarks.scaling [--config configs/default.py] [--layout fsdp] [--devices 1,2,4,8]

Each device count runs in its own subprocess, because the number of simulated CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=N) is fixed when jax starts. On a GPU node or a TPU
VM the same command uses the first N real devices. The global batch stays config.data.batch_size
(strong scaling), on random bytes, and the mesh puts every device on one axis:
  --layout fsdp  : data=1, fsdp=N  (batch, parameters and optimizer state split N ways)
  --layout data  : data=N, fsdp=1  (batch split, parameters and optimizer state replicated)
  --layout tensor: data=1, fsdp=1, tensor=N (heads and MLP width split; needs num_heads % N == 0)

Reported per device: parameters and optimizer state (bytes of the shards device 0 holds), and peak
memory of the compiled step from `compiled.memory_analysis()` (arguments + outputs - donated aliases
+ temporaries) and, on GPU/TPU, `device.memory_stats()['peak_bytes_in_use']`. Simulated CPU devices
share the host's cores, so their step time shows the cost of partitioning and collectives, not a
speed-up; the memory columns are what shrink as the scaling shape predicts.
"""

import json
import os
import re
import subprocess
import sys
import time

from absl import flags
from ml_collections import config_flags

from tokjax import cli
from tokjax.errors import UserError

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CONFIG = config_flags.DEFINE_config_file(
      'config', 'configs/default.py', 'Config file (ml_collections).'
  )
  _DEVICES = flags.DEFINE_list('devices', ['1', '2', '4', '8'], 'Device counts to measure.')
  _LAYOUT = flags.DEFINE_enum('layout', 'fsdp', ['fsdp', 'data', 'tensor'], 'Mesh axis to scale.')
  _STEPS = flags.DEFINE_integer(
      'steps', 10, 'Timed steps per device count (after 2 warm-up steps).'
  )
  _OUT = flags.DEFINE_string('out', '', 'Also write the rows as JSON to this file.')
  _WORKER = flags.DEFINE_integer(
      'worker', 0, 'Internal: measure this many devices in this process.'
  )

MIB = 2.0**20


def _per_device_bytes(tree) -> int:
  """Bytes of the shards of `tree` that the first device holds."""
  import jax  # pylint: disable=g-import-not-at-top

  first = jax.devices()[0]
  total = 0
  for x in jax.tree.leaves(tree):
    total += sum(s.data.nbytes for s in x.addressable_shards if s.device == first)
  return total


def measure(config, n: int, layout: str, steps: int) -> dict:
  """One row: step time and per-device memory of the train step on the first n devices."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from tokjax import sharding  # pylint: disable=g-import-not-at-top
  from tokjax import trainer as trainer_lib

  if len(jax.devices()) < n:
    raise UserError(f'{n} devices requested but jax sees {len(jax.devices())}; lower --devices.')
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = {
      'fsdp': (1, n, 1),
      'data': (n, 1, 1),
      'tensor': (1, 1, n),
  }[layout]
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:n])
  trainer = trainer_lib.Trainer(config, mesh)
  state = trainer.init(jax.random.PRNGKey(0))
  b, l = config.data.batch_size, config.data.seq_len
  rng = np.random.default_rng(0)
  toks = rng.integers(0, 256, (b, l + 1)).astype(np.int32)
  batch = sharding.global_batch(
      dict(inputs=toks[:, :-1], targets=toks[:, 1:], mask=np.ones((b, l), np.float32)), mesh
  )
  key = jax.random.PRNGKey(1)
  t0 = time.perf_counter()
  compiled = trainer.lower_train_step(state, batch, key).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  row = {
      'devices': n,
      'mesh': dict(mesh.shape),
      'platform': jax.devices()[0].platform,
      'params_M': trainer.num_params / 1e6,
      'param_mib_per_device': _per_device_bytes(state.params) / MIB,
      'opt_state_mib_per_device': _per_device_bytes(state.opt_state) / MIB,
      'compile_s': compile_s,
  }
  if mem is not None:
    peak = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    )
    row.update(peak_mib_per_device=peak / MIB, temp_mib_per_device=mem.temp_size_in_bytes / MIB)
  for _ in range(2):
    state, metrics = compiled(state, batch, key)
  jax.block_until_ready(metrics)
  t0 = time.perf_counter()
  for _ in range(steps):
    state, metrics = compiled(state, batch, key)
  jax.block_until_ready(metrics)
  row['step_ms'] = (time.perf_counter() - t0) / steps * 1e3
  stats = jax.devices()[0].memory_stats()
  if stats and 'peak_bytes_in_use' in stats:
    row['device_peak_mib'] = stats['peak_bytes_in_use'] / MIB
  return row


def _child_env(n: int) -> dict:
  flags_ = re.sub(
      r'--xla_force_host_platform_device_count=\S+', '', os.environ.get('XLA_FLAGS', '')
  )
  # First, so that an unparsable token later in the user's XLA_FLAGS cannot hide it.
  return dict(os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={n} {flags_}'.strip())


def run_all(devices, layout: str, steps: int) -> list[dict]:
  """Runs one subprocess per device count (passing on this process's flags) and collects the rows."""
  rows = []
  # The same config (file and --config.x=y overrides) in every child.
  overrides = [a for a in sys.argv[1:] if a.startswith('--config.')]
  config_file = config_flags.get_config_filename(flags.FLAGS['config'])
  for n in devices:
    cmd = [
        sys.executable,
        '-m',
        'tokjax.lab.benchmarks.scaling',
        f'--worker={n}',
        f'--config={config_file}',
        f'--layout={layout}',
        f'--steps={steps}',
    ] + overrides
    proc = subprocess.run(cmd, env=_child_env(n), capture_output=True, text=True, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith('{')]
    if proc.returncode or not lines:
      raise UserError(f'the {n}-device run failed: {(proc.stderr or proc.stdout).strip()[-800:]}')
    rows.append(json.loads(lines[-1]))
    print(format_row(rows[-1]), flush=True)
  return rows


HEADER = (
    'devices  mesh(data,fsdp,tensor)  step ms  compile s  params MiB/dev  opt MiB/dev  '
    'peak MiB/dev (compiled)  peak MiB (device)'
)


def format_row(r: dict) -> str:
  mesh = ','.join(str(v) for v in r['mesh'].values())
  peak = f'{r["peak_mib_per_device"]:.2f}' if 'peak_mib_per_device' in r else 'n/a'
  dev = f'{r["device_peak_mib"]:.2f}' if 'device_peak_mib' in r else 'n/a'
  return (
      f'{r["devices"]:>7}  {mesh:>22}  {r["step_ms"]:7.1f}  {r["compile_s"]:9.1f}  '
      f'{r["param_mib_per_device"]:14.3f}  {r["opt_state_mib_per_device"]:11.3f}  '
      f'{peak:>23}  {dev:>17}'
  )


def main(argv):
  del argv
  config = _CONFIG.value
  if _WORKER.value:
    print(json.dumps(measure(config, _WORKER.value, _LAYOUT.value, _STEPS.value)))
    return
  try:
    devices = [int(d) for d in _DEVICES.value]
  except ValueError:
    raise UserError(
        f'--devices={",".join(_DEVICES.value)} must be integers, e.g. 1,2,4,8.'
    ) from None
  print(
      f'train step of {config.model.kind} d_model {config.model.d_model}, batch '
      f'{config.data.batch_size} x {config.data.seq_len} bytes, layout {_LAYOUT.value}, '
      f'{_STEPS.value} timed steps',
      flush=True,
  )
  print(HEADER, flush=True)
  rows = run_all(devices, _LAYOUT.value, _STEPS.value)
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      json.dump(rows, f, indent=1)
    print(f'wrote {_OUT.value}')


if __name__ == '__main__':
  cli.run(main)
