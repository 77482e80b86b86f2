"""Stage 1 of configs/two_stage.py:whitespace against its chance level, per validation document.

  python stage1_lift.py RUN_DIR...   (each a training run's workdir)

Each validation document is scored alone by the run's Evaluator with boundaries sampled as in
training. At unforced positions only (the first and last position of a window always end a chunk at
every level), it counts the stage-0 and stage-1 chunk ends that sit on whitespace and on a line end.
A stage-1 end can only sit where a stage-0 end does, so stage 1's chance precision is stage 0's. The
lift (stage-1 precision minus stage-0 precision) is paired over documents, with the ratio
estimator's standard error.
"""

import sys

import jax
import numpy as np

from tokjax import boundary_stats, checkpointing, evaluation
from tokjax.data import pipeline
from tokjax.lab import synthetic

REFERENCES = {
    'free': boundary_stats.unforced,
    'ws_free': synthetic.both(boundary_stats.whitespace, boundary_stats.unforced),
    'line_free': synthetic.both(boundary_stats.line_end, boundary_stats.unforced),
}


def columns(ckpt, docs, key):
  cols = {}
  for d, doc in enumerate(docs):
    r = ckpt.evaluator.run(
        ckpt.params,
        [doc],
        jax.random.fold_in(key, d),
        modes=('sample',),
        references=REFERENCES,
        counts=True,
    )
    for s, level in enumerate(r['sample']['counts']):
      for name in REFERENCES:
        cols.setdefault(f'L{s}_{name}', []).append(float(level[name].hits))
  return {k: np.asarray(v) for k, v in cols.items()}


def main(dirs):
  print(
      '| run | documents | stage-1 ends | reference | stage-0 precision (chance) | stage-1 precision | lift +- s.e. |'
  )
  print('|---|---|---|---|---|---|---|')
  for d in dirs:
    ckpt = checkpointing.load_checkpoint(d)
    docs = pipeline.load_splits(ckpt.config.data)['val']
    c = columns(ckpt, docs, jax.random.PRNGKey(0))
    for ref in ('ws_free', 'line_free'):
      p0, _ = evaluation.share_and_se(c[f'L0_{ref}'], c['L0_free'])
      p1, _ = evaluation.share_and_se(c[f'L1_{ref}'], c['L1_free'])
      lift, se = evaluation.paired_share_difference(
          c[f'L1_{ref}'], c['L1_free'], c[f'L0_{ref}'], c['L0_free']
      )
      print(
          f'| {d} | {len(docs)} | {int(c["L1_free"].sum())} | {ref.split("_")[0]} | {p0:.3f} | '
          f'{p1:.3f} | {lift:+.3f} +- {se:.3f} |'
      )


if __name__ == '__main__':
  main(sys.argv[1:])
