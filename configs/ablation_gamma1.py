r"""Ablation of the 40M paper model: no time discounting.

  python -m tokjax.train --config configs/ablation_gamma1.py   # on accelerators, see launch/

configs/paper_40m_fineweb.py with estimator.gamma = 1.
Expected result (paper, ablation table, FineWeb validation): rate 0.215, 1.542 bpb, whitespace 0.41. Not measured by tokjax at this size;
the CPU-scale counterpart is `python -m tokjax.train --config configs/default.py --config.estimator.gamma=1.0`.
"""

from tokjax.config import files as config_files


def get_config():
  c = config_files.load('paper_40m_fineweb')  # Its corpus too: bpb comparable with that run's.
  c.estimator.gamma = 1.0
  c.train.workdir = 'runs/ablation_gamma1'
  return c
