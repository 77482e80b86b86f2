r"""Train the score-function method under each baseline at equal compute, over seeds, and compare.

  python -m tokjax.lab.estimator_training --corpus shakespeare --steps 600 --seeds 0,1,2 \
      --out results/estimators/training

Variants: those of configs/estimators.py (its docstring describes them; "draws" = boundary draws per
step, what sets the step's cost): full, gae, rloo4x4, rloo2x8 at 16 draws per step, rloo4x16 at 64.

At 16 draws per step the RLOO variants cost the same main/decoder compute as the full method but see
B*L distinct training bytes per step (4x fewer for rloo4x4): the trade RLOO makes is more samples of
boundaries per sequence for fewer sequences. Each run trains with `tokjax.train.train` in OUT/VARIANT_sSEED
(console output in train.log); a run whose result.json exists is not retrained, so a grid can be split over
several processes (e.g. one per core with `taskset`) and summarised by a last call with all of it.
OUT gets results.md / results.json (mean ± standard deviation over seeds) and curves.png.
What counts at CPU scale is how fast the boundary policy learns (bits-per-byte barely separates
boundary estimators at this size: final val bpb within 0.003 of each other at equal training bytes
for full and gae, README): the table reports the sampled and greedy
whitespace recall of the policy on validation over training, and the steps until the sampled policy
ends a chunk at >= 90% of whitespace bytes.
"""

import os
import sys

from absl import flags, logging
import numpy as np

from tokjax import cli, estimator, stages
from tokjax.config import files as config_files
from tokjax.config import validation as config_validation
from tokjax.errors import UserError
from tokjax.lab import common
from tokjax.metric_writers import read_metrics


def variants() -> dict[str, str]:
  """The variants of configs/estimators.py: name -> one-line description."""
  return config_files.load_module('estimators').VARIANTS


WS_THRESHOLD = (
    0.9  # "Learned": the sampled policy ends a chunk at this fraction of whitespace bytes.
)

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CORPUS = flags.DEFINE_string(
      'corpus', 'shakespeare', 'Corpus spec (see tokjax/data/corpora.py).'
  )
  _STEPS = flags.DEFINE_integer('steps', 600, 'Training steps per run.')
  _EVAL_EVERY = flags.DEFINE_integer('eval_every', 50, 'Validation interval (steps).')
  _SEEDS = flags.DEFINE_list('seeds', '0,1,2', 'Seeds (each variant trains once per seed).')
  _VARIANTS = flags.DEFINE_list(
      'variants',
      'full,gae,rloo4x4,rloo2x8',
      'Variants, from '
      + ','.join(variants())
      + '; NAME:S1+S2 trains NAME with its own seeds S1, S2 instead of --seeds.',
  )
  _OUT = flags.DEFINE_string('out', 'results/estimators/training', 'Results folder.')
  _TINY = flags.DEFINE_bool('tiny', False, 'Tiny model and eval (smoke tests).')


def variant_config(
    variant: str, corpus: str, seed: int, steps: int, eval_every: int, tiny: bool = False
):
  """configs/estimators.py:VARIANT[,tiny] with the command's corpus, seed and schedule; validated."""
  if variant not in variants():
    raise UserError(
        f'unknown variant {variant!r}; --variants takes some of {",".join(variants())}.'
    )
  c = config_files.load('estimators', f'{variant},tiny' if tiny else variant)
  c.data.corpus = corpus
  c.seed = seed
  c.train.steps, c.train.eval_every, c.train.checkpoint_every = steps, eval_every, steps
  c.train.log_every = max(1, min(25, steps // 8))
  config_validation.validate(c)
  return c


def draws_per_step(config) -> int:
  est = stages.get(config, 0).estimator
  return config.data.batch_size * estimator.baseline(est.baseline).draws(est)


def first_step_at(steps, values, threshold):
  """The first evaluated step whose value is >= threshold (None if never)."""
  return next((s for s, v in zip(steps, values) if v >= threshold), None)


def summarize_run(workdir: str, config, result: dict) -> dict:
  """One run's validation curve and headline numbers, from its metrics.jsonl."""
  val = [r for r in read_metrics(os.path.join(workdir, 'metrics.jsonl')) if r['split'] == 'val']
  steps = [r['step'] for r in val]
  ws = [r['whitespace_recall'] for r in val]
  late = [
      r for r in val if r['step'] > steps[-1] * 2 // 3
  ]  # The last third: averages out the jumps.
  step_s = config.data.batch_size * config.data.seq_len / result['train_bytes_per_s']
  return {
      'curve': {
          k: [r[k] for r in val]
          for k in (
              'bpb',
              'whitespace_recall',
              'whitespace_precision',
              'greedy_whitespace_recall',
              'rate',
          )
      }
      | {'step': steps},
      'steps_to_ws': first_step_at(steps, ws, WS_THRESHOLD),
      'late_ws': float(np.mean([r['whitespace_recall'] for r in late])),
      'late_ws_precision': float(np.mean([r['whitespace_precision'] for r in late])),
      'late_greedy_ws': float(np.mean([r['greedy_whitespace_recall'] for r in late])),
      'final_bpb': val[-1]['bpb'],
      'final_rate': val[-1]['rate'],
      'step_s': step_s,
      'wall_s': result['wall_s'],
      'draws_per_step': draws_per_step(config),
      'train_bytes': config.train.steps * config.data.batch_size * config.data.seq_len,
  }


def _mean_sd(xs, digits=3):
  xs = [x for x in xs if x is not None]
  if not xs:
    return '-'
  return f'{np.mean(xs):.{digits}f}' + (
      f' ± {np.std(xs, ddof=1):.{digits}f}' if len(xs) > 1 else ''
  )


def _reached(rs) -> str:
  """Mean steps to the whitespace threshold over the seeds that reached it, with their count."""
  reached = [r['steps_to_ws'] for r in rs if r['steps_to_ws'] is not None]
  return _mean_sd(reached, 0) + (f' ({len(reached)}/{len(rs)})' if len(reached) < len(rs) else '')


def _at(run, step, key='whitespace_recall'):
  c = run['curve']
  return c[key][c['step'].index(step)] if step in c['step'] else None


def write_outputs(out_dir, runs, meta):
  """runs: {variant: [per-seed summaries]}, meta['seeds']: {variant: seeds} -> results.md, results.json,
  curves.png in out_dir."""
  steps = meta['steps']
  every = meta['eval_every']
  marks = sorted({every * max(1, round(steps * f / every)) for f in (1 / 6, 1 / 3, 1 / 2)})
  lines = [
      f'# Score-function baselines at equal compute on `{meta["corpus"]}`',
      '',
      'Command:',
      '',
      f'    {meta["command"]}',
      '',
      f'{steps} steps per run; mean ± sample standard deviation over seeds (listed below). '
      '"ws" is the fraction of whitespace bytes that end a chunk on validation (sampled boundaries '
      f'unless marked greedy); "late" averages the evaluations of the last third of training; '
      f'"steps to ws {WS_THRESHOLD}" is the first evaluation (every {meta["eval_every"]} steps) with '
      f'sampled ws >= {WS_THRESHOLD} ("-" if a seed never got there: averaged over the seeds that did, '
      'with the count). s/step: median over log intervals, on the cores the command ran on.',
      '',
      *common.table(
          'variant | draws/step | train bytes | '
          + ' | '.join(f'ws @{s}' for s in marks)
          + f' | steps to ws {WS_THRESHOLD} | late ws | late ws precision | late greedy ws | '
          'final val bpb | final rate | s/step',
          (
              f'{name} | {rs[0]["draws_per_step"]} | {rs[0]["train_bytes"]:.3g} | '
              + ' | '.join(_mean_sd([_at(r, s) for r in rs], 2) for s in marks)
              + f' | {_reached(rs)} | {_mean_sd([r["late_ws"] for r in rs])} | '
              f'{_mean_sd([r["late_ws_precision"] for r in rs])} | '
              f'{_mean_sd([r["late_greedy_ws"] for r in rs])} | '
              f'{_mean_sd([r["final_bpb"] for r in rs])} | '
              f'{_mean_sd([r["final_rate"] for r in rs])} | '
              f'{_mean_sd([r["step_s"] for r in rs], 3)}'
              for name, rs in runs.items()
          ),
      ),
  ]
  described = variants()
  lines += (
      ['', 'Variants:', '']
      + [f'- `{n}`: {described[n]}; seeds {meta["seeds"][n]}' for n in runs]
      + ['']
  )
  common.write_results(out_dir, {'meta': meta, 'runs': runs}, lines)

  plt = common.pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for i, (name, rs) in enumerate(runs.items()):
    color = f'C{i}'
    for j, r in enumerate(rs):
      c = r['curve']
      label = name if j == 0 else None
      axes[0].plot(c['step'], c['whitespace_recall'], color=color, alpha=0.8, label=label)
      axes[1].plot(
          [s * r['step_s'] for s in c['step']],
          c['whitespace_recall'],
          color=color,
          alpha=0.8,
          label=label,
      )
      axes[2].plot(c['step'], c['bpb'], color=color, alpha=0.8, label=label)
  axes[0].set_xlabel('step (16 draws/step except rloo4x16)')
  axes[1].set_xlabel('training seconds (median s/step x step)')
  for ax in axes[:2]:
    ax.set_ylabel('val whitespace recall (sampled)')
    ax.axhline(WS_THRESHOLD, color='gray', lw=0.5)
  axes[2].set_xlabel('step')
  axes[2].set_ylabel('val bits-per-byte (sampled)')
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f'{meta["corpus"]}: one line per seed')
  common.save_figure(fig, os.path.join(out_dir, 'curves.png'))


def parse_variants(specs, seeds):
  """['full', 'rloo4x16:0+1'] and default seeds -> {'full': seeds, 'rloo4x16': [0, 1]}."""
  out = {}
  for spec in specs:
    name, _, own = spec.partition(':')
    try:
      out[name] = [int(s) for s in own.split('+')] if own else list(seeds)
    except ValueError as e:
      raise UserError(
          f'--variants entry {spec!r}: seeds after ":" must be integers joined by "+", '
          'e.g. rloo4x16:0+1.'
      ) from e
  return out


def run_grid(corpus, steps, eval_every, seeds, variants, out_dir, tiny=False, command=''):
  """Trains (or reuses) every variant x seed, writes the summary; returns {variant: [summaries]}.

  variants: --variants entries (NAME or NAME:S1+S2, see `parse_variants`).
  """
  os.makedirs(out_dir, exist_ok=True)
  grid = parse_variants(variants, seeds)
  configs = {
      (v, s): variant_config(v, corpus, s, steps, eval_every, tiny)
      for v, ss in grid.items()
      for s in ss
  }
  runs: dict[str, list[dict]] = {v: [] for v in grid}
  for (v, s), config in configs.items():
    name = f'{v}_s{s}'
    print(
        f'[estimator_training] {name}: {steps} steps, {draws_per_step(config)} draws/step',
        flush=True,
    )
    result = common.train_or_load(name, config, out_dir)
    runs[v].append(summarize_run(os.path.join(out_dir, name), config, result))
    r = runs[v][-1]
    print(
        f'[estimator_training] {name}: steps to ws {WS_THRESHOLD} {r["steps_to_ws"]} | late ws '
        f'{r["late_ws"]:.3f} | final bpb {r["final_bpb"]:.4f} | {r["step_s"]:.3f} s/step',
        flush=True,
    )
  meta = {
      'corpus': corpus,
      'steps': steps,
      'eval_every': eval_every,
      'seeds': grid,
      'command': command,
      'tiny': tiny,
  }
  write_outputs(out_dir, runs, meta)
  return runs


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save and restore at INFO.
  try:
    seeds = [int(s) for s in _SEEDS.value]
  except ValueError as e:
    raise UserError(
        f'--seeds={",".join(_SEEDS.value)} must be a comma-separated list of integers.'
    ) from e
  command = 'python -m tokjax.lab.estimator_training ' + ' '.join(sys.argv[1:])
  run_grid(
      _CORPUS.value,
      _STEPS.value,
      _EVAL_EVERY.value,
      seeds,
      _VARIANTS.value,
      _OUT.value,
      _TINY.value,
      command,
  )
  print(f'wrote {_OUT.value}/results.md, results.json, curves.png')


if __name__ == '__main__':
  cli.run(main)
