r"""The score-function method under each estimator baseline at equal compute, one variant each.

  python -m tokjax.train --config configs/estimators.py:rloo2x8 --config.data.corpus=shakespeare
  python -m tokjax.lab.estimator_training --corpus shakespeare --steps 600 --seeds 0,1,2

configs/default.py with the variant's baseline (`estimator.BASELINES`) and batch, 16 boundary draws
per step each: full (the paper's batch-relative advantage, 16 x 1), gae (learned value baseline +
GAE(0.99, 0.95), 16 x 1), rloo4x4 and rloo2x8 (leave-one-out over K draws of B sequences), rloo4x16
(4x the compute, a reference only); ',tiny': smoke-test size. 6-7 minutes a run on one core.
Expect (Shakespeare, 600 steps, 3 seeds; results/estimators/README.md): sampled whitespace recall
over steps 450-600 of 0.959 +- 0.019 (full), 0.928 +- 0.085 (gae), 0.995 +- 0.003 (rloo4x4), 0.996
+- 0.003 (rloo2x8); final val bpb 2.554, 2.557, 2.776 and 2.642 (RLOO: fewer training bytes).
"""

from tokjax.config import defaults as config_defaults
from tokjax.config import files as config_files
from tokjax.config import presets

# name -> (baseline, settings of its config.estimator.BASELINE section, sequences per step B, description)
SETTINGS = {
    'full': ('batch', {}, 16, 'batch-relative advantage (the paper), 16 x 1'),
    'gae': ('value', {'gae_lambda': 0.95}, 16, 'value baseline + GAE(0.99, 0.95), 16 x 1'),
    'rloo4x4': ('rloo', {'k': 4}, 4, 'RLOO, 4 sequences x K = 4 draws'),
    'rloo2x8': ('rloo', {'k': 2}, 8, 'RLOO, 8 sequences x K = 2 draws'),
    'rloo4x16': ('rloo', {'k': 4}, 16, 'RLOO, 16 sequences x K = 4 draws (4x compute)'),
}
VARIANTS = {name: setting[-1] for name, setting in SETTINGS.items()}


def get_config(arg=None):
  name, options = config_files.parse_variant(arg, VARIANTS, 'full')
  baseline, settings, batch, _ = SETTINGS[name]
  c = config_defaults.base_config()
  c.estimator.baseline = baseline
  if settings:
    c.estimator[baseline].update(settings)
  if 'tiny' in options:
    presets.tiny(c)
    batch = max(1, batch * c.data.batch_size // 16)
  c.data.batch_size = batch
  c.train.workdir = f'runs/estimators/{name}'
  return c
