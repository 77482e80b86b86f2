"""One row per run folder: val bpb, sampled / greedy whitespace and word-end recall at the last
evaluation, and training whitespace recall at steps 100, 200, 300.

  python summarize.py RUN_DIR...
"""

import json
import os
import sys


def row(d):
  rows = [json.loads(l) for l in open(os.path.join(d, 'metrics.jsonl'))]
  val = [r for r in rows if r['split'] == 'val'][-1]
  train = {r['step']: r for r in rows if r['split'] == 'train'}
  at = lambda s, k: f'{train[s][k]:.2f}' if s in train and k in train[s] else '-'
  return (
      f'| {os.path.basename(d.rstrip("/"))} | {val["step"]} | {val["bpb"]:.3f} +- {val["bpb_se"]:.3f} | '
      f'{val["whitespace_recall"]:.2f} / {val["greedy_whitespace_recall"]:.2f} | '
      f'{val.get("word_end_recall", float("nan")):.2f} / {val.get("greedy_word_end_recall", float("nan")):.2f} | '
      f'{" / ".join(at(s, "whitespace_recall") for s in (100, 200, 300))} |'
  )


print(
    '| run | step | val bpb +- s.e. | ws recall sampled / greedy | word-end recall sampled / greedy | train ws recall at 100 / 200 / 300 |'
)
print('|---|---|---|---|---|---|')
for d in sys.argv[1:]:
  print(row(d))
