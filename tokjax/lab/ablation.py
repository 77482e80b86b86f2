r"""The paper's ablation table at a budget a CPU affords: the policy trained with one part changed.

  python -m tokjax.lab.ablation --seeds 0,1,2 --jobs 2 --out results/ablation

Every variant is the proxy's policy run (configs/proxy.py: configs/compare.py:policy on Shakespeare,
4e6 training bytes, lr 8e-3, the ladder's run field for field) with one change (`VARIANTS`): the
discount gamma = 1, no batch-relative advantage (raw returns), no early-exit reward (reward -CE_full),
no rate loss, and the window apart from the logit's form (tokjax/models/boundaries.py): the proxy's
policy is w = 1 with the plain logit v + b; 'w8' is w = 8 with that logit (the window alone),
'w1_scaled' w = 1 with w = 8's scale 1/16 and soft cap (the parametrisation alone) and 'w8_scaled'
both (the paper's sequential policy, what 'w8' was before the split). Runs are ladder runs
(tokjax/lab/ladder.py: the same scheduler, resume, --jobs and packing), scored on the test split with
sampled and greedy boundaries; each variant is paired against 'full' on the same test windows with
the window, clustered and seed errors, and judged by `significance.judge`, Holm-adjusted over the
table's variants (one family, `significance.FAMILY`).
--variants NAME:FIELD=VALUE adds a variant of your own; --budget, --lr, --corpus, --seq_len,
--batch_size and --set FIELD=VALUE move the whole table (the main job: `--corpus stdlib_docs
--budget 2457600 --lr 2e-3`).

OUT gets results.json (every number of the table), README-ready markdown on stdout with the paper's
numbers beside tokjax's, and ablation.png: validation whitespace recall over training per variant
(greedy solid, sampled dashed; mean over seeds).
"""

import math
import os
import sys

from absl import flags
import numpy as np

from tokjax import cli, significance
from tokjax.errors import UserError
from tokjax.lab import common, ladder, ladder_report

# name -> config fields that differ from the full method (ladder override syntax).
VARIANTS = {
    'full': (),
    'gamma1': ('estimator.gamma=1.0',),
    'no_batch_relative': ('estimator.baseline=none',),
    'no_early_exit': ('estimator.reward=plain',),
    # The window alone: w = 8 with w = 1's plain logit (no scale, no soft cap).
    'w8': ('boundary.policy.window=8', 'boundary.policy.form=plain'),
    # Window and parametrisation: 'auto' at w = 8 is the scaled, softcapped logit (the paper's
    # policy). The same overrides as the runs of 'w8' before the split, so they are its runs.
    'w8_scaled': ('boundary.policy.window=8',),
    # The parametrisation alone: w = 1 with w = 8's scale and soft cap.
    'w1_scaled': ('boundary.policy.form=scaled',),
    # Nothing holds the rate down: room for a chunk per byte (the trainer refuses less).
    'no_rate_loss': ('estimator.rate_loss=false', 'model.capacity=256'),
}
REFERENCE = 'full'
# The paper's ablation table (40M parameters on FineWeb; its full method is the sequential w = 8
# policy, so its 'w = 1' row is tokjax's 'full' and its 'full' row is tokjax's 'w8_scaled'; the
# one-factor variants 'w8' and 'w1_scaled' have no row there).
PAPER = {
    'full': {'bpb': 1.548, 'whitespace_recall': 0.99, 'row': 'full (w = 8)'},
    'gamma1': {'bpb': 1.542, 'whitespace_recall': 0.41, 'row': 'gamma = 1'},
    'no_batch_relative': {'bpb': 1.543, 'whitespace_recall': 0.99, 'row': 'no batch-relative'},
    'no_early_exit': {'bpb': 1.562, 'whitespace_recall': 0.72, 'row': 'no early-exit reward'},
    'w1': {'bpb': 1.51, 'whitespace_recall': 0.99, 'row': 'w = 1'},
    'no_rate_loss': {'bpb': 1.39, 'rate': 1.0, 'row': 'no rate loss'},
}
# tokjax's variant -> the paper's row it corresponds to.
PAPER_ROW = {'full': 'w1', 'w8_scaled': 'full'}
# What a row keeps of its `ladder_report.paired_over_seeds`.
PAIRED_KEYS = (
    'diff',
    'se',
    'clustered_se',
    'clusters',
    'seed_se',
    'combined_se',
    'df',
    'p',
    'p_holm',
    'family',
    'family_size',
    'verdict',
)
# Greedy whitespace recall at the last evaluation that counts as "learned words".
WORDS_FOUND = 0.9


def plan(
    variants: dict,
    seeds,
    budget: float,
    lr: float,
    corpus: str,
    tiny: bool,
    seq_len: int | None = None,
    batch_size: int | None = None,
) -> dict:
  """{variant: [ladder.Run per seed]}: the policy run with each variant's overrides, at seq_len
  bytes and batch_size sequences per step (None: the config's)."""
  seq_len = seq_len or common.compare_config('policy', corpus, tiny=tiny).data.seq_len
  batch = ladder.run_batch(batch_size, corpus, tiny)
  return {
      name: [
          ladder.Run(
              'policy',
              float(budget),
              int(s),
              int(seq_len),
              float(lr),
              tuple(o),
              corpus,
              tiny,
              batch,
          )
          for s in seeds
      ]
      for name, o in variants.items()
  }


def summarize(results: dict, reference: str = REFERENCE) -> list[dict]:
  """One row per variant with finished runs. results: {variant: [ladder result.json, ...]} (read by
  `ladder.load_results`). Means over the seeds the variant shares with the reference (all of its
  own seeds for the reference), with the seed standard error of test bpb and the paired difference
  to the reference (`ladder_report.paired_over_seeds`), every variant's judged by its p
  Holm-adjusted over the table's variants (`significance.judge_family`)."""
  ref = results.get(reference, [])
  ref_seeds = {r['run']['seed'] for r in ref}
  rows = []
  for name, rs in results.items():
    if name != reference:
      rs = [r for r in rs if r['run']['seed'] in ref_seeds]
    if not rs:
      continue
    bpb = [r['test']['bpb'] for r in rs]
    greedy = [r['test_greedy'] for r in rs if 'test_greedy' in r]
    last = [r['curve'][-1] for r in rs if r.get('curve')]
    row = {
        'variant': name,
        'overrides': list(rs[0]['run']['overrides']),
        'seeds': sorted(r['run']['seed'] for r in rs),
        'test_bpb': float(np.mean(bpb)),
        'test_bpb_seed_se': float(np.std(bpb, ddof=1) / math.sqrt(len(bpb)))
        if len(bpb) > 1
        else None,
        'rate': float(np.mean([r['test']['rate'] for r in rs])),
        'whitespace_recall': float(np.mean([r['test']['whitespace_recall'] for r in rs])),
        'greedy_whitespace_recall': float(np.mean([g['whitespace_recall'] for g in greedy]))
        if greedy
        else None,
        'greedy_rate': float(np.mean([g['rate'] for g in greedy])) if greedy else None,
        # Seeds whose greedy boundaries fall on WORDS_FOUND of the val spaces at the last evaluation.
        'words_found': sum(c.get('greedy_whitespace_recall', 0.0) >= WORDS_FOUND for c in last),
        'per_seed': {
            r['run']['seed']: {
                'test_bpb': r['test']['bpb'],
                'rate': r['test']['rate'],
                'whitespace_recall': r['test']['whitespace_recall'],
                'greedy_whitespace_recall': r.get('test_greedy', {}).get('whitespace_recall'),
                'last_val_greedy_whitespace_recall': (r.get('curve') or [{}])[-1].get(
                    'greedy_whitespace_recall'
                ),
            }
            for r in rs
        },
        'curve': _mean_curve(rs),
    }
    if name != reference and ref:
      row['paired'] = ladder_report.paired_over_seeds(rs, ref, 'test')
    rows.append(row)
  paired = [r for r in rows if 'paired' in r]
  if paired:
    run = ref[0]['run']
    family = ladder_report.family_name('test', run['budget'], run['seq_len'], run['corpus'])
    judged = significance.judge_family([r['paired'] for r in paired], family)
    for r, p in zip(paired, judged):
      r['paired'] = {k: p[k] for k in PAIRED_KEYS}
  return rows


def _mean_curve(rs) -> list[dict]:
  """The runs' validation curves averaged over seeds, step by step (steps all runs have)."""
  curves = [r['curve'] for r in rs if r.get('curve')]
  if not curves:
    return []
  steps = sorted(set.intersection(*({c['step'] for c in curve} for curve in curves)))
  out = []
  for step in steps:
    at = [next(c for c in curve if c['step'] == step) for curve in curves]
    keys = set.intersection(*(set(c) for c in at)) - {'step'}
    out.append({'step': step} | {k: float(np.mean([c[k] for c in at])) for k in sorted(keys)})
  return out


def markdown(rows, meta) -> list[str]:
  """The table: tokjax's variants beside the paper's rows."""
  fmt = common.fmt
  cells = []
  for r in rows:
    paper = PAPER.get(PAPER_ROW.get(r['variant'], r['variant']), {})
    p = r.get('paired')
    diff = ladder_report.paired_cells(p) if p else ' | | | | | | | | '
    seed_se = f" +- {r['test_bpb_seed_se']:.3f}" if r['test_bpb_seed_se'] is not None else ''
    cells.append(
        f"{r['variant']} | {len(r['seeds'])} | {r['test_bpb']:.3f}{seed_se} | {diff} | "
        f"{r['rate']:.3f} | {r['whitespace_recall']:.2f} | {fmt(r['greedy_whitespace_recall'], 2)} | "
        f"{r['words_found']}/{len(r['seeds'])} | {paper.get('row', '-')} | "
        f"{fmt(paper.get('bpb'), 3)} | {fmt(paper.get('whitespace_recall'), 2)}"
    )
  return [
      f"Ablation at {meta['budget']:.3g} training bytes on {meta['corpus']} (lr {meta['lr']:g}); "
      f"test split; means over seeds; difference to {meta['reference']} paired on the same "
      "windows, with its window, clustered (the corpus's independent units) and seed standard "
      f'errors; {significance.RULE}.',
      '',
      *common.table(
          f'variant | seeds | test bpb (+- seed s.e.) | minus full | {ladder_report.PAIRED_HEADER} '
          '| rate | ws recall sampled | ws recall greedy | greedy >= '
          f'{WORDS_FOUND:g} at last eval | paper row | paper bpb | paper ws recall',
          cells,
      ),
  ]


def plot(out_dir, rows, meta) -> None:
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for r in rows:
    c = r['curve']
    if not c:
      continue
    steps = [x['step'] for x in c]
    line = ax.plot(
        steps,
        [x.get('greedy_whitespace_recall', np.nan) for x in c],
        marker='o',
        label=r['variant'],
    )
    ax.plot(
        steps, [x.get('whitespace_recall', np.nan) for x in c], ls='--', color=line[0].get_color()
    )
  ax.set_xlabel('training step')
  ax.set_ylabel('val whitespace recall')
  ax.set_ylim(0, 1.02)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  ax.set_title(
      f"spaces with a boundary, {meta['corpus']}, {meta['budget']:.3g} B "
      '(greedy solid, sampled dashed; seed mean)',
      fontsize=9,
  )
  common.save_figure(fig, os.path.join(out_dir, 'ablation.png'))


def parse_variants(items) -> dict:
  """VARIANTS, or the named ones, plus NAME:FIELD=VALUE items (several for one NAME add up)."""
  chosen: dict[str, tuple[str, ...]] = {}
  extra: dict[str, list[str]] = {}
  for item in items:
    if ':' in item:
      name, field = item.split(':', 1)
      if '=' not in field:
        raise UserError(f'--variants {item!r} must be NAME or NAME:FIELD=VALUE.')
      extra.setdefault(name, []).append(field)
    elif item in VARIANTS:
      chosen[item] = VARIANTS[item]
    else:
      raise UserError(
          f'unknown variant {item!r}; --variants takes some of {",".join(VARIANTS)} or '
          'NAME:FIELD=VALUE.'
      )
  variants = (chosen or ({} if extra else dict(VARIANTS))) | {k: tuple(v) for k, v in extra.items()}
  if REFERENCE not in variants:
    variants = {REFERENCE: VARIANTS[REFERENCE]} | variants
  return variants


def main(argv):
  del argv
  f = flags.FLAGS
  variants = parse_variants(f.variants)
  if f.jobs < 1:
    raise UserError(f'--jobs={f.jobs} must be at least 1.')
  try:
    seeds = [int(s) for s in f.seeds]
  except ValueError:
    raise UserError(f'--seeds takes integers, e.g. 0,1,2 (got {",".join(f.seeds)}).') from None
  for flag in ('seq_len', 'batch_size'):
    if getattr(f, flag) is not None and getattr(f, flag) < 1:
      raise UserError(f'--{flag}={getattr(f, flag)} must be at least 1.')
  variants = {name: tuple(f.set) + tuple(o) for name, o in variants.items()}
  runs = plan(variants, seeds, f.budget, f.lr, f.corpus, f.tiny, f.seq_len, f.batch_size)
  for rs in runs.values():
    if not f.report:
      ladder.check_overrides(rs[0])  # Bad overrides stop here with one line, before any starts.
    ladder.build_config(rs[0])
  base = ladder.build_config(runs[REFERENCE][0])
  ladder.check_corpora([f.corpus], base.data)
  root = f.runs_in or f.out  # Its runs/ holds the run folders.
  os.makedirs(os.path.join(root, 'runs'), exist_ok=True)
  os.makedirs(f.out, exist_ok=True)
  os.environ.setdefault(
      'JAX_COMPILATION_CACHE_DIR', os.path.expanduser('~/.cache/tokjax/xla-ladder')
  )
  scoring = ladder.Scoring(greedy=True)
  # Seed by seed, so that a study stopped early has every variant at the seeds it reached.
  every = [rs[i] for i in range(len(seeds)) for rs in runs.values()]
  failures = 0
  if not f.report:
    failures = ladder.execute(
        root, every, scoring, f.jobs, f.resume, f.progress_s, base.data.batch_size
    )
  results = {name: ladder.load_results(root, rs) for name, rs in runs.items()}
  meta = {
      'corpus': f.corpus,
      'budget': float(f.budget),
      'lr': float(f.lr),
      'seq_len': int(base.data.seq_len),
      'batch_size': int(base.data.batch_size),
      'reference': REFERENCE,
      'command': 'python -m tokjax.lab.ablation '
      + ' '.join(a for a in sys.argv[1:] if a not in ('--report', '--resume')),
      'paper': PAPER,
      'paper_row': PAPER_ROW,
  }
  rows = summarize({k: v for k, v in results.items() if v})
  if rows:
    common.write_json(os.path.join(f.out, 'results.json'), {'meta': meta, 'rows': rows})
    plot(f.out, rows, meta)
    print('\n'.join(markdown(rows, meta)))
    print(f'wrote {f.out}/results.json, ablation.png ({sum(map(len, results.values()))} runs)')
  if failures:
    raise UserError(
        f'{failures} run(s) failed; their train.log says why. Fix and rerun with --resume.'
    )


def define_flags():
  flags.DEFINE_list('variants', [], 'Variants (default: all of VARIANTS), or NAME:FIELD=VALUE.')
  flags.DEFINE_multi_string('set', [], 'FIELD=VALUE config override for every variant.')
  flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of every variant.')
  flags.DEFINE_string('corpus', 'shakespeare', 'Corpus spec (see tokjax/data/corpora.py).')
  flags.DEFINE_float('budget', 4e6, 'Training bytes per run.')
  flags.DEFINE_float('lr', 8e-3, 'Learning rate of every run.')
  flags.DEFINE_integer('seq_len', None, "Bytes per sequence of every run (default: the config's).")
  flags.DEFINE_integer(
      'batch_size', None, "Sequences per step of every run (default: the config's)."
  )
  flags.DEFINE_bool('tiny', False, 'Smoke-test model size (configs/compare.py:policy,tiny).')
  flags.DEFINE_integer('jobs', 1, 'Runs side by side, each pinned to its own core.')
  flags.DEFINE_bool('resume', False, 'Continue unfinished runs from their checkpoints.')
  flags.DEFINE_bool('report', False, 'Only write the table and plot of the runs finished so far.')
  flags.DEFINE_float('progress_s', 60.0, 'Seconds between progress lines.')
  flags.DEFINE_string('out', 'results/ablation', 'Results folder.')
  flags.DEFINE_string(
      'runs_in',
      None,
      "Folder whose runs/ holds the run folders (default: --out), e.g. a ladder's: its policy runs "
      "are the reference's, and the table is written to --out apart from the ladder's.",
  )


if __name__ == '__main__':
  define_flags()
  cli.run(main)
