r"""Score a tokjax checkpoint on lm-evaluation-harness tasks (see `tokjax.lm_eval`).

  python -m tokjax.lm_eval --checkpoint RUN_OR_CKPT --tasks arc_easy,piqa,hellaswag,lambada_openai
      [--limit N] [--boundaries greedy|sample] [--draws K] [--batch_size N] [--out FILE.json]
      [--include_path DIR]

Prints lm-eval's results table with cont_bpb (the per-sample bits-per-byte of the correct
continuation, mean +- s.e.) among the metrics, and writes it with the per-sample values to --out
(default RUN/lm_eval.json). Scores and boundaries: `tokjax.lm_eval.tasks`, `tokjax.lm_eval.scoring`.
Needs the optional extra: pip install -e '.[eval]'.
"""

import json
import logging
import os

from absl import flags

from tokjax import cli, paths
from tokjax.errors import UserError


def define_flags():
  flags.DEFINE_string('checkpoint', None, 'Run folder of a training run (its workdir).')
  flags.DEFINE_integer(
      'step', None, 'Checkpoint step that must load (default: the latest).', lower_bound=0
  )
  flags.DEFINE_string('tasks', None, 'Comma-separated lm-eval task or group names.')
  flags.DEFINE_float('limit', None, 'Score at most this many samples per task (< 1: a fraction).')
  flags.DEFINE_string('boundaries', 'greedy', 'Boundary decisions: greedy or sample.')
  flags.DEFINE_integer(
      'draws', None, 'With --boundaries=sample: boundary draws K per text.', lower_bound=1
  )
  flags.DEFINE_integer('batch_size', 8, 'Rows (windows) per forward pass.', lower_bound=1)
  flags.DEFINE_integer(
      'overlap',
      None,
      'Context bytes of each rolling window after the first (default seq_len // 2).',
      lower_bound=0,
  )
  flags.DEFINE_string('out', None, 'JSON file of the results (default RUN/lm_eval.json).')
  flags.DEFINE_string('include_path', None, "Folder(s) of extra task YAML files, joined by ':'.")
  flags.DEFINE_integer(
      'seed', 0, 'Key of the boundary and byte draws, and lm-eval seeds.', lower_bound=0
  )


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.checkpoint:
    raise UserError('--checkpoint is required: pass the run folder of a training run.')
  names = [t.strip() for t in (f.tasks or '').split(',') if t.strip()]
  if not names:
    raise UserError('--tasks is required: comma-separated lm-eval task names, e.g. arc_easy,piqa.')
  if f.boundaries not in ('greedy', 'sample'):
    raise UserError(f'--boundaries={f.boundaries!r} is not valid; use greedy or sample.')
  if f.draws is not None and f.boundaries != 'sample':
    raise UserError(
        '--draws needs --boundaries=sample: greedy boundaries are one deterministic draw.'
    )
  if f.limit is not None and f.limit <= 0:
    raise UserError(f'--limit={f.limit} must be positive.')
  for folder in (f.include_path or '').split(':'):
    if folder and not os.path.isdir(folder):
      raise UserError(
          f'--include_path {folder} is not a folder; pass the folder(s) of your task YAML files, '
          "joined by ':'."
      )
  # Before the tasks and the checkpoint load: a place that cannot be written costs one line.
  out = os.fspath(paths.join(f.checkpoint, 'lm_eval.json') if f.out is None else f.out)
  paths.check_writable(out, '--out')
  from tokjax import lm_eval as pkg  # pylint: disable=g-import-not-at-top

  pkg.require_lm_eval()
  if not f['verbosity'].present:  # lm-eval warns about every locally defined task.
    logging.getLogger('lm_eval').setLevel(logging.ERROR)
  from tokjax.lm_eval import model, tasks  # pylint: disable=g-import-not-at-top

  manager = tasks.task_manager(f.include_path)
  tasks.check_tasks(manager, names)  # Before the checkpoint loads and compiles.
  lm = model.TokjaxLM(
      checkpoint=f.checkpoint,
      step=f.step,
      boundaries=f.boundaries,
      draws=f.draws or 1,
      overlap=f.overlap,
      seed=f.seed,
      batch_size=f.batch_size,
  )
  limit = None if f.limit is None else (int(f.limit) if f.limit >= 1 else f.limit)
  report = tasks.evaluate(lm, names, manager, limit=limit, seed=f.seed)
  report['tokjax'] = {
      'checkpoint': paths.absolute(f.checkpoint),
      'step': lm.ckpt.step,
      'boundaries': f.boundaries,
      'draws': f.draws or 1,
      'batch_size': f.batch_size,
      'seq_len': lm.seq_len,
      'overlap': lm.scorer.overlap,
      'limit': f.limit,
  }
  print(tasks.table(report))
  paths.resolve(out).parent.mkdir(parents=True, exist_ok=True)
  paths.write_text(out, json.dumps(report, indent=1, default=str))
  print('wrote', out)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
