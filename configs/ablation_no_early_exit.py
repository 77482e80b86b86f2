r"""Ablation of the 40M paper model: plain rewards instead of the early-exit relative reward.

  python -m tokjax.train --config configs/ablation_no_early_exit.py   # on accelerators, see launch/

configs/paper_40m_fineweb.py with estimator.reward = 'plain' (r_t = -CE_full(t)).
Expected result (paper, ablation table, FineWeb validation): rate 0.200, 1.562 bpb, whitespace 0.72. Not measured by tokjax at this size;
the CPU-scale counterpart is `python -m tokjax.train --config configs/default.py --config.estimator.reward=plain`.
"""

from tokjax.config import files as config_files


def get_config():
  c = config_files.load('paper_40m_fineweb')  # Its corpus too: bpb comparable with that run's.
  c.estimator.reward = 'plain'
  c.train.workdir = 'runs/ablation_no_early_exit'
  return c
