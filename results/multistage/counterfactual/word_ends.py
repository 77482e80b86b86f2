"""Precision and recall of every level's chunk ends at whitespace bytes and at word ends (a
non-whitespace byte followed by whitespace), from a `python -m tokjax.segment` PREFIX.json.

  python word_ends.py PREFIX.json

A stage-1 end is a stage-0 end, so stage 1's chance precision is stage 0's.
"""

import json
import sys


def main(path):
  with open(path) as f:
    d = json.load(f)
  with open(d['file'], 'rb') as f:
    text = f.read()
  n = len(text)
  ws = [c in b' \t\n\r' for c in text]
  word_end = [i + 1 < n and ws[i + 1] and not ws[i] for i in range(n)]
  for s, offsets in enumerate(d['offsets_by_level']):
    ends = {e - 1 for _, e in offsets}
    for name, ref in (('whitespace', ws), ('word_end', word_end)):
      hit = sum(ref[i] for i in ends)
      print(
          f'stage {s}: {name} precision {hit / len(ends):.3f} recall {hit / sum(ref):.3f} '
          f'({len(ends)} ends, {n} bytes)'
      )


if __name__ == '__main__':
  main(sys.argv[1])
