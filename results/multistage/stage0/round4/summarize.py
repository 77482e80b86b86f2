"""One row per run folder: training whitespace / word-end recall (sampled boundaries of the training
batch, from train.log) at steps 100, 150, 200, 250 and 300, and the side stage 0 has settled on.

  python summarize.py RUN_DIR...

Side: 'space' when whitespace recall at the last logged step is above 0.4 and above word-end recall
("word |next"), 'word' when word-end recall is above whitespace recall ("word| next"), else
'undecided'.
"""

import os
import re
import sys

STEPS = (100, 150, 200, 250, 300)


def row(d):
  got = {}
  for line in open(os.path.join(d, 'train.log')):
    m = re.match(r'step +(\d+)/\d+ .*ws ([\d.]+) word-end ([\d.]+)', line)
    if m:
      got[int(m.group(1))] = (m.group(2), m.group(3))
  ws, we = map(float, got[max(got)])
  side = 'space' if ws > 0.4 and ws > we else ('word' if we > ws else 'undecided')
  cells = ' | '.join(' / '.join(got.get(s, ('-', '-'))) for s in STEPS)
  return f'| {os.path.basename(d.rstrip("/"))} | {cells} | {side} |'


print('| run | ' + ' | '.join(f'step {s}' for s in STEPS) + ' | side |')
print('|---|' + '---|' * (len(STEPS) + 1))
for d in sys.argv[1:]:
  print(row(d))
