r"""Rival boundary method 'entropy' in the hierarchical model, at CPU size (same model as configs/default.py).

  python -m tokjax.train --config configs/rival_entropy.py

Entropy spikes (BLT): a chunk ends where the early-exit head's next-byte entropy exceeds a
learned scalar threshold, driven toward the 0.8 quantile (rate 0.2) by a proportional controller.
Trained without a policy gradient (estimator.kind = 'none'); d_model 128, 1/2/1 blocks, L = 256, B = 16,
600 steps on the standard-library corpus. Measured results at equal byte budget for every method:
results/compare/ (python -m tokjax.experiments.compare).
"""

from tokjax.config_defaults import base_config


def get_config():
  c = base_config()
  c.boundary.method = 'entropy'
  c.estimator.kind = 'none'
  c.train.workdir = 'runs/rival_entropy'
  return c
