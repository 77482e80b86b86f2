r"""Two levels of learned boundaries at CPU size: bytes -> chunks -> chunks of chunks.

  python -m tokjax.train --config configs/two_stage.py               # :hnet, :whitespace, :stride

configs/default.py's model with a second stage: stage 0 at target rate 0.2 over bytes, stage 1 at
0.33 over stage-0 chunks, stage-1 layers over 64 bytes so that where stage-1 chunks end decides what
reaches further back; 1024-byte sequences, 4 per step, 2644 steps (10.8M bytes of Shakespeare: the
training FLOPs of 3000 one-stage steps). 1.41M parameters; 29 minutes on one core, 16 on two.
Variants (stage 0 / stage 1): learned (policy / policy), hnet (H-Net's router at both), whitespace
(SpaceByte's rule, then the policy), stride (5 bytes, then 3 chunks); ',tiny': smoke-test size.
Expect (one XLA thread, seed 0): final val bpb 2.224 +- 0.035; stage 0 on the space after a word
(greedy whitespace recall 1.00), stage 1 at rate 0.327 with `ws lift +0.039 +- 0.004` over chance.
At equal FLOPs two stages are 0.016 to 0.035 bpb behind one: results/multistage/README.md.
"""

from tokjax.config import defaults as config_defaults
from tokjax.config import files as config_files
from tokjax.config import presets

VARIANTS = {
    'learned': 'policy / policy: the score function at both levels',
    'hnet': "H-Net's router at both levels",
    'whitespace': 'whitespace rule, then the learned policy',
    'stride': 'fixed stride at both levels',
}
METHODS = {
    'learned': ('policy', 'policy'),
    'hnet': ('hnet', 'hnet'),
    'whitespace': ('whitespace', 'policy'),
    'stride': ('stride', 'stride'),
}


def get_config(arg=None):
  name, options = config_files.parse_variant(arg, VARIANTS, 'learned')
  c = config_defaults.base_config()
  first, second = METHODS[name]
  c.boundary.method = first
  c.model.stages = 2
  s1 = (
      c.stages.s1
  )  # Stage 1's chunk layers and window are stage 0's byte layers' (one each, in bytes).
  s1.boundary.update(method=second, target_rate=0.33)
  s1.model.capacity = 256
  # The budget at which stage 1 has something to learn (see the module docstring).
  c.data.update(corpus='shakespeare', seq_len=1024, batch_size=4)
  c.model.capacity = 512
  c.train.update(steps=2644, eval_every=500)
  if 'tiny' in options:
    presets.tiny(c)
    c.data.corpus = 'stdlib_docs'  # A smoke test needs no download.
    s1.model.capacity = max(2, c.model.capacity // 2)
  c.train.workdir = f'runs/two_stage_{name}'
  return c
