r"""Ablation of the 40M paper model: no rate loss.

  python -m tokjax.train --config configs/ablation_no_rate_loss.py   # on accelerators, see launch/

configs/paper_40m_fineweb.py with estimator.rate_loss = False.
Expected result (paper, ablation table, FineWeb validation): rate 1.0 (no compression at all), 1.39 bpb, whitespace 1.0. Not measured by tokjax at this size;
the CPU-scale counterpart is `python -m tokjax.train --config configs/default.py --config.estimator.rate_loss=False`.
"""

from tokjax.config_defaults import paper_config


def get_config():
  c = paper_config('40m')
  c.estimator.rate_loss = False
  c.model.capacity = c.data.seq_len  # Nothing holds the rate down: leave room for a chunk per byte.
  c.train.workdir = 'runs/ablation_no_rate_loss'
  return c
