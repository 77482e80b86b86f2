"""Which side of the space stage 0's chunk ends take, from a `python -m tokjax.segment` PREFIX.json.

  python word_gaps.py PREFIX.json [PREFIX.json ...]

A gap is a run of whitespace between two words. A chunk can close the word before it ("word|
next": the space starts the next chunk, as GPT-2's tokens do) or close the gap itself ("word |next":
the space ends the chunk). Prints, per level, the share of gaps closed on the word side, on the
space side, and on either, and the precision of chunk ends at either kind of position.
"""

import json
import sys

WS = b' \t\n\r'


def main(paths):
  for path in paths:
    with open(path) as f:
      d = json.load(f)
    with open(d['file'], 'rb') as f:
      text = f.read()
    n = len(text)
    ws = [c in WS for c in text]
    # (last byte of the word, last byte of the gap) for every gap between two words.
    gaps, i = [], 0
    while i < n:
      if ws[i] and i > 0 and not ws[i - 1]:
        j = i
        while j + 1 < n and ws[j + 1]:
          j += 1
        if j + 1 < n:
          gaps.append((i - 1, j))
        i = j + 1
      else:
        i += 1
    levels = d['offsets_by_level'] if 'offsets_by_level' in d else [d['offsets']]  # One stage.
    for s, offsets in enumerate(levels):
      ends = {e - 1 for _, e in offsets}
      word = sum(w in ends for w, _ in gaps) / len(gaps)
      space = sum(g in ends for _, g in gaps) / len(gaps)
      either = sum(w in ends or g in ends for w, g in gaps) / len(gaps)
      sides = {p for gap in gaps for p in gap}
      precision = sum(e in sides for e in ends) / len(ends)
      print(
          f'{path} stage {s}: gaps closed on the word side {word:.3f}, on the space side '
          f'{space:.3f}, either {either:.3f}; ends at either side {precision:.3f} '
          f'({len(ends)} ends, {len(gaps)} gaps, {n} bytes)'
      )


if __name__ == '__main__':
  main(sys.argv[1:])
