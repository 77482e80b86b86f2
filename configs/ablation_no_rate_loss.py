r"""Ablation of the 40M paper model: no rate loss.

  python -m tokjax.train --config configs/ablation_no_rate_loss.py   # on accelerators, see launch/

configs/paper_40m_fineweb.py with estimator.rate_loss = False, and a chunk buffer of one chunk per
byte (model.capacity = seq_len = 4096, from 1024) so the rate can reach 1: `validate` rejects
rate_loss = False with a smaller buffer, which would cap the executed rate at about capacity / seq_len.
Expected result (paper, ablation table, FineWeb validation): rate 1.0 (no compression at all), 1.39 bpb, whitespace 1.0. Not measured by tokjax at this size;
the CPU-scale counterpart is `python -m tokjax.train --config configs/default.py --config.estimator.rate_loss=False
--config.model.capacity=256` (capacity = seq_len).
"""

from tokjax.config import files as config_files


def get_config():
  c = config_files.load('paper_40m_fineweb')  # Its corpus too: bpb comparable with that run's.
  c.estimator.rate_loss = False
  c.model.capacity = c.data.seq_len  # Nothing holds the rate down: leave room for a chunk per byte.
  c.train.workdir = 'runs/ablation_no_rate_loss'
  return c
