"""Rival boundary methods, each behind the `BoundaryPolicy` call signature, chosen by
config.boundary.method:

  'hnet'        H-Net dynamic chunking (hnet.py)          straight-through, ratio loss
  'gumbel'      dynamic token pooling, Gumbel-sigmoid     straight-through, binomial prior
  'entropy'     BLT entropy spikes of the early-exit head learned scalar threshold
  'whitespace'  SpaceByte spacelike bytes (rules.py)      fixed rule
  'stride'      every round(1 / rate) bytes               fixed rule
  'uniform'     round(rate * L) random positions          fixed rule
  'bpe'         byte-level BPE token starts (bpe.py)      fixed rule from a trained tokenizer

All train with config.estimator.kind = 'none'; their rate controls are in `Boundaries.aux_loss`.
"""

from tokjax.errors import UserError

METHODS = ('hnet', 'gumbel', 'entropy', 'whitespace', 'stride', 'uniform', 'bpe')


def build(config):
  """The boundary module named by config.boundary.method (any method but 'policy')."""
  # pylint: disable=g-import-not-at-top
  from tokjax.models.rivals import bpe, entropy, gumbel, hnet, rules

  b, cap = config.boundary, config.model.capacity
  rate = b.target_rate
  if b.method == 'hnet':
    return hnet.HNetRouter(target_rate=rate, capacity=cap, ratio_weight=b.ratio_weight)
  if b.method == 'gumbel':
    if b.temperature <= 0:
      raise UserError(
          f'config.boundary.temperature={b.temperature} must be positive (1.0 is usual).'
      )
    return gumbel.GumbelPooling(
        target_rate=rate, capacity=cap, temperature=b.temperature, prior_weight=b.prior_weight
    )
  if b.method == 'entropy':
    return entropy.EntropySpikes(target_rate=rate, capacity=cap)
  if b.method == 'whitespace':
    return rules.Whitespace(capacity=cap)
  if b.method == 'stride':
    return rules.Stride(target_rate=rate, capacity=cap)
  if b.method == 'uniform':
    return rules.Uniform(target_rate=rate, capacity=cap)
  if b.method == 'bpe':
    return bpe.BPEGuided(tokenizer_json=bpe.cached_tokenizer_json(config), capacity=cap)
  raise UserError(
      f'config.boundary.method={b.method!r} is not valid; use "policy" or one of ' f'{METHODS}.'
  )
