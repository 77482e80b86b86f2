r"""The cheapest measured setup where the ladder ranks the boundary methods: 4e6 bytes of Shakespeare.

  python -m tokjax.train --config configs/proxy.py:policy      # one method (13 min on one CPU core)
  python -m tokjax.lab.ladder --corpus shakespeare --budgets 4e6 --methods policy,bpe,hnet,uniform \
    --seeds 0,1,2 --lrs 8e-3 --override hnet:boundary.hnet.ratio_weight=0.3 \
    --override bpe:boundary.bpe.pretokenize=none --jobs 2 --out OUT

configs/compare.py:METHOD (0.86M parameters) for 977 steps of 16 x 256 bytes at lr 8e-3, rates
matched at 0.2 (H-Net's ratio weight 0.3; the BPE merges across words). It is the ladder's run.
Expect (test bpb, mean of seeds 0-2; X - policy paired on the test windows, +- the document-clustered
and the seed s.e.; results/ladder/README.md): policy 2.300; BPE-guided 2.252 (-0.048 +- 0.002,
0.008: found ahead); whitespace 2.308 (+0.009 +- 0.002, 0.001: found behind); H-Net 2.317
(+0.017 +- 0.002, 0.009: found behind, just); uniform 2.327 (+0.028 +- 0.002, 0.000: found behind).
On Python source (--corpus stdlib) only BPE-guided's lead survives three seeds. Variants: every
boundary method of the registry.
"""

from tokjax.config import files as config_files
from tokjax.config import presets
from tokjax.models import registry

VARIANTS = {name: m.description for name, m in registry.methods().items()}

BUDGET_BYTES = 4e6
LEARNING_RATE = 8e-3
# Per-method settings that put each method's realised rate within 0.02 of the target 0.2.
RATE_MATCHING = {
    'hnet': {'boundary.hnet.ratio_weight': 0.3},
    'bpe': {'boundary.bpe.pretokenize': 'none'},
}


def get_config(arg=None):
  name, options = config_files.parse_variant(arg, VARIANTS, 'policy')
  c = config_files.load('compare', name)
  c.data.corpus = 'shakespeare'
  c.optim.lr = LEARNING_RATE
  steps = round(BUDGET_BYTES / (c.data.batch_size * c.data.seq_len))
  c.train.update(
      steps=steps,
      eval_every=steps // 4,
      log_every=min(25, steps // 8),
      checkpoint_every=min(steps, 200),
      workdir=f'runs/proxy/{name}',
  )
  config_files.set_fields(c, RATE_MATCHING.get(name, {}))
  if 'tiny' in options:
    presets.tiny(c)
  return c
