r"""Ablation of the 40M paper model: independent boundary decisions (w = 1), the window alone.

  python -m tokjax.train --config configs/ablation_w1.py   # on accelerators, see launch/

configs/paper_40m_fineweb.py with boundary.policy.window = 1 and boundary.policy.form = 'scaled':
the full method's logit (scale 1/16, soft cap 6) kept, so only the window changes ('auto' would
also switch w = 1 to the plain logit v + b; tokjax/models/boundaries.py).
Expected result (paper, ablation table, FineWeb validation): rate 0.196, 1.51 bpb, whitespace 0.99.
Not measured by tokjax at this size; the CPU-scale counterparts are the ablation study's 'w8' (the
window alone), 'w1_scaled' (the logit alone) and 'w8_scaled' (both): tokjax/lab/ablation.py.
"""

from tokjax.config import files as config_files


def get_config():
  c = config_files.load('paper_40m_fineweb')  # Its corpus too: bpb comparable with that run's.
  c.boundary.policy.window = 1
  c.boundary.policy.form = 'scaled'  # The full method's (w = 8's) logit: the window alone changes.
  c.train.workdir = 'runs/ablation_w1'
  return c
