r"""Rival boundary method 'uniform' in the hierarchical model, at CPU size (same model as configs/default.py).

  python -m tokjax.train --config configs/rival_uniform.py

Uniform random: exactly round(0.2 * 256) = 51 boundaries per row at random positions.
Trained without a policy gradient (estimator.kind = 'none'); d_model 128, 1/2/1 blocks, L = 256, B = 16,
600 steps on the standard-library corpus. Measured results at equal byte budget for every method:
results/compare/ (python -m tokjax.experiments.compare).
"""

from tokjax.config_defaults import base_config


def get_config():
  c = base_config()
  c.boundary.method = 'uniform'
  c.estimator.kind = 'none'
  c.train.workdir = 'runs/rival_uniform'
  return c
