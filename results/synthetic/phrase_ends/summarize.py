"""One row per seed folder of the planted two-level check: where the learned stage 1 ends its chunks
(its boundary probability at phrase ends closed by ',' and by '.', and at the other stage-0 ends),
its precision at phrase ends against chance (greedy and sampled), its margin over each control at
phrase ends in standard errors, and bits-per-byte, learned minus each control (sampled boundaries),
all paired over the same held-out documents.

  python summarize.py DIR/seed0 DIR/seed1 ...
"""

import json
import os
import sys


def f(x, d=3):
  return '-' if x is None or x != x else f'{x:.{d}f}'


def row(folder):
  data = json.load(open(os.path.join(folder, 'results.json')))
  last = {name: r['curve'][-1] for name, r in data['runs'].items()}
  p = data['runs']['learned']['stage1_probs']
  cmp = {(c['what'], c['vs'], c['mode']): c for c in data['comparisons']}

  def prec(mode):
    m = last['learned'][mode]
    return f'{f(m["phrase_precision1"])} vs {f(m["phrase_precision0"])}'

  def z(what, vs, mode):
    c = cmp.get((what, vs, mode))
    return '-' if c is None or c['z'] != c['z'] else f'{c["z"]:+.1f}'

  def bpb(vs):
    c = cmp[('bpb', vs, 'sample')]
    return f'{c["diff"]:+.4f} +- {c["se"]:.4f}'

  probs = ' / '.join(f(p.get(f'p1_{k}'), 2) for k in (',', '.', 'other'))
  word0 = last['learned']['sample']['word_precision0']
  return (
      f'| {data["meta"]["seed"]} | {f(word0, 2)} | {probs} | {prec("greedy")} | {prec("sample")} | '
      f'{z("phrase", "uniform", "greedy")} / {z("phrase", "uniform", "sample")} | '
      f'{z("phrase", "no_rl", "sample")} | {bpb("uniform")} | {bpb("no_rl")} |'
  )


print(
    "| seed | stage-0 ends at spaces | p1 at ',' / '.' / elsewhere | prec1 vs chance, greedy | "
    'sampled | margin / s.e. over uniform, greedy / sampled | over no_rl, sampled | '
    'bpb learned - uniform | learned - no_rl |'
)
print('|---|---|---|---|---|---|---|---|---|')
for d in sys.argv[1:]:
  print(row(d))
