"""Rival boundary methods, each behind the `BoundaryPolicy` call signature, one module each.

Every module here declares its methods with `registry.register` (tokjax/models/registry.py), which
imports them all; `python -m tokjax.lab.compare --helpfull` lists them. Built in:

  'hnet'        H-Net dynamic chunking (hnet.py)          straight-through, ratio loss
  'gumbel'      dynamic token pooling, Gumbel-sigmoid     straight-through, binomial prior
  'entropy'     BLT entropy spikes of the early-exit head learned scalar threshold
  'whitespace'  SpaceByte spacelike bytes (rules.py)      fixed rule
  'stride'      every round(1 / rate) bytes               fixed rule
  'uniform'     round(rate * L) random positions          fixed rule
  'bpe'         byte-level BPE token starts (bpe.py)      fixed rule from a trained tokenizer,
                of the text up to the byte (causal)
  'bpe_oracle'  the same of the whole window (bpe.py)     reads later bytes: an oracle

None trains with the score function (their registry entries say so, so the estimator adds no policy
gradient); their rate controls are in `Boundaries.aux_loss`.
"""
