r"""Rival boundary method 'whitespace' in the hierarchical model, at CPU size (same model as configs/default.py).

  python -m tokjax.train --config configs/rival_whitespace.py

SpaceByte rule: a chunk ends at every spacelike byte (not a letter, digit or UTF-8
continuation byte) that follows a non-spacelike byte. No rate control.
Trained without a policy gradient (estimator.kind = 'none'); d_model 128, 1/2/1 blocks, L = 256, B = 16,
600 steps on the standard-library corpus. Measured results at equal byte budget for every method:
results/compare/ (python -m tokjax.experiments.compare).
"""

from tokjax.config_defaults import base_config


def get_config():
  c = base_config()
  c.boundary.method = 'whitespace'
  c.estimator.kind = 'none'
  c.train.workdir = 'runs/rival_whitespace'
  return c
