"""Preset configs built from `config_defaults.base_config()`: the paper's sizes (`paper_config`,
`paper_two_stage_config`; configs/paper_*.py and configs/ablation_*.py start from them) and the
smoke-test shrink `tiny` (the `,tiny` option of config variants, the experiments' --tiny, tests).
"""

from typing import Any

import ml_collections

from tokjax import models
from tokjax.config import defaults as config_defaults

# The paper's reference setups: d, heads, down/mid/up, seq, batch, lr, bytes, corpus.
PAPER_SIZES: dict[str, dict[str, Any]] = {
    '147m': dict(
        d=768,
        heads=12,
        layers=(4, 12, 4),
        seq=4096,
        batch=128,
        lr=1.5e-3,
        bytes=6e9,
        corpus='hf:fineweb',
    ),
    '90m': dict(
        d=768,
        heads=12,
        layers=(4, 6, 4),
        seq=4096,
        batch=128,
        lr=2e-3,
        bytes=3.4e9,
        corpus='hf:codeparrot',
    ),
    '40m': dict(
        d=512,
        heads=8,
        layers=(4, 6, 4),
        seq=4096,
        batch=64,
        lr=2.4e-3,
        bytes=1.5e9,
        corpus='hf:fineweb',
    ),
}


def paper_config(size: str) -> ml_collections.ConfigDict:
  """A paper-scale config: w = 8 policy, bf16, FSDP over all devices, steps = bytes / (B * L)."""
  p = PAPER_SIZES[size]
  c = config_defaults.base_config()
  c.data.update(
      corpus=p['corpus'], seq_len=p['seq'], batch_size=p['batch'], max_bytes=int(p['bytes'] * 1.1)
  )
  down, mid, up = p['layers']
  c.model.update(
      d_model=p['d'],
      num_heads=p['heads'],
      encoder_layers=down,
      main_layers=mid,
      decoder_layers=up,
      byte_window=64,
      capacity=1024,
      dtype='bfloat16',
  )
  c.boundary.policy.window = 8
  c.optim.update(lr=p['lr'], warmup_steps=500)  # Warmup length: ours; the paper gives none.
  c.train.update(
      steps=int(p['bytes'] // (p['seq'] * p['batch'])),
      log_every=50,
      eval_every=500,
      checkpoint_every=1000,
      workdir=f'runs/paper_{size}',
  )
  c.eval.update(batch_size=64, max_batches=32)
  c.mesh.update(data=1, fsdp=-1, tensor=1)  # FSDP over every device: the batch splits evenly.
  return c


def paper_two_stage_config(size: str, main_layers: int, stage_layers: int, corpus: str):
  """paper_config(size) with a second stage: the score-function policy over stage-0 chunks at target
  rate 0.5 (512 slots), `stage_layers` layers before and after it, `main_layers` main layers.

  The stage-1 layers attend over the byte layers' 64 bytes (stage 1 inherits config.model.byte_window,
  which counts bytes), so
  only the main layers, one state per stage-1 chunk, reach further back: stage 1 is a bottleneck whose
  chunk ends decide what is carried past 64 bytes. With full attention there (window 0) the stage-1
  layers read every stage-0 chunk and stage 1's decisions would change the loss only at second order.
  """
  c = paper_config(size)
  c.model.stages = 2
  c.model.main_layers = main_layers
  s1 = c.stages.s1
  s1.boundary.update(method='policy', target_rate=0.5)
  s1.model.update(capacity=512, encoder_layers=stage_layers, decoder_layers=stage_layers)
  c.train.workdir = f'runs/paper_two_stage_{size}'
  c.data.corpus = corpus
  return c


def tiny(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a CPU config to smoke-test size in place (the experiments' --tiny): d_model 32, 1 main
  layer, L = 64, B = 4, one eval batch."""
  c.model.update(d_model=32, num_heads=2, main_layers=1, capacity=32)
  c.model.byte_window = 16 if models.num_stages(c) else 0
  c.data.update(seq_len=64, batch_size=4)
  c.eval.update(batch_size=4, max_batches=1)
  c.optim.warmup_steps = 2
  return c
