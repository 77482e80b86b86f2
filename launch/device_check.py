r"""One-shot accelerator check: throughput and MFU of the paper's 40M and 147M train steps (bf16, the
largest per-device batch that fits), the w = 8 sampler's share of a step at L = 4096, and a few hundred
training steps of a 40M-width model on the embedded standard-library corpus; writes
results/accelerators/<device>.md. Run it through launch/device_check.sh (which installs what an
offline image lacks); `--dry_run` shrinks every size so the whole logic runs on a CPU in minutes.

  python launch/device_check.py [--dry_run] [--out_dir results/accelerators] [--timed_steps 10]
"""

import argparse
import json
import os
import re
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from tokjax import compile_check, flops, sharding, train
from tokjax import trainer as trainer_lib
from tokjax.config import presets
from tokjax.lab.benchmarks.throughput import median_seconds
from tokjax.models import boundaries

# Per-device batch to try first at L = 4096, from the AOT compiles for TPU v5p (results/scale/):
# the 40M step needs about 1.2 GiB of temporaries per sequence, the 147M step about 2.4 GiB.
GIB_PER_SEQUENCE = {'40m': 1.25, '147m': 2.45}


def _device_memory(device):
  stats = device.memory_stats() if hasattr(device, 'memory_stats') else None
  return (stats or {}).get('bytes_limit')


def _shrink(c):
  """Dry-run sizes: the same code paths at a size a CPU runs in seconds."""
  c.model.update(d_model=64, num_heads=4, encoder_layers=1, main_layers=1, decoder_layers=1)
  c.model.update(capacity=64, dtype='float32')
  c.data.seq_len = 256
  return c


def paper_step(size: str, device, hbm, dry_run: bool, timed_steps: int) -> dict:
  """The largest power-of-two batch whose compiled step fits `hbm`, then its timed throughput."""
  base = presets.paper_config(size)
  base.mesh.update(data=1, fsdp=1, tensor=1)
  if dry_run:
    base = _shrink(base)
    start = 4
  else:
    usable = (hbm or 40 * 2**30) * 0.9 / 2**30
    start = max(1, 2 ** int(np.log2(max(1.0, usable / GIB_PER_SEQUENCE[size]))))
  mesh = sharding.make_mesh(base.mesh, [device])
  tried, chosen = [], None
  n = start
  while n >= 1:
    c = base.copy_and_resolve_references()
    c.data.batch_size = n
    trainer = trainer_lib.Trainer(c, mesh)
    t0 = time.perf_counter()
    compiled = compile_check.compile_train_step(trainer)
    mem = compiled.memory_analysis()
    need = compile_check.total_bytes(mem) if mem is not None else None
    fits = hbm is None or need is None or need <= hbm
    tried.append({'batch': n, 'bytes': need, 'fits': fits, 'compile_s': time.perf_counter() - t0})
    print(f'  {size} batch {n}: needs {need} bytes of {hbm}: {"fits" if fits else "too big"}')
    if fits:
      chosen = (c, trainer, compiled)
      break
    n //= 2
  if chosen is None:
    return {'size': size, 'tried': tried, 'fits': False}
  c, trainer, compiled = chosen
  state = trainer.init(jax.random.PRNGKey(0))
  b, l = c.data.batch_size, c.data.seq_len
  rng = np.random.default_rng(0)
  toks = rng.integers(0, 256, (b, l + 1), dtype=np.int32)
  batch = sharding.global_batch(
      {'inputs': toks[:, :-1], 'targets': toks[:, 1:], 'mask': np.ones((b, l), np.float32)}, mesh
  )
  holder = {'state': state, 'rate': []}
  key = jax.random.PRNGKey(1)

  def step():
    holder['state'], metrics = compiled(holder['state'], batch, key)
    holder['rate'].append(metrics['rate'])
    return metrics['loss']

  seconds = median_seconds(step, timed_steps)
  rate = float(np.mean([float(r) for r in holder['rate']]))
  model_flops = flops.step_flops(c, rate, levels=trainer.levels)
  peak = flops.peak_flops(device, cpu_peak=flops.measure_matmul_peak() if dry_run else None)
  return {
      'size': size,
      'params_M': trainer.num_params / 1e6,
      'batch': b,
      'seq_len': l,
      'dtype': c.model.dtype,
      'fits': True,
      'tried': tried,
      'step_s': seconds,
      'bytes_per_s': b * l / seconds,
      'rate': rate,
      'model_flops_per_step': model_flops,
      'xla_flops_per_step': compile_check.xla_flops(compiled),
      'model_tflops_per_s': model_flops / seconds / 1e12,
      'peak_flops': peak,
      'mfu': flops.mfu(model_flops, seconds, peak) if peak else None,
      'peak_memory_bytes': tried[-1]['bytes'],
  }


def sampler_seconds(batch: int, seq_len: int, timed_steps: int) -> float:
  """Time of the w = 8 sequential sampler (a lax.scan over L positions) on its own, float32[B, L, 8]."""
  v = jax.random.normal(jax.random.PRNGKey(0), (batch, seq_len, 8))
  u = jax.random.uniform(jax.random.PRNGKey(1), (batch, seq_len))
  capacity = seq_len // 4
  draw = jax.jit(
      lambda v, u: boundaries.sample_sequential(v, jnp.float32(-1.4), u, 1 / 16, capacity)
  )
  return median_seconds(lambda: draw(v, u), timed_steps)


def train_run(dry_run: bool, workdir: str) -> dict:
  """A 40M-width model (d 512, 4/6/4 layers, w = 8, bf16) on the stdlib corpus: does the loss fall?"""
  c = presets.paper_config('40m')
  c.data.update(corpus='stdlib', max_bytes=20_000_000, seq_len=1024, batch_size=32)
  c.model.capacity = 512
  c.optim.update(lr=2e-3, warmup_steps=50)
  c.train.update(steps=300, log_every=25, eval_every=150, checkpoint_every=300, workdir=workdir)
  c.eval.update(batch_size=32, max_batches=4)
  c.mesh.update(data=-1, fsdp=1, tensor=1, multihost='off')
  if dry_run:
    c = _shrink(c)
    c.data.update(max_bytes=1_000_000, seq_len=128, batch_size=8)
    c.train.update(steps=12, log_every=4, eval_every=12, checkpoint_every=12)
    c.eval.update(batch_size=8, max_batches=1)
  t0 = time.perf_counter()
  val = train.train(c)
  rows = [json.loads(x) for x in open(os.path.join(workdir, 'metrics.jsonl')) if x.strip()]
  losses = [(r['step'], r['loss']) for r in rows if r.get('split') == 'train' and 'loss' in r]
  return {
      'steps': c.train.steps,
      'batch': c.data.batch_size,
      'seq_len': c.data.seq_len,
      'd_model': c.model.d_model,
      'first_loss': losses[0],
      'last_loss': losses[-1],
      'val_bpb': float(val.get('bpb', float('nan'))),
      'val_rate': float(val.get('rate', float('nan'))),
      'wall_s': time.perf_counter() - t0,
  }


def _fmt(x, spec):
  return 'n/a' if x is None else format(x, spec)


def write_report(path: str, info: dict, steps: list, sampler: dict, run: dict, dry_run: bool):
  lines = [
      f'# {info["device"]}: tokjax device check',
      '',
      f'{"DRY RUN on CPU at toy sizes: these numbers prove the script, not the hardware. " if dry_run else ""}'
      f'Measured {info["date"]} with `launch/device_check.sh{" --dry_run" if dry_run else ""}` '
      f'(jax {info["jax"]}, {info["devices"]} device(s), one used; memory limit '
      f'{_fmt(info["hbm_gib"], ".1f")} GiB).',
      '',
      f'## Train-step throughput (random bytes, {steps[0].get("dtype", "")}, one device)',
      '',
      '| config | params | batch x L | step s | bytes/s | realised rate | model TFLOP/s | MFU '
      '| XLA TFLOP/step | peak memory GiB |',
      '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for s in steps:
    if not s['fits']:
      lines.append(f'| {s["size"]} | | did not fit at batch 1 | | | | | | | |')
      continue
    lines.append(
        f'| {s["size"]} | {s["params_M"]:.1f}M | {s["batch"]} x {s["seq_len"]} | '
        f'{s["step_s"]:.3f} | {s["bytes_per_s"]:,.0f} | {s["rate"]:.3f} | '
        f'{s["model_tflops_per_s"]:.2f} | {_fmt(s["mfu"], ".1%")} | '
        f'{_fmt((s["xla_flops_per_step"] or 0) / 1e12, ".2f")} | '
        f'{_fmt((s["peak_memory_bytes"] or 0) / 2**30, ".2f")} |'
    )
  lines += [
      '',
      'Batch: the largest power of two whose compiled step (memory_analysis: arguments + outputs - '
      'donated + temporaries) fits the device memory limit. Model FLOPs count the main network on the '
      'realised chunks (tokjax/flops.py); MFU is against the bf16 peak in tokjax.flops.PEAK_FLOPS.',
      '',
      '## The w = 8 sampler at L = 4096',
      '',
      f'`boundaries.sample_sequential` alone on float32[{sampler["batch"]}, {sampler["seq_len"]}, 8]: '
      f'{sampler["seconds"] * 1e3:.1f} ms, {sampler["share"]:.1%} of the 40M train step at the same '
      'batch (its forward draw; the step runs it once).',
      '',
      '## Training: 40M width on the embedded standard-library corpus',
      '',
      f'd_model {run["d_model"]}, batch {run["batch"]} x {run["seq_len"]}, {run["steps"]} steps, '
      f'{run["wall_s"]:.0f} s wall: train loss {run["first_loss"][1]:.3f} at step '
      f'{run["first_loss"][0]} -> {run["last_loss"][1]:.3f} at step {run["last_loss"][0]}; '
      f'val bpb {run["val_bpb"]:.3f}, rate {run["val_rate"]:.3f}.',
      '',
  ]
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write('\n'.join(lines))


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--dry_run', action='store_true', help='Toy sizes, on CPU; proves the logic.')
  p.add_argument('--out_dir', default='results/accelerators')
  p.add_argument('--timed_steps', type=int, default=10)
  args = p.parse_args()
  device = jax.devices()[0]
  if device.platform == 'cpu' and not args.dry_run:
    sys.exit('error: no accelerator visible to jax; use --dry_run to check the script on a CPU.')
  hbm = _device_memory(device)
  info = {
      'device': device.device_kind,
      'jax': jax.__version__,
      'devices': len(jax.devices()),
      'hbm_gib': hbm / 2**30 if hbm else None,
      'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
  }
  print(f'device check on {info}', flush=True)
  t0 = time.perf_counter()
  steps = [paper_step(s, device, hbm, args.dry_run, args.timed_steps) for s in ('40m', '147m')]
  for s in steps:
    print(json.dumps({k: v for k, v in s.items() if k != 'tried'}), flush=True)
  forty = steps[0]
  seq = 256 if args.dry_run else 4096
  sb = forty['batch'] if forty['fits'] else 1
  sec = sampler_seconds(sb, seq, args.timed_steps)
  sampler = {
      'batch': sb,
      'seq_len': seq,
      'seconds': sec,
      'share': sec / forty['step_s'] if forty['fits'] else float('nan'),
  }
  print(json.dumps({'sampler': sampler}), flush=True)
  with tempfile.TemporaryDirectory() as workdir:
    run = train_run(args.dry_run, os.path.join(workdir, 'run'))
  print(json.dumps({'train': run}), flush=True)
  slug = re.sub(r'[^a-z0-9]+', '-', info['device'].lower()).strip('-')
  if args.dry_run:
    slug += '-dry-run'
  path = os.path.join(args.out_dir, f'{slug}.md')
  write_report(path, info, steps, sampler, run, args.dry_run)
  print(f'wrote {path} in {time.perf_counter() - t0:.0f} s', flush=True)
  if run['last_loss'][1] >= run['first_loss'][1]:
    sys.exit('error: the training loss did not fall; see the report.')


if __name__ == '__main__':
  main()
