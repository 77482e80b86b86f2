r"""Ablation of the 40M paper model: no batch-relative advantage.

  python -m tokjax.train --config configs/ablation_no_batch_relative.py   # on accelerators, see launch/

configs/paper_40m_fineweb.py with estimator.baseline = 'none' (instead of 'batch').
Expected result (paper, ablation table, FineWeb validation): rate 0.208, 1.543 bpb, whitespace 0.99. Not measured by tokjax at this size;
the CPU-scale counterpart is `python -m tokjax.train --config configs/default.py --config.estimator.baseline=none`.
"""

from tokjax.config import files as config_files


def get_config():
  c = config_files.load('paper_40m_fineweb')  # Its corpus too: bpb comparable with that run's.
  c.estimator.baseline = 'none'
  c.train.workdir = 'runs/ablation_no_batch_relative'
  return c
