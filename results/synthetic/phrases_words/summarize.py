"""One row per seed folder of the planted two-level check with the words given: which side of the
phrase end the learned stage 1 took, its stage-1 precision on that side against chance (greedy and
sampled, with the lift's standard error over documents), and its margin over each control on that
side in standard errors (paired over documents).

  python summarize.py seed0 seed1 ...

The side is the one with the larger sampled lift: 'phrase' (at the mark or the space after it) or
'before' (at the space before the phrase's last word).
"""

import json
import os
import sys

KEYS = {
    'phrase': ('phrase_precision1', 'phrase_precision0', 'lift'),
    'before': (
        'before_precision1',
        'before_precision0',
        'before_lift',
    ),
}


def cell(m, side):
  prec, chance, lift = KEYS[side]
  if m[prec] != m[prec]:  # NaN: no stage-1 end but the forced ones.
    return 'no ends'
  return f'{m[prec]:.3f} vs {m[chance]:.3f} ({m[lift]:+.3f} +- {m[lift + "_se"]:.3f})'


def row(d):
  data = json.load(open(os.path.join(d, 'results.json')))
  last = {name: r['curve'][-1] for name, r in data['runs'].items()}
  sample = last['learned']['sample']
  side = max(KEYS, key=lambda s: sample[KEYS[s][2]])
  z = {
      (c['vs'], c['mode']): c['z']
      for c in data['comparisons']
      if c.get('what', c.get('side')) == side
  }
  margins = ' | '.join(
      f'{z[(vs, mode)]:.1f}' if z[(vs, mode)] == z[(vs, mode)] else '-'
      for vs in ('no_rl', 'uniform')
      for mode in ('greedy', 'sample')
  )
  bpb = ' / '.join(f'{last[n]["sample"]["bpb"]:.3f}' for n in ('learned', 'no_rl', 'uniform'))
  return (
      f'| {data["meta"]["seed"]} | {side} | {cell(last["learned"]["greedy"], side)} | '
      f'{cell(sample, side)} | {margins} | {bpb} |'
  )


print(
    '| seed | side | greedy prec1 vs chance (lift +- s.e.) | sampled prec1 vs chance (lift +- s.e.) '
    '| margin / s.e.: no_rl greedy | no_rl sampled | uniform greedy | uniform sampled '
    '| sampled bpb: learned / no_rl / uniform |'
)
print('|---|---|---|---|---|---|---|---|---|')
for d in sys.argv[1:]:
  print(row(d))
