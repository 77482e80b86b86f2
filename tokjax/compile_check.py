r"""Ahead-of-time compile of a config's train and eval steps for a TPU slice (or simulated CPU devices):
per-device memory against the chip's HBM, whether it fits, FLOPs per step, compile time.

  python -m tokjax.compile_check --config configs/paper_147m_fineweb.py --topology v5p:2x2x1
  python -m tokjax.compile_check --config configs/paper_40m_fineweb.py --topology v4:2x2x1 \
      --find_batch --out results/scale/40m_v4.json
  python -m tokjax.compile_check --config configs/default.py --topology cpu:8

TPU topologies need libtpu (`pip install -e .[tpu]`); nothing runs on a TPU: libtpu compiles for the
devices `jax.experimental.topologies.get_topology_desc` describes, here on the CPU. `cpu:N` compiles
for N simulated CPU devices; the device count is fixed when jax starts, so the command re-executes
itself once with XLA_FLAGS=--xla_force_host_platform_device_count=N.

The step compiled is the `Trainer`'s own jitted train step (and eval steps), lowered on abstract
(ShapeDtypeStruct) state and batch sharded over a mesh of the topology's devices with the config's
mesh and logical-axis rules. --per_device_batch sets config.data.batch_size to that many sequences
per data*fsdp shard. Reported per device: parameter and optimizer-state bytes (the shards one device
holds), the compiled step's temporaries, and total = arguments + outputs - donated aliases +
temporaries + code, against the chip's HBM; FLOPs of the step from XLA's cost_analysis (per device)
next to the analytic count of tokjax.flops at the target rate.
"""

import json
import math
import os
import re
import sys
import time
from typing import cast

from absl import flags
from ml_collections import config_flags

from tokjax import cli
from tokjax.errors import UserError

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CONFIG = config_flags.DEFINE_config_file(
      'config', 'configs/default.py', 'Config file (ml_collections).'
  )
  _TOPOLOGY = flags.DEFINE_string(
      'topology',
      'cpu:8',
      'TPU topology as libtpu names it (v5p:2x2x1, v4:2x2x4, v5e:2x2, v6e:2x2) '
      'or cpu:N for N simulated CPU devices.',
  )
  _PER_DEVICE_BATCH = flags.DEFINE_integer(
      'per_device_batch', 0, "Sequences per data*fsdp shard (0 = the config's batch_size)."
  )
  _FIND_BATCH = flags.DEFINE_bool(
      'find_batch', False, 'Also search the largest per-device batch that fits (powers of two).'
  )
  _REQUIRE_FIT = flags.DEFINE_bool(
      'require_fit', False, 'Exit non-zero when the step does not fit.'
  )
  _EVAL = flags.DEFINE_bool('eval', True, 'Also compile the eval step(s).')
  _OUT = flags.DEFINE_string('out', '', 'Also write the report as JSON to this file.')
  _TABLE = flags.DEFINE_string(
      'table', '', 'Only print a markdown table of the JSON reports in this folder, and exit.'
  )
  _HBM_GIB = flags.DEFINE_float(
      'hbm_gib', 0.0, "Memory per device to check against, GiB (0 = the chip's HBM; none on CPU)."
  )

GIB = 2.0**30
TOPOLOGY_EXAMPLES = 'v5p:2x2x1, v5p:2x2x2, v4:2x2x1, v4:2x2x4, v5e:2x2, v5e:4x4, v6e:2x2, cpu:8'
TPU_INSTALL = 'pip install -e ".[tpu]"  (or: pip install "jax[tpu]==0.10.2")'
_REEXEC_MARK = 'TOKJAX_COMPILE_CHECK_CPU_DEVICES'

# HBM per chip (bytes) by the device_kind libtpu reports. A topology may expose each TensorCore of a
# chip as its own device (v4 without megacore: 2 devices per chip), which then gets its share.
HBM_PER_CHIP = {
    'TPU v4': 32 * GIB,
    'TPU v5': 95 * GIB,  # v5p
    'TPU v5p': 95 * GIB,
    'TPU v5 lite': 16 * GIB,  # v5e
    'TPU v5e': 16 * GIB,
    'TPU v6 lite': 32 * GIB,  # v6e (Trillium)
    'TPU v6e': 32 * GIB,
}


def parse_topology(name: str):
  """'cpu:8' -> ('cpu', 8); 'v5p:2x2x1' -> ('tpu', 4 chips). Raises UserError on a malformed name."""
  m = re.fullmatch(r'cpu:(\d+)', name)
  if m and int(m.group(1)) > 0:
    return 'cpu', int(m.group(1))
  m = re.fullmatch(r'(v\d+[a-z]*(?:\s*lite)?):(\d+(?:x\d+)+)', name)
  if not m:
    raise UserError(f'unknown topology {name!r}; valid examples: {TOPOLOGY_EXAMPLES}.')
  return 'tpu', math.prod(int(x) for x in m.group(2).split('x'))


def _tpu_env() -> None:
  # No TPU metadata server here, and another process may have loaded libtpu: neither matters for
  # compiling ahead of time.
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')


def topology_devices(name: str):
  """(devices, per-device HBM bytes or None) for a topology name."""
  import jax  # pylint: disable=g-import-not-at-top

  platform, chips = parse_topology(name)
  if platform == 'cpu':
    devices = jax.devices('cpu')
    if len(devices) < chips:
      raise UserError(
          f'{name} needs {chips} CPU devices but jax started with {len(devices)}; run the command '
          f'as `python -m tokjax.compile_check` (it sets XLA_FLAGS itself) or set '
          f'XLA_FLAGS=--xla_force_host_platform_device_count={chips}.'
      )
    return devices[:chips], None
  try:
    import libtpu  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise UserError(f'compiling for {name} needs libtpu; install it with: {TPU_INSTALL}') from None
  _tpu_env()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  try:
    topology = topologies.get_topology_desc(platform='tpu', topology_name=name)
    # jax annotates these with an alias of Device made by assignment, which mypy cannot resolve.
    devices = cast(list[jax.Device], topology.devices)
  except Exception as e:  # pylint: disable=broad-except
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(
        f'libtpu does not accept topology {name!r} ({msg}); valid examples: {TOPOLOGY_EXAMPLES}.'
    ) from None
  kind = devices[0].device_kind
  hbm = HBM_PER_CHIP.get(kind)
  per_chip = max(1, len(devices) // chips)
  return devices, (hbm / per_chip if hbm else None)


def _shard_bytes(abstract_tree, shardings) -> int:
  """Bytes one device holds of a tree of ShapeDtypeStructs laid out by `shardings`."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  total = 0
  for x, s in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings)):
    total += int(np.prod(s.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
  return total


def xla_flops(compiled):
  """FLOPs of a compiled step from XLA's cost_analysis (per device for a partitioned step)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return float(cost['flops']) if cost and 'flops' in cost else None


_OOM = re.compile(
    r'required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)'
)
_UNIT = {'': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}


def total_bytes(mem) -> int:
  """Peak bytes per device of a compiled step: arguments + outputs - donated + temporaries + code."""
  return (
      mem.argument_size_in_bytes
      + mem.output_size_in_bytes
      - mem.alias_size_in_bytes
      + mem.temp_size_in_bytes
      + mem.generated_code_size_in_bytes
  )


def compile_train_step(trainer):
  """The Trainer's jitted train step compiled for its mesh on abstract state and batch."""
  batch, key = abstract_inputs(trainer.config, trainer.mesh)
  return trainer.lower_train_step(trainer.abstract_state, batch, key).compile()


def abstract_inputs(config, mesh):
  """ShapeDtypeStructs of a training batch {inputs, targets: int32[B, L], mask: float32[B, L]} and
  of a replicated jax.random.PRNGKey."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from tokjax import sharding  # pylint: disable=g-import-not-at-top

  shape, s = (config.data.batch_size, config.data.seq_len), sharding.batch_sharding(mesh)
  batch = dict(
      inputs=jax.ShapeDtypeStruct(shape, jnp.int32, sharding=s),
      targets=jax.ShapeDtypeStruct(shape, jnp.int32, sharding=s),
      mask=jax.ShapeDtypeStruct(shape, jnp.float32, sharding=s),
  )
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return batch, jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)


def check(config, devices, hbm_bytes=None, compile_eval: bool = True) -> dict:
  """Compiles the train (and eval) step of `config` for `devices`; -> the report as a dict.

  A step that runs out of memory in the compiler is reported with fits=False and, where the compiler
  says, the bytes it needed; other compile errors propagate.
  """

  from tokjax import flops, sharding  # pylint: disable=g-import-not-at-top
  from tokjax import trainer as trainer_lib
  from tokjax.config import validation as config_validation

  levels = config_validation.validate(config)
  mesh = sharding.make_mesh(config.mesh, devices)
  shards = mesh.shape['data'] * mesh.shape['fsdp']
  if config.data.batch_size % shards:
    raise UserError(
        f'config.data.batch_size={config.data.batch_size} does not split into data*fsdp={shards} '
        'shards; use a multiple (or --per_device_batch).'
    )
  trainer = trainer_lib.Trainer(config, mesh, levels=levels)
  state, shard = trainer.abstract_state, trainer.state_sharding
  batch, key = abstract_inputs(config, mesh)
  analytic = flops.step_flops(config, levels=levels)
  report = {
      'topology_devices': len(devices),
      'device_kind': devices[0].device_kind,
      'mesh': {k: int(v) for k, v in mesh.shape.items()},
      'model': config.model.kind,
      'params_M': trainer.num_params / 1e6,
      'global_batch': config.data.batch_size,
      'per_device_batch': config.data.batch_size // shards,
      'seq_len': config.data.seq_len,
      'dtype': config.model.dtype,
      'param_bytes': _shard_bytes(state.params, shard.params),
      'opt_state_bytes': _shard_bytes(state.opt_state, shard.opt_state),
      'hbm_bytes': hbm_bytes,
      'analytic_flops_per_step': analytic,
      'analytic_flops_per_device': analytic / len(devices),
      # The method's work with the main network on target_rate * L chunks (MFU counts these).
      'model_flops_per_step_at_target_rate': flops.step_flops(
          config, levels[0].target_rate, levels=levels
      )
      if trainer.model.num_stages
      else analytic,
  }
  # The memory options (tokjax.config.defaults: model.remat/scan_layers/attention, optim.grad_accum_steps).
  m = config.model
  report['remat'] = {k: str(v) for k, v in dict(m.remat).items()}
  report['scan_layers'], report['attention'] = m.scan_layers, m.attention
  report['grad_accum_steps'] = int(config.optim.grad_accum_steps)
  t0 = time.perf_counter()
  try:
    compiled = compile_train_step(trainer)
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    if 'RESOURCE_EXHAUSTED' not in text and 'Ran out of memory' not in text:
      raise
    m = _OOM.search(text)
    report.update(compile_s=time.perf_counter() - t0, fits=False, error=text.splitlines()[0][:300])
    if m:
      need = float(m.group(1)) * _UNIT[m.group(2)]
      have = float(m.group(3)) * _UNIT[m.group(4)]
      report.update(temp_bytes=need, compiler_available_bytes=have, over_bytes=need - have)
    return report
  report['compile_s'] = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  report['xla_flops_per_device'] = xla_flops(compiled)
  if mem is not None:
    total = total_bytes(mem)
    report.update(
        argument_bytes=mem.argument_size_in_bytes,
        output_bytes=mem.output_size_in_bytes,
        alias_bytes=mem.alias_size_in_bytes,
        temp_bytes=mem.temp_size_in_bytes,
        total_bytes=total,
    )
    if hbm_bytes:
      report['fits'] = total <= hbm_bytes
      report['headroom_bytes'] = hbm_bytes - total
  if 'fits' not in report:
    report['fits'] = True  # It compiled and the device has no known capacity (simulated CPU).
  if compile_eval:
    report['eval'] = {}
    for mode in trainer.model.boundary_modes:
      t0 = time.perf_counter()
      c = trainer.lower_eval_step(state.params, batch, key, mode).compile()
      m = c.memory_analysis()
      report['eval'][mode] = {
          'compile_s': time.perf_counter() - t0,
          'temp_bytes': m.temp_size_in_bytes if m is not None else None,
          'xla_flops_per_device': xla_flops(c),
      }
  return report


def with_per_device_batch(config, n: int, num_devices: int):
  """A copy of config whose global batch is n sequences per data*fsdp shard."""
  from tokjax import sharding  # pylint: disable=g-import-not-at-top

  c = config.copy_and_resolve_references()
  data, fsdp, _ = sharding.mesh_shape(c.mesh, num_devices)
  c.data.batch_size = n * data * fsdp
  return c


def find_batch(config, devices, hbm_bytes, start: int) -> tuple[int, list[dict]]:
  """Largest power-of-two per-device batch that fits (0 if even 1 does not), and every report made."""
  reports, best, n = [], 0, max(1, start)
  while True:
    r = check(with_per_device_batch(config, n, len(devices)), devices, hbm_bytes, False)
    reports.append(r)
    print(format_report(r), flush=True)
    if not r['fits']:
      break
    best, n = n, n * 2
    if n > 4096:
      break
  if best == 0 and n > 1:  # The start did not fit: walk down.
    n //= 2
    while n >= 1:
      r = check(with_per_device_batch(config, n, len(devices)), devices, hbm_bytes, False)
      reports.append(r)
      print(format_report(r), flush=True)
      if r['fits']:
        best = n
        break
      n //= 2
  return best, reports


def _gib(x) -> str:
  if x is None:
    return 'n/a'
  return f'{x / GIB:.2f} GiB' if abs(x) >= GIB / 4 else f'{x / 2**20:.2f} MiB'


def format_report(r: dict) -> str:
  lines = [
      f'{r["model"]} {r["params_M"]:.1f}M params, batch {r["global_batch"]} x {r["seq_len"]} '
      f'({r["per_device_batch"]} per data*fsdp shard), {r["dtype"]}, mesh {r["mesh"]}, '
      f'{r["topology_devices"]} x {r["device_kind"]}',
      f'  per device: params {_gib(r["param_bytes"])}, optimizer state {_gib(r["opt_state_bytes"])}, '
      f'temporaries {_gib(r.get("temp_bytes"))}, total {_gib(r.get("total_bytes"))} '
      f'of HBM {_gib(r["hbm_bytes"])}',
  ]
  if r['fits']:
    head = r.get('headroom_bytes')
    lines.append('  fits' + (f' with {_gib(head)} to spare' if head is not None else ''))
  elif 'over_bytes' in r:
    lines.append(
        f'  does NOT fit: the compiler needs {_gib(r["temp_bytes"])} of temporaries, '
        f'{_gib(r["over_bytes"])} more than the {_gib(r["compiler_available_bytes"])} available'
    )
  else:
    lines.append(
        f'  does NOT fit: {_gib(-r["headroom_bytes"])} over'
        if 'headroom_bytes' in r
        else f'  does NOT fit: {r.get("error", "")}'
    )
  xla = r.get('xla_flops_per_device')
  lines.append(
      f'  FLOPs per step per device: XLA {xla:.3e}'
      if xla
      else '  FLOPs per step per device: XLA n/a'
  )
  lines[-1] += f', analytic {r["analytic_flops_per_device"]:.3e}; compile {r["compile_s"]:.1f} s'
  for mode, e in r.get('eval', {}).items():
    lines.append(
        f'  eval ({mode}): temporaries {_gib(e["temp_bytes"])}, compile {e["compile_s"]:.1f} s'
    )
  return '\n'.join(lines)


def markdown_table(reports: list[dict]) -> str:
  """One row per report: config, topology, batch, memory per device, fit, FLOPs, compile time."""
  rows = [
      '| config | topology (devices) | mesh d/f/t | batch (per shard) | memory options | params+opt '
      'GiB/dev | temporaries GiB/dev | total GiB/dev | HBM GiB/dev | fits | XLA TFLOP/dev/step | '
      'analytic TFLOP/dev/step | compile s |',
      '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in reports:
    remat = {k: v for k, v in r.get('remat', {}).items() if v != 'none'}
    options = ', '.join(
        [f'remat {k}={v}' for k, v in remat.items()]
        + ([f'accumulate {r["grad_accum_steps"]}'] if r.get('grad_accum_steps', 1) > 1 else [])
        + (['scan'] if r.get('scan_layers') else [])
    )
    g = lambda k, r=r: f'{r[k] / GIB:.2f}' if r.get(k) is not None else 'n/a'
    fits = 'yes' if r['fits'] else 'NO'
    if not r['fits'] and 'over_bytes' in r:
      fits += f' ({r["over_bytes"] / GIB:.2f} GiB over the compiler\'s limit)'
    elif 'headroom_bytes' in r:
      fits += f' ({abs(r["headroom_bytes"]) / GIB:.1f} GiB {"spare" if r["fits"] else "over"})'
    xla = r.get('xla_flops_per_device')
    mesh = '/'.join(str(r['mesh'][a]) for a in ('data', 'fsdp', 'tensor'))
    rows.append(
        f'| {r.get("config", r["model"])} | {r.get("topology", "")} ({r["topology_devices"]}) | '
        f'{mesh} | {r["global_batch"]} ({r["per_device_batch"]}) | {options or "none"} | '
        f'{(r["param_bytes"] + r["opt_state_bytes"]) / GIB:.2f} | {g("temp_bytes")} | '
        f'{g("total_bytes")} | {g("hbm_bytes")} | {fits} | '
        f'{f"{xla / 1e12:.1f}" if xla else "n/a"} | {r["analytic_flops_per_device"] / 1e12:.1f} | '
        f'{r["compile_s"]:.0f} |'
    )
  return '\n'.join(rows)


def _reexec_for_cpu(n: int) -> None:
  """Restarts this command with n simulated CPU devices unless it already has them."""
  if os.environ.get(_REEXEC_MARK) == str(n):
    return
  flags_ = re.sub(
      r'--xla_force_host_platform_device_count=\S+', '', os.environ.get('XLA_FLAGS', '')
  )
  env = dict(
      os.environ,
      XLA_FLAGS=f'--xla_force_host_platform_device_count={n} {flags_}'.strip(),
      JAX_PLATFORMS='cpu',
      **{_REEXEC_MARK: str(n)},
  )
  sys.stdout.flush()
  os.execve(sys.executable, [sys.executable, '-m', 'tokjax.compile_check'] + sys.argv[1:], env)


def main(argv):
  del argv
  if _TABLE.value:
    files = sorted(f for f in os.listdir(_TABLE.value) if f.endswith('.json'))
    reports = []
    for f in files:
      with open(os.path.join(_TABLE.value, f)) as fh:
        reports.append(dict(json.load(fh), config=f[: -len('.json')]))
    print(markdown_table(reports))
    return
  platform, count = parse_topology(_TOPOLOGY.value)
  if platform == 'cpu':
    _reexec_for_cpu(count)
  config = _CONFIG.value
  devices, hbm = topology_devices(_TOPOLOGY.value)
  if _HBM_GIB.value > 0:
    hbm = _HBM_GIB.value * GIB
  if _PER_DEVICE_BATCH.value:
    config = with_per_device_batch(config, _PER_DEVICE_BATCH.value, len(devices))
  report = check(config, devices, hbm, _EVAL.value)
  report['topology'] = _TOPOLOGY.value
  report['config'] = os.path.basename(config_flags.get_config_filename(flags.FLAGS['config']))
  print(format_report(report), flush=True)
  if _FIND_BATCH.value:
    best, tried = find_batch(config, devices, hbm, report['per_device_batch'])
    report['largest_per_device_batch'] = best
    report['find_batch_tried'] = [
        {
            k: t.get(k)
            for k in ('per_device_batch', 'fits', 'temp_bytes', 'total_bytes', 'compile_s')
        }
        for t in tried
    ]
    print(f'largest per-device batch that fits (powers of two): {best}', flush=True)
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, 'w') as out:
      json.dump(report, out, indent=1)
    print(f'wrote {_OUT.value}')
  if _REQUIRE_FIT.value and not report['fits']:
    raise UserError(
        f'the train step does not fit on {_TOPOLOGY.value} (see above); lower '
        '--per_device_batch, or turn on remat / gradient accumulation.'
    )


if __name__ == '__main__':
  cli.run(main)
