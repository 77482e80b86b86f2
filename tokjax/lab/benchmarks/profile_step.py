r"""Where a train step's time goes: a `jax.profiler` trace of the step, its ops summed by component.

  python -m tokjax.lab.benchmarks.profile_step [--config configs/compare.py:policy]
      [--shapes 16x512,4x2048] [--capacity_fraction 0.5] [--steps 3] [--out FILE.json]

For each (batch, L) it builds the Trainer of the config at that shape (chunk capacity
capacity_fraction * L, as tokjax.lab.benchmarks.throughput uses), runs two warm-up steps on random
bytes, traces --steps steps, and reads the trace's XLA op events (the CPU client records one per
executed op). Each op is attributed by the `op_name` of its HLO metadata, which carries the flax
module path: the byte layers (encoder, decoder), the main network, the boundary method (policy and
sampling), the heads, the embedding, the chunk gather/scatter of `HierarchicalByteLM._decode`, and
the rest (the estimator, the losses and the optimizer, which live outside the model's modules).
Inside the layers it splits attention, MLP and norms, and the backward pass (ops under `transpose`)
from the forward; over the whole step, the matrix products (`dot` ops and YNNPACK fusions) from
every other op (copies, transposes, pads, elementwise maps). Pin it to one core with one XLA thread for the numbers of a laptop-proxy run:

  XLA_FLAGS='--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1' taskset -c 0 \
      python -m tokjax.lab.benchmarks.profile_step
"""

import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time
from typing import cast

from absl import flags
import jax
from ml_collections import config_flags
import numpy as np

from tokjax import cli, sharding
from tokjax import trainer as trainer_lib
from tokjax.vocab import BOS_ID

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CONFIG = config_flags.DEFINE_config_file(
      'config', 'configs/compare.py:policy', 'Config file (ml_collections).'
  )
  _SHAPES = flags.DEFINE_list('shapes', ['16x512', '4x2048'], 'Step shapes BATCHxL.')
  _CAPACITY = flags.DEFINE_float('capacity_fraction', 0.5, 'Chunk capacity as a fraction of L.')
  _STEPS = flags.DEFINE_integer('steps', 3, 'Traced steps per shape.')
  _OUT = flags.DEFINE_string('out', None, 'Also write the tables to this JSON file.')

# (component, the op_name fragments that put an op in it), first match wins.
COMPONENTS = (
    ('encoder (byte layers)', ('/encoder/', '/inner_encoders_')),
    ('decoder (byte layers)', ('/decoder/', '/inner_decoders_')),
    ('main network (chunk layers)', ('/main/',)),
    ('boundary method (policy, sampling)', ('/boundary/', '/inner_boundaries_')),
    ('heads (LM, early exit)', ('/head/', '/early_head/', '/inner_early_heads_')),
    ('embedding', ('/embed/',)),
    ('chunk gather/scatter', ('HierarchicalByteLM._decode',)),
)
REST = 'estimator, losses, optimizer'
PARTS = (('attention', '/attn/'), ('MLP', '/mlp/'), ('norms', 'norm'))


def op_names(hlo_text: str) -> dict[str, str]:
  """{HLO instruction name: its metadata op_name} of a compiled module's text."""
  found: dict[str, str] = {}
  for line in hlo_text.splitlines():
    m = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = .*?metadata=\{[^}]*op_name="([^"]*)"', line)
    if m:
      found.setdefault(m.group(1), m.group(2))
  return found


def component(op_name: str) -> str:
  for name, fragments in COMPONENTS:
    if any(f in op_name for f in fragments):
      return name
  return REST


def attribute(events: list[dict], names: dict[str, str], steps: int) -> dict:
  """Milliseconds per step of each component (and its backward share), and of attention, MLP and
  norms inside the byte layers and the main network, from a trace's complete ('X') op events."""
  total: collections.Counter[str] = collections.Counter()
  backward: collections.Counter[str] = collections.Counter()
  parts: collections.Counter[str] = collections.Counter()
  kinds: collections.Counter[str] = collections.Counter()
  for e in events:
    if e.get('ph') != 'X' or e['name'] not in names:
      continue
    op = names[e['name']]
    c = component(op)
    total[c] += e['dur']
    # XLA's CPU client runs matrix products as `dot` ops or hands them, fused with their neighbours,
    # to YNNPACK (`ynn_fusion`); every other op moves, reshapes or maps data elementwise.
    kinds['dot or YNNPACK fusion' if e['name'].startswith(('dot', 'ynn_fusion')) else 'other'] += e[
        'dur'
    ]
    if 'transpose(' in op:
      backward[c] += e['dur']
    if c.startswith(('encoder', 'decoder', 'main')):
      stack = 'main network' if c.startswith('main') else 'byte layers'
      part = next((p for p, fragment in PARTS if fragment in op), 'other')
      parts[f'{stack}: {part}'] += e['dur']
  ms = lambda us: round(us / steps / 1e3, 1)
  whole = sum(total.values())
  return {
      'op_ms': ms(whole),
      'components': [
          {
              'component': c,
              'ms': ms(t),
              'share': round(t / whole, 3),
              'backward': round(backward[c] / t, 2),
          }
          for c, t in total.most_common()
      ],
      'layers': [
          {'part': p, 'ms': ms(t), 'share': round(t / whole, 3)} for p, t in parts.most_common()
      ],
      'kinds': [
          {'kind': k, 'ms': ms(t), 'share': round(t / whole, 3)} for k, t in kinds.most_common()
      ],
  }


def profile(config, batch: int, length: int, capacity_fraction: float, steps: int) -> dict:
  """The step of config at (batch, length): its wall time and `attribute` of a traced run."""
  c = config.copy_and_resolve_references()
  c.data.update(seq_len=length, batch_size=batch)
  c.model.capacity = max(2, int(capacity_fraction * length))
  mesh = sharding.make_mesh(c.mesh)
  trainer = trainer_lib.Trainer(c, mesh)
  state = trainer.init(jax.random.PRNGKey(0))
  inputs = np.random.default_rng(0).integers(0, 256, (batch, length)).astype(np.int32)
  inputs[:, 0] = BOS_ID
  host = {'inputs': inputs, 'targets': inputs, 'mask': np.ones((batch, length), np.float32)}
  data = sharding.global_batch(host, mesh)

  def run(n):
    nonlocal state
    for i in range(n):
      state, metrics = trainer.train_step(state, data, jax.random.PRNGKey(i))
      jax.block_until_ready(metrics)

  run(2)  # Compiles, then one more so the traced steps are steady.
  start = time.perf_counter()
  run(steps)
  wall = (time.perf_counter() - start) / steps
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder):
      run(steps)
    (path,) = glob.glob(os.path.join(folder, 'plugins', 'profile', '*', '*.trace.json.gz'))
    with gzip.open(path) as f:
      events = json.load(f)['traceEvents']
  # as_text gives None only on a backend that cannot print its module; the CPU and GPU can.
  hlo = cast(str, trainer.lower_train_step(state, data, jax.random.PRNGKey(0)).compile().as_text())
  found = attribute(events, op_names(hlo), steps)
  found.update(batch=batch, seq_len=length, capacity=c.model.capacity, step_ms=round(wall * 1e3, 1))
  found['bytes_per_s'] = round(batch * length / wall)
  return found


def main(argv):
  del argv
  shapes = [tuple(int(x) for x in s.lower().split('x')) for s in _SHAPES.value]
  results = []
  for batch, length in shapes:
    r = profile(_CONFIG.value, batch, length, _CAPACITY.value, _STEPS.value)
    results.append(r)
    print(
        f'({batch}, {length}), capacity {r["capacity"]}: {r["step_ms"]} ms a step '
        f'({r["bytes_per_s"]} bytes/s), {r["op_ms"]} ms of it in XLA ops'
    )
    for row in r['components']:
      print(
          f'  {row["component"]:36s} {row["ms"]:8.1f} ms {100 * row["share"]:5.1f}%  '
          f'(backward {100 * row["backward"]:3.0f}%)'
      )
    for row in r['layers']:
      print(f'    {row["part"]:34s} {row["ms"]:8.1f} ms {100 * row["share"]:5.1f}%')
    for row in r['kinds']:
      print(f'  ops: {row["kind"]:31s} {row["ms"]:8.1f} ms {100 * row["share"]:5.1f}%')
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      json.dump(results, f, indent=1)


if __name__ == '__main__':
  cli.run(main)
