r"""The synthetic learning check: does the score-function policy find planted word ends? (CPU size.)

  python -m tokjax.lab.synthetic --steps 800 --eval_every 100 --out results/synthetic
  python -m tokjax.train --config configs/synthetic_cpu.py:method \
      --config.data.corpus=runs/synthetic/corpus            # one run, once the corpus is written

Random words of 2..6 letters closed by a space (planted rate 0.197) in blocks each followed by a
copy; d_model 64, encoder/main/decoder 1/2/1, L = 128, B = 16, lr 3e-3, 0.24M parameters.
Variants: method (the policy), control (estimator.lambda_rl = 0), oracle (the whitespace rule),
uniform. 3-4 minutes a run on one core.
Expect (results/synthetic/README.md): at 800 steps the method's greedy boundaries have F1 1.000
against the planted ends (from step 100), sampled 0.872, against 0.216 for the control (chance);
bpb 4.231 (method), 4.220 (control), 4.234 (oracle), 4.221 (uniform): no run used the copies.
"""

from tokjax.config import defaults as config_defaults
from tokjax.config import files as config_files

VARIANTS = {
    'method': 'the score-function policy (the method under test)',
    'control': 'the policy with estimator.lambda_rl = 0: no policy gradient, the rate loss only',
    'oracle': "the 'whitespace' rule: exactly the planted ends when words end in a space",
    'uniform': "the 'uniform' rival: round(0.2 L) boundaries at random positions",
}


def get_config(arg=None):
  name, _ = config_files.parse_variant(arg, VARIANTS, 'method')
  c = config_defaults.base_config()
  c.data.update(corpus='', seq_len=128, batch_size=16, val_fraction=0.05, test_fraction=0.05)
  c.model.update(
      d_model=64,
      num_heads=4,
      encoder_layers=1,
      main_layers=2,
      decoder_layers=1,
      byte_window=8,
      capacity=64,
  )
  c.optim.update(lr=3e-3, warmup_steps=30)
  c.train.update(
      steps=800,
      log_every=50,
      eval_every=100,
      checkpoint_every=100,
      keep_checkpoints=100,
  )
  c.eval.update(batch_size=16, max_batches=4)
  if name == 'control':
    c.estimator.lambda_rl = 0.0
  elif name in ('oracle', 'uniform'):
    c.boundary.method = 'whitespace' if name == 'oracle' else 'uniform'
  c.train.workdir = f'runs/synthetic/{name}'
  return c
