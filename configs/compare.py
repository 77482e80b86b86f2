r"""Every boundary method at CPU size in the same model (configs/default.py's), one variant each.

  python -m tokjax.train --config configs/compare.py:hnet
  python -m tokjax.train --config configs/compare.py:gumbel,tiny    # smoke-test size

Variants: every method of the registry (tokjax/models/registry.py: 'policy', the score-function
method, and the rivals of tokjax/models/rivals/) and 'flat' (the flat byte Transformer, full
attention). A method added to the registry is a variant here with no edit. A method trains with the
score function only when its registry entry says so; the rivals get no policy gradient.
Hierarchical model, d_model 128, encoder/main/decoder 1/2/1 blocks, L = 256, B = 16, 600 steps on the
standard-library corpus; `,tiny` shrinks it (presets.tiny). `python -m tokjax.lab.compare` trains
these variants at equal bytes. Expect (results/compare/README.md, `--corpus shakespeare --bytes 1e6`,
one seed, about 100 s a method on 2 cores): per-document val bpb policy 3.009 +- 0.041, H-Net's
router 2.938 +- 0.047, BPE-guided 2.923 +- 0.045, flat 2.732 +- 0.051.
"""

from tokjax.config import defaults as config_defaults
from tokjax.config import files as config_files
from tokjax.config import presets
from tokjax.models import registry

VARIANTS = {name: m.description for name, m in registry.methods().items()} | {
    'flat': 'the flat byte Transformer (no chunking, full attention)'
}


def get_config(arg=None):
  name, options = config_files.parse_variant(arg, VARIANTS, 'policy')
  c = config_defaults.base_config()
  if name == 'flat':
    c.model.update(kind='flat', byte_window=0)
  else:
    c.boundary.method = name
  if 'tiny' in options:
    presets.tiny(c)
  c.train.workdir = f'runs/{name}'
  return c
