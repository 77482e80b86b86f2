"""The budget ladder's statistics and report: finished runs' result.json in, tables and plot out.

Every row is a (budget, seq_len, method, lr) over the seeds it shares with the reference method at
its best lr (`summarize`): the test and val means, the out-of-domain means and the paired difference
all use that one matched seed set. A paired difference (`paired_over_seeds`) carries three errors:
over windows (`se`), over the corpus's independent units (`clustered_se`: the window differences
summed per cluster, `tokjax.data.corpora.document_clusters`: a play or poem of Shakespeare, a source
file of stdlib) and over seeds (`seed_se`); it is judged by `significance.judge` (the clustered and
seed errors in quadrature, a t-test with Welch-Satterthwaite df), Holm-adjusted over its family
(`holm_families`, `significance.FAMILY`), and the paper's ordering by that rule (`trend`). A learning rate is picked on val over the seeds that all of a method's rates share.
"""

import math
import os

import numpy as np

from tokjax import significance
from tokjax.data import baselines, corpora
from tokjax.errors import UserError
from tokjax.lab import common
from tokjax.models import registry

# The ordering of the paper's table: the reference at or below these (not found worse) ...
PAPER_AT_OR_BELOW = ('bpe',)
# ... and below these by a found paired difference.
PAPER_BELOW = ('hnet', 'uniform')
# What `trend` keeps of each paired difference.
TREND_KEYS = ('diff', 'combined_se', 'df', 'p', 'p_holm', 'family', 'verdict')
RATE_TOLERANCE = (
    0.02  # A chunked method's realised rate counts as matched within this of the target.
)


def _key(r):
  s = r['run']
  return (s['budget'], s['seq_len'], s['method'], s['lr'])


def _seeds(rs) -> set:
  return {r['run']['seed'] for r in rs}


def _split(r, split):
  return r[split] if split in ('val', 'test') else r['cross'][split]


def best_lr_of(groups: dict) -> float:
  """The lr with the lowest mean val bpb over the seeds that every lr of `groups` ({lr: results})
  has; UserError when they share none."""
  common_seeds = set.intersection(*(_seeds(rs) for rs in groups.values()))
  if not common_seeds:
    first = next(iter(groups.values()))[0]['run']
    raise UserError(
        f'the learning rates of {first["method"]} at {first["budget"]:g} bytes share no seed '
        f'({ {lr: sorted(_seeds(rs)) for lr, rs in groups.items()} }); train one seed at every lr.'
    )
  val = lambda rs: np.mean([r['val']['bpb'] for r in rs if r['run']['seed'] in common_seeds])
  return min(groups, key=lambda lr: val(groups[lr]))


def summarize(results, reference: str) -> list[dict]:
  """One row per (budget, seq_len, method, lr): means over the seeds the row shares with the
  reference at its best lr on val (all its seeds for the reference and where the reference is
  missing), and the paired difference to that reference (`paired_over_seeds`) on test and on each
  corpus scored out of domain, each judged within its family (`holm_families`). 'best_lr': whether
  the row's lr is its method's best on val there."""
  groups: dict[tuple, list[dict]] = {}
  for r in results:
    groups.setdefault(_key(r), []).append(r)
  best = {}  # (budget, seq_len, method) -> lr
  for b, L, m in {k[:3] for k in groups}:
    best[(b, L, m)] = best_lr_of({k[3]: rs for k, rs in groups.items() if k[:3] == (b, L, m)})
  rows = []
  for (b, L, m, lr), rs in groups.items():
    ref = groups.get((b, L, reference, best.get((b, L, reference))))
    paired = ref is not None and m != reference
    if paired:
      assert ref is not None  # paired says so.
      matched = _seeds(rs) & _seeds(ref)
      if not matched:
        raise UserError(
            f'{m} at {b:g} bytes (lr {lr:g}) has seeds {sorted(_seeds(rs))} and {reference} '
            f'{sorted(_seeds(ref))}: no seed to pair; train {m} or {reference} at a seed of the other.'
        )
      rs = [r for r in rs if r['run']['seed'] in matched]
      ref = [r for r in ref if r['run']['seed'] in matched]
    rs = sorted(rs, key=lambda r: r['run']['seed'])
    test = [r['test']['bpb'] for r in rs]
    row = {
        'budget': b,
        'seq_len': L,
        'method': m,
        'lr': lr,
        'best_lr': best[(b, L, m)] == lr,
        'seeds': [r['run']['seed'] for r in rs],
        'params': rs[0]['params'],
        'test_bpb': float(np.mean(test)),
        'test_bpb_se': float(np.mean([r['test']['bpb_se'] for r in rs])),
        'seed_sd': float(np.std(test, ddof=1)) if len(rs) > 1 else None,
        'val_bpb': float(np.mean([r['val']['bpb'] for r in rs])),
        'rate': _mean(r['test'].get('rate') for r in rs),
        'train_rate': _mean(r.get('train_rate') for r in rs),
        'whitespace_recall': _mean(r['test'].get('whitespace_recall') for r in rs),
        'whitespace_precision': _mean(r['test'].get('whitespace_precision') for r in rs),
        'train_flops': float(np.mean([r['train_flops'] for r in rs])),
        'train_bytes': rs[0]['train_bytes'],
        'bytes_per_s': float(np.mean([r['train_bytes_per_s'] for r in rs])),
    }
    if paired:
      row['paired'] = paired_over_seeds(rs, ref, 'test')
    # Out of domain over the row's seeds that were scored there (runs trained before --cross were
    # not), paired over the seeds both sides have; 'cross_seeds' names them.
    row['cross_bpb'], row['cross_seeds'], row['cross_paired'] = {}, {}, {}
    for c in sorted({c for x in rs for c in x.get('cross', {})}):
      scored = [x for x in rs if c in x.get('cross', {})]
      row['cross_bpb'][c] = float(np.mean([x['cross'][c]['bpb'] for x in scored]))
      row.setdefault('cross_rate', {})[c] = _mean(x['cross'][c].get('rate') for x in scored)
      row['cross_seeds'][c] = [x['run']['seed'] for x in scored]
      if paired:
        assert ref is not None  # paired says so.
        ref_scored = [x for x in ref if c in x.get('cross', {})]
        if _seeds(scored) & _seeds(ref_scored):
          row['cross_paired'][c] = paired_over_seeds(scored, ref_scored, c)
    rows.append(row)
  holm_families(rows, results[0]['run']['corpus'] if results else '')
  return sorted(rows, key=lambda r: (r['budget'], r['seq_len'], r['test_bpb']))


ORACLE = 'oracle (sees the future)'


def sees_the_future(method: str) -> bool:
  """Whether `method`'s boundaries read bytes after their position (its registry entry's
  `lookahead`): its bpb is a likelihood given side information, never ranked with byte LMs."""
  found = registry.methods().get(method)
  return bool(found and found.lookahead)


def family_name(split: str, budget: float, seq_len: int, corpus: str) -> str:
  """The name of a family of comparisons (`significance.FAMILY`): 'shakespeare test, 4e+06 B,
  L 256' in domain, 'stdlib out of domain, ...' for a corpus scored out of domain."""
  where = f'{corpus} test' if split == 'test' else f'{split} out of domain'
  return f'{where}, {budget:.3g} B, L {seq_len}'


def holm_families(rows, corpus: str) -> None:
  """Judges every paired difference of `summarize`'s rows within its family (in place): per
  (budget, seq_len) cell, the test comparisons of each method at its best lr with the reference
  are one family, and those on each corpus scored out of domain one more. A row at another lr is
  adjusted in its cell's family with itself standing for its method, so that each table of the
  lr sweep adjusts over the same number of comparisons as the one of best lrs."""
  cells: dict[tuple, list[dict]] = {}
  for r in rows:
    cells.setdefault((r['budget'], r['seq_len']), []).append(r)
  judged = []  # (record, its judgement), applied once every family is worked out.
  for (b, L), cell in cells.items():
    best = {r['method']: r for r in cell if r['best_lr'] and not sees_the_future(r['method'])}
    records = lambda r: [('test', r.get('paired'))] + list(r.get('cross_paired', {}).items())
    for r in cell:
      for split, rec in records(r):
        if not rec:
          continue
        if sees_the_future(r['method']):  # A likelihood given later bytes: no byte LM to rank.
          judged.append((rec, {'p_holm': None, 'family': None, 'verdict': ORACLE}))
          continue
        family = [rec] + [dict(records(o)).get(split) for m, o in best.items() if m != r['method']]
        family = [x for x in family if x]
        name = family_name(split, b, L, corpus)
        judged.append((rec, significance.judge_family(family, name)[0]))
  for rec, j in judged:
    rec.update(j)


def _mean(xs):
  xs = [x for x in xs if x is not None]
  return float(np.mean(xs)) if xs else None


def paired_over_seeds(runs_a, runs_b, split) -> dict:
  """a - b on the same units of `split` ('val', 'test' or a corpus scored out of domain), over the
  seeds both have: per-unit CE averaged over those seeds, then `significance.paired_difference` with
  each unit's cluster (the split's 'unit_clusters', `with_documents`). 'seed_se': the s.e. of the
  per-seed differences (None with one seed); 'combined_se', 'df', 't', 'p' and 'verdict':
  `significance.judge` of the difference. UserError when no seed of a is one of b's."""
  by_seed_b = {r['run']['seed']: r for r in runs_b}
  pairs = [(a, by_seed_b[a['run']['seed']]) for a in runs_a if a['run']['seed'] in by_seed_b]
  if not pairs:
    ma, mb = runs_a[0]['run']['method'], runs_b[0]['run']['method']
    raise UserError(
        f'{ma} (seeds {sorted(_seeds(runs_a))}) and {mb} (seeds {sorted(_seeds(runs_b))}) share no '
        'seed: a paired difference needs the same seed on both sides.'
    )
  first = _split(pairs[0][0], split)
  if 'unit_clusters' not in first:
    raise ValueError(f'{split} results without unit_clusters: read them with ladder.load_results')
  ce_a = np.mean([_split(a, split)['unit_ce'] for a, _ in pairs], axis=0)
  ce_b = np.mean([_split(b, split)['unit_ce'] for _, b in pairs], axis=0)
  out = significance.paired_difference(ce_a, ce_b, first['unit_bytes'], first['unit_clusters'])
  per_seed = [_split(a, split)['bpb'] - _split(b, split)['bpb'] for a, b in pairs]
  out['seeds'] = [a['run']['seed'] for a, _ in pairs]
  out['seed_se'] = (
      float(np.std(per_seed, ddof=1) / math.sqrt(len(pairs))) if len(pairs) > 1 else None
  )
  return out | significance.judge(
      out['diff'], out['clustered_se'], out['clusters'], out['seed_se'], len(pairs)
  )


def ordering(ds: dict) -> str:
  """Whether the paper's ordering holds at a rung by the seed rule. ds: {method: `paired_over_seeds`
  of method minus the reference}. 'holds': the reference is found better than every PAPER_BELOW and
  not found worse than any PAPER_AT_OR_BELOW; 'does not hold': one of those fails with every error
  known, or a PAPER_BELOW is not even beyond its clustered errors; 'one seed': it would hold, or
  fail, only by clustered errors that a single seed leaves without its seed error; 'not all run'."""
  if any(m not in ds for m in PAPER_AT_OR_BELOW + PAPER_BELOW):
    return 'not all run'
  below = [ds[m]['verdict'] if ds[m]['diff'] > 0 else 'not found' for m in PAPER_BELOW]
  worse = [ds[m]['verdict'] if ds[m]['diff'] < 0 else 'not found' for m in PAPER_AT_OR_BELOW]
  if 'found' in worse or 'not found' in below:
    return 'does not hold'
  if all(v == 'found' for v in below) and all(v == 'not found' for v in worse):
    return 'holds'
  return 'one seed'


def trend(rows, reference: str) -> dict:
  """How each method's paired difference to the reference moves with the budget.

  rows: `summarize`'s; the best lr of each (method, budget, seq_len) is kept. Per seq_len: 'rungs':
  {budget: {method: {'diff', 'combined_se', 'df', 'p', 'verdict'} of its `paired_over_seeds`}},
  'ordering': {budget: `ordering`}, and 'fits':
  {method: (slope, crossing)} for methods at >= 2 budgets: the least-squares slope of the difference
  per 4x budget, and the budget at which that line reaches 0 beyond the top rung (None if it moves
  away from 0). A straight line in log budget through a few rungs is an extrapolation, not a
  prediction.
  """
  out = {}
  for L in sorted({r['seq_len'] for r in rows}):
    best = [r for r in rows if r['seq_len'] == L and r.get('paired') and r['best_lr']]
    pairs: dict[float, dict[str, dict]] = {}
    for r in best:
      pairs.setdefault(r['budget'], {})[r['method']] = r['paired']
    rungs = {
        b: {m: {k: p[k] for k in TREND_KEYS} for m, p in ds.items()} for b, ds in pairs.items()
    }
    fits = {}
    for m in sorted({m for ds in rungs.values() for m in ds}):
      pts = sorted((b, ds[m]['diff']) for b, ds in rungs.items() if m in ds)
      if len(pts) < 2:
        continue
      x = np.log([b for b, _ in pts]) / math.log(4.0)
      y = np.array([d for _, d in pts])
      slope, intercept = np.polyfit(x, y, 1)
      top_d = pts[-1][1]
      crossing = None
      if slope != 0 and top_d * slope < 0:  # Moving towards 0 from the top rung.
        crossing = float(4.0 ** (-intercept / slope))
      fits[m] = (float(slope), crossing)
    out[L] = {
        'rungs': rungs,
        'ordering': {b: ordering(ds) for b, ds in pairs.items()},
        'fits': fits,
    }
  return out


def rule_text(ref: str) -> str:
  """The rule and the paired errors, as the report states them."""
  return (
      f'"paired" is the method minus `{ref}` on the same units (windows of each document; per-unit '
      'CE averaged over the seeds both have) with three standard errors: over windows ("window"), '
      'over the corpus\'s independent units ("clustered": the window differences summed per play '
      'or poem of Shakespeare, per source file of stdlib, per module or pydoc topic of '
      'stdlib_docs; ratio estimator) and over the per-seed differences ("seed", two seeds or '
      f'more). "combined" is the clustered and seed s.e. in quadrature. A difference is '
      f'**{significance.RULE}**.'
  )


def _trend_lines(trends, meta) -> list[str]:
  """The report's Trend sections: one per sequence length of `trend`'s output with >= 2 budgets."""
  ref = meta['reference']
  lines = []
  for L, t in trends.items():
    budgets = sorted(t['rungs'])
    methods = sorted({m for ds in t['rungs'].values() for m in ds})
    if len(budgets) < 2:
      continue
    cell = (
        lambda d: f'{d["diff"]:+.4f} +- {d["combined_se"]:.4f}, {p_pair(d)} ({d["verdict"]})'
        if d
        else '-'
    )
    lines += [
        '',
        f'## Trend (L = {L})',
        '',
        f'Paired difference to `{ref}` (method minus {ref}, +- its combined s.e., its raw and '
        'Holm-adjusted p and the verdict by the adjusted one) at each budget, its least-squares slope per 4x budget, and '
        'the budget at which that line reaches 0 (an extrapolation of a straight line in log '
        'budget: "-" where it moves away from 0). '
        f"The paper's ordering ({ref} not found worse than {', '.join(PAPER_AT_OR_BELOW)}, found "
        f'better than {", ".join(PAPER_BELOW)}): '
        + ', '.join(f'{b:.3g}: {o}' for b, o in sorted(t['ordering'].items()))
        + '.',
        '',
        *common.table(
            'method | '
            + ' | '.join(f'{b:.3g} B' for b in budgets)
            + ' | slope / 4x | reaches 0 at',
            (
                f'{m} | '
                + ' | '.join(cell(t['rungs'][b].get(m)) for b in budgets)
                + (
                    f' | {t["fits"][m][0]:+.4f} | '
                    + (f'{t["fits"][m][1]:.2g} B' if t['fits'][m][1] else '-')
                    if m in t['fits']
                    else ' | - | -'
                )
                for m in methods
            ),
        ),
    ]
  return lines


def _rate_cell(rate, meta) -> str:
  """The test rate, marked '(off)' when it misses the target by more than RATE_TOLERANCE."""
  if rate is None or rate >= 0.999:  # The flat model: one position per byte, no chunks.
    return '-'
  off = abs(rate - meta['target_rate']) > RATE_TOLERANCE
  return f'{rate:.3f}' + (' (off)' if off else '')


PAIRED_HEADER = (
    'window s.e. | clustered s.e. | seed s.e. | combined s.e. | df | p | p (Holm) | verdict'
)


def paired_cells(p, digits: int = 4) -> str:
  """'diff | ' and PAIRED_HEADER's cells of a paired difference, each from the value the verdict
  used."""
  fmt = common.fmt
  return (
      f'{p["diff"]:+.{digits}f} | {fmt(p["se"], digits)} | {fmt(p["clustered_se"], digits)} | '
      f'{fmt(p["seed_se"], digits)} | {fmt(p["combined_se"], digits)} | {fmt(p["df"], 1)} | '
      f'{fmt_p(p["p"])} | {fmt_p(p.get("p_holm"))} | {p["verdict"]}'
  )


def fmt_p(p) -> str:
  """`significance.format_p`, '-' where there is none."""
  return '-' if p is None else significance.format_p(p)


def p_pair(p) -> str:
  """'p 0.03, Holm 0.06': a paired difference's raw and Holm-adjusted p."""
  return f'p {fmt_p(p["p"])}, Holm {fmt_p(p.get("p_holm"))}'


def baseline_lines(meta) -> list[str]:
  """The classical models' bpb on the same splits (`ladder.classical_baselines`), one line each,
  where the table's meta has them (tables written before they were added do not)."""
  found = meta.get('baselines') or {}
  return [
      f'Classical baselines, {name}: {baselines.describe(ref)} (PPMd primed with, the n-gram '
      'fitted on, the training split; orders chosen on val).'
      for name, ref in found.items()
  ] + ([''] if found else [])


def write_outputs(out_dir, rows, meta, markdown: bool = True) -> None:
  """results.json, ladder.png and (markdown) results.md."""
  fmt = common.fmt
  ref = meta['reference']
  batch = meta.get('batch_size', 16)  # Tables written before the ladder took --batch_size: 16.
  lines = [
      f'# Budget ladder on `{meta["corpus"]}`',
      '',
      'Command:',
      '',
      f'    {meta["command"]}',
      '',
      f'Model: configs/compare.py (0.86M parameters, batch {batch}; flat: layer count matched). Each '
      f'run trains for budget / ({batch} x seq_len) steps with warmup and cosine over its own steps. '
      'Test bpb '
      f'is pooled over the bytes of the whole test split (boundaries sampled, one key for every run), '
      f'mean over the seeds the row shares with `{ref}` (every column of a row uses those seeds), '
      f'{significance.SE_LABEL}. {rule_text(ref)} Units: {meta["unit_bytes"]}-byte windows. '
      f'"better" is the share of windows on which the method beats `{ref}`. '
      'rate and ws (whitespace recall: share of whitespace bytes that end a chunk) are on test '
      f'("(off)": more than {RATE_TOLERANCE} from the target {meta["target_rate"]}); '
      'train rate is the mean over logged training steps; FLOPs are training FLOPs at that rate. '
      'The lr of each method is picked on val over the seeds all its lrs share.',
      '',
      *baseline_lines(meta),
      *common.table(
          'budget B | L | method | lr | seeds | test bpb +- s.e. | paired vs ref | '
          f'{PAIRED_HEADER} | better | rate | train rate | ws recall | ws prec | train FLOPs',
          (
              f'{r["budget"]:.3g} | {r["seq_len"]} | {r["method"]} | {r["lr"]:g} | '
              f'{",".join(map(str, r["seeds"]))} | {fmt(r["test_bpb"], 3)} +- '
              f'{fmt(r["test_bpb_se"], 3)} | '
              + (
                  f'{paired_cells(p)} | {p["a_better"]:.2f} | '
                  if p
                  else '(ref) | - | - | - | - | - | - | - | - | - | '
              )
              + f'{_rate_cell(r["rate"], meta)} | {fmt(r["train_rate"], 3)} | '
              f'{fmt(r["whitespace_recall"], 3)} | {fmt(r["whitespace_precision"], 3)} | '
              f'{r["train_flops"]:.3g}'
              for r, p in ((r, r.get('paired')) for r in rows)
          ),
      ),
  ]
  cross = sorted({c for r in rows for c in r.get('cross_bpb', {})})
  if cross:

    def cross_bpb(r, c):
      seeds = r.get('cross_seeds', {}).get(c)
      also = f' (seeds {",".join(map(str, seeds))})' if seeds and seeds != r['seeds'] else ''
      rate = r.get('cross_rate', {}).get(c)
      rate = f', rate {rate:.3f}' if rate is not None and rate < 0.999 else ''
      return fmt(r['cross_bpb'].get(c), 3) + rate + also

    def paired(r, c):
      p = r.get('cross_paired', {}).get(c)
      if not p:
        return '(ref)' if r['method'] == ref else '-'
      return f'{p["diff"]:+.4f} +- {p["combined_se"]:.4f}, {p_pair(p)} ({p["verdict"]})'

    lines += [
        '',
        '## Out of domain',
        '',
        'The same checkpoints scored on the test split of other corpora: bpb and chunk rate (over '
        'the seeds '
        "scored there, named where fewer than the row's) and the paired difference to "
        f'`{ref}` over the seeds both were scored at, +- its combined s.e., its raw and '
        'Holm-adjusted p (each corpus its own family) and the verdict by the adjusted one.',
        '',
        *common.table(
            'budget B | L | method | ' + ' | '.join(f'{c} bpb | paired' for c in cross),
            (
                f'{r["budget"]:.3g} | {r["seq_len"]} | {r["method"]} | '
                + ' | '.join(f'{cross_bpb(r, c)} | {paired(r, c)}' for c in cross)
                for r in rows
                if r.get('cross_bpb')
            ),
        ),
    ]
  trends = trend(rows, meta['reference'])
  lines += _trend_lines(trends, meta)
  data = {'meta': meta, 'rows': rows, 'trend': trends}
  if markdown:
    common.write_results(out_dir, data, lines)
  else:
    common.write_json(os.path.join(out_dir, 'results.json'), data)
  _plot(out_dir, rows, meta)


def _plot(out_dir, rows, meta) -> None:
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top

  plt = common.pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
  methods = sorted({r['method'] for r in rows}, key=lambda m: (m != meta['reference'], m))
  seq_lens = sorted({r['seq_len'] for r in rows})
  for m in methods:
    for L in seq_lens:
      rs = sorted(
          [r for r in rows if r['method'] == m and r['seq_len'] == L and r['best_lr']],
          key=lambda r: r['budget'],
      )
      if not rs:
        continue
      label = m if len(seq_lens) == 1 else f'{m} L={L}'
      ls = '-' if L == seq_lens[0] else '--'
      err = [
          math.sqrt(r['test_bpb_se'] ** 2 + (r['seed_sd'] or 0) ** 2 / len(r['seeds'])) for r in rs
      ]
      line = axes[0].errorbar(
          [r['train_bytes'] for r in rs],
          [r['test_bpb'] for r in rs],
          yerr=err,
          marker='o',
          capsize=3,
          label=label,
          ls=ls,
      )
      color = line[0].get_color()
      axes[2].plot(
          [r['train_flops'] for r in rs],
          [r['test_bpb'] for r in rs],
          marker='o',
          color=color,
          ls=ls,
          label=label,
      )
      ps = [r for r in rs if r.get('paired')]
      if ps:
        axes[1].errorbar(
            [r['train_bytes'] for r in ps],
            [r['paired']['diff'] for r in ps],
            yerr=[significance.margin(r['paired']) for r in ps],
            marker='o',
            capsize=3,
            color=color,
            ls=ls,
            label=label,
        )
  axes[1].axhline(0, color='k', lw=0.8)
  for ax, title, xl in zip(
      axes,
      (
          'test bpb (+- s.e.)',
          f'paired difference to {meta["reference"]}\n'
          '(+- t(0.975, df) x combined s.e.: raw p < 0.05 outside 0; verdicts use Holm)',
          'test bpb',
      ),
      ('training bytes', 'training bytes', 'training FLOPs (realised rate)'),
  ):
    ax.set_xscale('log')
    lo, hi = ax.get_xlim()
    # Over a decade the major labels suffice; within one the minor ones are needed.
    if hi > 10 * lo:
      ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(xl)
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('bits per byte')
  axes[0].legend(fontsize=7)
  fig.suptitle(f'budget ladder, {meta["corpus"]}')
  common.save_figure(fig, os.path.join(out_dir, 'ladder.png'))


def with_documents(result: dict, run, splits) -> bool:
  """Adds to each scored split of result (val, test, every corpus scored out of domain) of the
  `ladder.Run` run that lacks them 'unit_documents', the document of each unit, derived as the
  evaluator derives them (`significance.unit_documents`) from the split the run was scored on
  (splits(run, corpus) -> {split: documents}: `ladder._split_cache()`), and 'unit_clusters', the
  corpus's independent unit of each (`corpora.document_clusters` of its document).
  -> whether any was added."""
  todo = [(s, result[s], run.corpus, s) for s in ('val', 'test') if s in result]
  todo += [(c, x, c, 'test') for c, x in result.get('cross', {}).items()]
  added = False
  for name, scored, corpus, split in todo:
    if 'unit_documents' in scored and 'unit_clusters' in scored:
      continue
    split_docs = splits(run, corpus)[split]
    docs = significance.unit_documents(split_docs, result['unit_bytes'])
    known = scored.get('unit_documents')
    if len(docs) != len(scored['unit_ce']) or (known is not None and known != docs.tolist()):
      raise UserError(
          f'{run.name}: {name} has {len(scored["unit_ce"])} units but its split cuts into '
          f'{len(docs)}: the corpus changed since the run was scored; rescore it in a fresh folder.'
      )
    clusters = np.asarray(corpora.document_clusters(corpus, split_docs), np.int64)
    scored['unit_documents'] = [int(d) for d in docs]
    scored['unit_clusters'] = [int(c) for c in clusters[docs]]
    added = True
  return added


def report(out_dir, results, meta, markdown: bool = True, lr_sweep: bool = False) -> None:
  """The outputs of finished runs' results (`ladder.load_results`): results.json, results.md (with
  markdown) and ladder.png (`write_outputs`) and, for a sweep of lrs at one rung, lr.json (each
  method's best lr on val, for later ladders' --lr_table)."""
  rows = summarize(results, meta['reference'])
  write_outputs(out_dir, rows, meta, markdown=markdown)
  if lr_sweep:
    common.write_json(os.path.join(out_dir, 'lr.json'), best_lrs(rows), indent=None)
  wrote = 'results.md, results.json' if markdown else 'results.json'
  print(f'wrote {out_dir}/{wrote}, ladder.png ({len(results)}/{meta["runs"]} runs)')


def best_lrs(rows) -> dict:
  """{method: its best lr on val} over the rows (a sweep at one budget)."""
  return {r['method']: r['lr'] for r in rows if r['best_lr']}
