r"""Ablation of the 40M paper model: independent boundary decisions (w = 1).

  python -m tokjax.train --config configs/ablation_w1.py   # on accelerators, see launch/

configs/paper_40m_fineweb.py with boundary.policy.window = 1.
Expected result (paper, ablation table, FineWeb validation): rate 0.196, 1.51 bpb, whitespace 0.99. Not measured by tokjax at this size;
the CPU-scale counterpart is `python -m tokjax.train --config configs/default.py --config.boundary.policy.window=1`.
"""

from tokjax.config.presets import paper_config


def get_config():
  c = paper_config('40m')
  c.boundary.policy.window = 1
  c.train.workdir = 'runs/ablation_w1'
  return c
