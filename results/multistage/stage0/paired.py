"""Paired test bpb of two training runs on the same 2048-byte windows of their corpus's test split.

  python paired.py RUN_A RUN_B

Boundaries are sampled with one key for both (as the budget ladder scores its runs); prints each
run's test bpb and A minus B with its paired standard error (ratio estimator on per-window
differences) and the share of windows on which A is better.
"""

import sys

import jax

from tokjax import checkpointing, evaluation
from tokjax.data import pipeline
from tokjax.lab import common


def main(run_a, run_b):
  stats = []
  for run in (run_a, run_b):
    ckpt = checkpointing.load_checkpoint(run)
    docs = pipeline.load_splits(ckpt.config.data)['test']
    stats.append(common.evaluate_documents(ckpt, docs, jax.random.PRNGKey(1234), 2048))
  a, b = stats
  p = evaluation.paired_difference(a['unit_ce'], b['unit_ce'], a['unit_bytes'])
  print(
      f'test bpb {run_a} {a["bpb"]:.4f}, {run_b} {b["bpb"]:.4f}; A - B {p["diff"]:+.4f} +- '
      f'{p["se"]:.4f} (paired s.e.), A better on {p["a_better"]:.2f} of '
      f'{len(a["unit_ce"])} windows'
  )


if __name__ == '__main__':
  main(*sys.argv[1:3])
