r"""The score-function method with a learned value baseline and GAE(gamma, lambda) advantages.

  python -m tokjax.train --config configs/estimator_gae.py --config.data.corpus=shakespeare

configs/default.py with estimator.baseline = 'value': a critic head (Dense-GELU-Dense on the detached
encoder state) predicts the discounted return G_t and is trained by value_weight * MSE against the
detached G_t (relative to mean G_t^2); the policy's advantages are GAE(gamma = 0.99,
lambda = 0.95) of the early-exit rewards. Same cost per step as the default.
Expect (Shakespeare, 600 steps, 3 seeds, ~6.5 min on one core; results/estimators/training/, variant
gae): no better than the default: sampled whitespace recall 0.928 ± 0.085 over steps 450-600 (default
0.959 ± 0.019; one seed stayed at 0.83), final val bpb 2.557 ± 0.006 (default 2.554 ± 0.002). Lab
(results/estimators/, trained checkpoint): the learned critic leaves 450x more variance than an ideal
one would.
"""

from tokjax.config_defaults import base_config


def get_config():
  c = base_config()
  c.estimator.baseline = 'value'
  c.estimator.gae_lambda = 0.95
  c.train.workdir = 'runs/estimator_gae'
  return c
