r"""Rival boundary method 'bpe' in the hierarchical model, at CPU size (same model as configs/default.py).

  python -m tokjax.train --config configs/rival_bpe.py

BPE-guided: a byte-level BPE (tokenizers library) trained on the training split with its
vocabulary sized to about 0.2 tokens per byte on val; each chunk ends on the byte that starts the next
token. Needs `pip install -e .[compare]`.
Trained without a policy gradient (estimator.kind = 'none'); d_model 128, 1/2/1 blocks, L = 256, B = 16,
600 steps on the standard-library corpus. Measured results at equal byte budget for every method:
results/compare/ (python -m tokjax.experiments.compare).
"""

from tokjax.config_defaults import base_config


def get_config():
  c = base_config()
  c.boundary.method = 'bpe'
  c.estimator.kind = 'none'
  c.train.workdir = 'runs/rival_bpe'
  return c
