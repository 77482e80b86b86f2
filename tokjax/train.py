r"""Train a tokjax model from a config file.

  python -m tokjax.train --config configs/default.py [--config.train.steps=1000] [--resume]

Writes into config.train.workdir: metrics.jsonl, TensorBoard events (tensorboard/), orbax checkpoints
(checkpoints/), curves.png, and at the end prints val bits-per-byte beside the gzip -9 / xz -9 figures
of the same split and, for a hierarchical model, the learned segmentation of held-out text.
"""

import math
import os
import time

from absl import flags
import jax
from ml_collections import config_flags

from tokjax import (
    checkpointing,
    cli,
    config_defaults,
    distributed,
    segmentation,
    sharding,
    train_state,
)
from tokjax.data import pipeline
from tokjax.errors import UserError
from tokjax.metric_writers import MetricWriter, plot_curves

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CONFIG = config_flags.DEFINE_config_file(
      'config', 'configs/default.py', 'Config file (ml_collections).'
  )
  _RESUME = flags.DEFINE_bool(
      'resume', False, 'Continue from the latest checkpoint in the workdir.'
  )


def prepare_workdir(workdir: str, resume: bool) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, '.write_test')
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise UserError(
        f'cannot write to workdir {workdir!r} ({e.strerror}); choose a writable folder '
        'with --config.train.workdir=PATH.'
    ) from None
  metrics = os.path.join(workdir, 'metrics.jsonl')
  if not resume and os.path.exists(metrics):
    raise UserError(
        f'{workdir} already holds a run; pass --resume to continue it or choose a new '
        '--config.train.workdir.'
    )


def evaluate(trainer, params, batches, key, modes=('sample',)) -> dict:
  """Bits-per-byte over `batches` (byte-weighted) and batch-averaged boundary metrics, per mode."""
  out = {}
  for mode in modes:
    sums, ce, nbytes = {}, 0.0, 0.0
    for i, batch in enumerate(batches):
      # Eval batches are global (the same on every process): each process places its own rows.
      batch = sharding.global_batch_from_global(batch, trainer.mesh)
      m = jax.device_get(trainer.eval_step(params, batch, jax.random.fold_in(key, i), mode))
      ce, nbytes = ce + float(m.pop('ce_sum')), nbytes + float(m.pop('bytes'))
      for k, v in m.items():
        sums[k] = sums.get(k, 0.0) + float(v)
    prefix = '' if mode == 'sample' else f'{mode}_'
    out.update({prefix + k: v / len(batches) for k, v in sums.items() if k not in ('bpb', 'loss')})
    out[prefix + 'bpb'] = ce / max(nbytes, 1.0) / math.log(2)
  return out


def format_eta(seconds: float) -> str:
  seconds = int(seconds)
  return f'{seconds // 60}m{seconds % 60:02d}s'


def show_segmentation(trainer, params, data, config, key) -> str:
  """Held-out lines (from the test split) with '|' after each chunk, greedy and sampled."""
  text = data.splits['test'][0]
  lines = []
  for mode in ('greedy', 'sample'):
    shown, actions, _ = segmentation.boundaries_for(
        trainer.model, params, text, config.data.seq_len, key, mode
    )
    lines.append(f'--- {mode} boundaries ---')
    lines.append(segmentation.render(shown, actions, max_lines=config.eval.segment_lines))
  return '\n'.join(lines)


def train(config, resume: bool = False) -> dict:
  """Runs training; returns the final val metrics. Raises UserError for fixable input problems."""
  config_defaults.validate(config)
  distributed.maybe_initialize(config.mesh.get('multihost', 'auto'))  # Before anything touches JAX.
  workdir = config.train.workdir
  prepare_workdir(workdir, resume)
  mesh = sharding.make_mesh(config.mesh)
  data = pipeline.build_data(config)
  trainer = train_state.Trainer(config, mesh)
  hierarchical = config.model.kind == 'hierarchical'
  ref = data.reference_bpb('val')
  print(
      f'tokjax: {config.model.kind} model, {trainer.num_params / 1e6:.2f}M parameters, '
      f'{len(jax.devices())} device(s) mesh {dict(mesh.shape)}, corpus {config.data.corpus!r} '
      f'({sum(map(len, data.splits["train"])) / 1e6:.1f} MB train)',
      flush=True,
  )

  mgr = checkpointing.manager(workdir, config.train.keep_checkpoints)
  key = jax.random.PRNGKey(config.seed)
  init_key, train_key, eval_key = jax.random.split(key, 3)
  if resume and mgr.latest_step() is not None:
    state, step = checkpointing.restore(mgr, trainer.abstract_state, data.train_iter)
    print(f'resumed from step {step}', flush=True)
  else:
    state = trainer.init(init_key)
  writer = MetricWriter(workdir, enabled=jax.process_index() == 0)
  modes = ('sample', 'greedy') if hierarchical else ('sample',)
  total, start_step = config.train.steps, int(state.step)
  seq_bytes = config.data.batch_size * config.data.seq_len
  t0, last_t, last_step, val = time.time(), time.time(), start_step, {}
  nonfinite_at_start = int(state.nonfinite)
  for step in range(start_step, total):
    batch = sharding.global_batch(next(data.train_iter), mesh)
    new_state, metrics = trainer.train_step(state, batch, train_key)
    done = step + 1
    if done % config.train.log_every == 0 or done == total:
      metrics = jax.device_get(metrics)
      now = time.time()
      rate = (done - last_step) * seq_bytes / (now - last_t)
      eta = (total - done) * (now - t0) / max(done - start_step, 1)
      writer.write(done, 'train', dict(metrics, bytes_per_s=rate))
      extra = (
          f' | rate {metrics["rate"]:.3f} ws {metrics["whitespace_recall"]:.2f}'
          if hierarchical
          else ''
      )
      print(
          f'step {done:>6}/{total} | {rate / 1e3:6.1f}k B/s | loss {metrics["loss"]:.4f} | '
          f'bpb {metrics["bpb"]:.4f}{extra} | left {format_eta(eta)}',
          flush=True,
      )
      last_t, last_step = now, done
    state = new_state
    boundary = (
        any(
            done % n == 0
            for n in (
                config.train.log_every,
                config.train.eval_every,
                config.train.checkpoint_every,
            )
        )
        or done == total
    )
    if boundary and int(state.nonfinite) > nonfinite_at_start:
      raise UserError(
          f'the loss or gradient became NaN/inf before step {done} (those updates were '
          f'skipped; checkpoint step {mgr.latest_step()} is intact): lower '
          '--config.optim.lr or use --config.model.dtype=float32, then rerun with --resume.'
      )
    if done % config.train.eval_every == 0 or done == total:
      val = evaluate(trainer, state.params, data.val_batches, eval_key, modes)
      writer.write(done, 'val', val)
      greedy = f' (greedy {val["greedy_bpb"]:.4f})' if hierarchical else ''
      seg = (
          f' | rate {val["rate"]:.3f} ws {val["whitespace_recall"]:.2f} greedy ws '
          f'{val["greedy_whitespace_recall"]:.2f}'
          if hierarchical
          else ''
      )
      print(
          f'  val bpb {val["bpb"]:.4f}{greedy} | gzip -9 {ref["gzip"]:.3f} xz -9 {ref["xz"]:.3f}'
          f'{seg}',
          flush=True,
      )
      if hierarchical:  # Watch the tokenization form: a held-out line with greedy boundaries.
        text = data.splits['test'][0]
        shown, actions, _ = segmentation.boundaries_for(
            trainer.model, state.params, text, config.data.seq_len, eval_key, 'greedy'
        )
        print(f'  greedy: {segmentation.preview(shown, actions)}', flush=True)
    if done % config.train.checkpoint_every == 0 or done == total:
      checkpointing.save(mgr, done, state, data.train_iter, config)
  writer.close()
  png = os.path.join(workdir, 'curves.png')
  if writer.enabled:
    plot_curves(writer.path, png)
  print(
      f'final val bpb {val.get("bpb", float("nan")):.4f} | gzip -9 {ref["gzip"]:.3f} | '
      f'xz -9 {ref["xz"]:.3f} | wall {format_eta(time.time() - t0)}'
  )
  print(f'wrote {writer.path}, {png}, checkpoints in {mgr.directory}')
  if hierarchical:
    print('learned segmentation of held-out text (| ends a chunk):')
    print(show_segmentation(trainer, state.params, data, config, eval_key))
  return val


def main(argv):
  del argv
  train(_CONFIG.value, resume=_RESUME.value)


if __name__ == '__main__':
  cli.run(main)
