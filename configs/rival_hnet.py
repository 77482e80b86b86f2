r"""Rival boundary method 'hnet' in the hierarchical model, at CPU size (same model as configs/default.py).

  python -m tokjax.train --config configs/rival_hnet.py

H-Net dynamic chunking: cosine routing with identity-initialised W_q, W_k, boundary at p >= 0.5,
straight-through factor on the chosen probability, EMA smoothing of chunk outputs, ratio loss (N = 5, weight
0.03).
Trained without a policy gradient (estimator.kind = 'none'); d_model 128, 1/2/1 blocks, L = 256, B = 16,
600 steps on the standard-library corpus. Measured results at equal byte budget for every method:
results/compare/ (python -m tokjax.experiments.compare).
"""

from tokjax.config_defaults import base_config


def get_config():
  c = base_config()
  c.boundary.method = 'hnet'
  c.estimator.kind = 'none'
  c.train.workdir = 'runs/rival_hnet'
  return c
