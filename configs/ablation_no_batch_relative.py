r"""Ablation of the 40M paper model: no batch-relative advantage.

  python -m tokjax.train --config configs/ablation_no_batch_relative.py   # on accelerators, see launch/

configs/paper_40m_fineweb.py with estimator.baseline = 'none' (instead of 'batch').
Expected result (paper, ablation table, FineWeb validation): rate 0.208, 1.543 bpb, whitespace 0.99. Not measured by tokjax at this size;
the CPU-scale counterpart is `python -m tokjax.train --config configs/default.py --config.estimator.baseline=none`.
"""

from tokjax.config.presets import paper_config


def get_config():
  c = paper_config('40m')
  c.estimator.baseline = 'none'
  c.train.workdir = 'runs/ablation_no_batch_relative'
  return c
