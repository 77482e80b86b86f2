"""The sides table of README.md from training logs: python summarize.py LOG...

For each log, the training batch's sampled whitespace recall (`ws`) and word-end recall (`word-end`:
chunk ends on a word's last byte before a gap) at steps 100, 250 and 500 (where logged), and the
side at the last of those steps: 'space' when ws is larger by 0.1 or more, 'word' when word-end is,
'undecided' otherwise.
"""

import re
import sys

STEPS = (100, 250, 500)


def recalls(path):
  out = {}
  for line in open(path):
    m = re.match(r'step\s+(\d+)/\d+ .* ws ([\d.]+) word-end ([\d.]+)', line)
    if m and int(m.group(1)) in STEPS:
      out[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
  return out


def main(paths):
  print('| log | ' + ' | '.join(f'ws / word-end at {s}' for s in STEPS) + ' | side |')
  print('|---|' + '---|' * (len(STEPS) + 1))
  for p in paths:
    r = recalls(p)
    cells = [f'{r[s][0]:.2f} / {r[s][1]:.2f}' if s in r else '-' for s in STEPS]
    ws, word_end = r[max(r)]
    side = 'space' if ws >= word_end + 0.1 else 'word' if word_end >= ws + 0.1 else 'undecided'
    print(f'| {p} | ' + ' | '.join(cells) + f' | {side} |')


if __name__ == '__main__':
  main(sys.argv[1:])
