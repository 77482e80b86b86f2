"""Every config field, declared once with its default and its meaning.

Config files in configs/ start from `base_config()` and change what they need; every field can be
overridden on the command line (`--config.model.d_model=256`). Elsewhere:
  tokjax/config/validation.py   `validate(config)`: one UserError line naming a bad field (each
                                section is checked by the code that reads it)
  tokjax/config/presets.py      the paper's sizes and the smoke-test shrink `tiny`
  tokjax/config/files.py        named variants of config files (`FILE.py:NAME`) and `load(name)`
  tokjax/config/saved.py        saved configs read onto these defaults: a new field's default must
                                keep what the code did before it; a rename adds a `MIGRATIONS` entry
  tokjax/stages.py              `stages.resolve(config)`: each stage's settings, config.stages.sK
                                over the top-level sections
"""

import ml_collections
from ml_collections import config_dict

from tokjax import estimator, stages
from tokjax.models import registry


def stage_section(config=None) -> ml_collections.ConfigDict:
  """config.stages.sK: what stage K changes of the top-level sections (`stages.OVERRIDES` and every
  registered method's own settings), each field None (the top level's value) until set.

  Each field is a typed placeholder, so that `--config.stages.s1.estimator.gamma=0.9` parses as the
  top-level field it overrides (a bare None field takes no command-line value). config: where the
  fields' types come from (default: `base_config()`).
  """
  base = base_config() if config is None else config
  section = {
      name: {f: config_dict.placeholder(type(base[name][f])) for f in fields}
      for name, fields in stages.OVERRIDES.items()
  }
  for name, method in registry.methods().items():
    if method.defaults:
      section['boundary'][name] = {
          f: config_dict.placeholder(type(v)) for f, v in method.defaults.items()
      }
  return ml_collections.ConfigDict(section)


def base_config() -> ml_collections.ConfigDict:
  """Defaults: the score-function method at CPU size on the embedded standard-library corpus."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # Parameter init, boundary draws and the order of training batches.

  c.data = dict(
      # A registered name (docs/data.md's table), 'prepared:DIR', 'hf:FILE.parquet' or a path.
      corpus='stdlib_docs',
      data_dir='',  # Cache of prepared corpora ('' = $TOKJAX_DATA_DIR or ~/.cache/tokjax).
      max_bytes=0,  # Read at most this many bytes of documents (0 = all).
      val_fraction=0.05,  # Share of documents held out for validation.
      test_fraction=0.05,  # Share of documents held out for the final test.
      split_seed=0,  # Seed of the document permutation that makes the splits.
      # 'document': any piece may go to any split; 'unit': whole works (files) per split.
      split_by='document',
      seq_len=256,  # Bytes per training sequence (L).
      batch_size=16,  # Sequences per step, global over all devices and hosts (B).
  )

  target_rate = ml_collections.FieldReference(
      0.2
  )  # Chunks per byte, r*; shared by policy and loss.
  c.model = dict(
      kind='hierarchical',  # 'hierarchical' | 'flat'.
      d_model=128,  # Width of every layer.
      num_heads=4,  # Attention heads (d_model / num_heads even: RoPE rotates pairs).
      encoder_layers=1,  # Hierarchical: byte layers before the boundaries (down).
      main_layers=2,  # Hierarchical: layers over the chunks (mid).
      decoder_layers=1,  # Hierarchical: byte layers after the chunks are added back (up).
      num_layers=4,  # Flat only.
      byte_window=64,  # Sliding-window width of byte layers (0 = full attention).
      byte_mlp_ratio=1,  # MLP width of byte layers, in units of d_model.
      main_mlp_ratio=4,  # MLP width of chunk layers, in units of d_model.
      mlp_ratio=4,  # MLP width of the flat model's layers, in units of d_model.
      capacity=128,  # Chunk buffer size C; boundaries beyond it are dropped (see boundaries.py).
      dtype='float32',  # Compute dtype: 'float32' | 'bfloat16' (parameters stay float32).
      # Stages (tokjax/models/hierarchical.py): S levels of boundaries. Stage 0 draws chunk boundaries
      # over bytes; stage K = 1..S-1 draws boundaries over the chunks of stage K - 1. Every stage
      # reads config.model / config.boundary / config.estimator except where config.stages.sK says
      # otherwise (tokjax/stages.py).
      stages=1,  # 1 = the paper's model (bytes -> chunks); 2 adds chunks of chunks.
      # Memory and speed options for the paper's sizes on accelerators (tokjax/models/layers.py). The
      # defaults change nothing; each is checked where it is used (layers.stack_options).
      remat=dict(encoder='none', main='none', decoder='none'),  # 'none' | 'dots' | 'full'.
      scan_layers=False,  # nn.scan over identical blocks (a different parameter tree).
      attention='blocked',  # 'blocked' | 'dot_product' | 'cudnn' (GPU, bfloat16).
  )
  # One sub-section per registered boundary method with settings (config.boundary.NAME, from the
  # method's registry entry: tokjax/models/registry.py) and per estimator baseline with settings
  # (config.estimator.NAME, from `estimator.BASELINES`).
  c.boundary = dict(
      method='policy',  # A registered method: 'policy' (the paper) or a rival (tokjax/models/rivals/).
      target_rate=target_rate,
      **{name: dict(m.defaults) for name, m in registry.methods().items() if m.defaults},
  )
  c.estimator = dict(
      # The score-function estimator (tokjax/estimator.py). It trains a method whose registry entry has
      # score_function=True (the 'policy'); other methods get no policy gradient and no rate loss.
      # 'early_exit' (CE_early - CE_full) | 'plain' (-CE_full) | 'counterfactual' (CE_cf - CE_full,
      # CE_cf with the stage's and upper stages' decisions drawn again given the lower stages; one
      # more forward pass per step) | 'counterfactual_greedy' (the same with their greedy pattern).
      reward='early_exit',
      # 'batch' (the paper's batch-relative advantage) | 'none' | 'rloo' (leave-one-out over
      # estimator.rloo.k draws per sequence, one encoder pass) | 'value' (critic head on the encoder
      # state, GAE(gamma, estimator.value.gae_lambda)): `estimator.BASELINES`.
      baseline='batch',
      gamma=0.99,  # Discount of rewards along the bytes.
      lambda_rl=0.01,  # Weight of the policy loss.
      lambda_rate=0.01,  # Weight of the rate loss.
      lambda_early=0.1,  # Weight of the early-exit head's CE (every hierarchical model).
      rate_loss=True,  # The rate loss that holds the boundary rate at target_rate.
      target_rate=target_rate,
      # Warm start: draw the first N steps' decisions from Bernoulli(r*), importance-weighted by each
      # decision's own ratio (an approximation: see tokjax/estimator.py).
      off_policy_steps=0,
      **{name: dict(b.defaults) for name, b in estimator.BASELINES.items() if b.defaults},
  )
  c.optim = dict(
      # AdamW with a linear warmup from warmup_init_factor * lr to lr, then cosine decay to
      # min_lr_factor * lr at train.steps (trainer.learning_rate_schedule).
      lr=2e-3,
      warmup_steps=50,
      warmup_init_factor=0.1,
      min_lr_factor=0.0,
      # The boundary methods' parameters learn at policy_lr_factor * lr (a slower policy than the LM).
      policy_lr_factor=1.0,
      weight_decay=0.1,  # On matrices only.
      b1=0.9,
      b2=0.95,
      grad_clip=1.0,  # Global gradient norm.
      grad_accum_steps=1,  # Micro-batches per step (divides data.batch_size).
  )
  c.train = dict(
      steps=600,
      log_every=25,  # Steps between training-metric lines.
      eval_every=100,  # Steps between validation runs.
      checkpoint_every=200,
      keep_checkpoints=2,  # Checkpoints kept in the workdir (the newest).
      workdir='runs/default',  # The run's checkpoints and metrics.jsonl.
      # Profiling at scale: jax.profiler trace of train steps N..M inclusive, written to
      # <workdir>/profile; (0, 0) = off. Read by tokjax.profiling.StepProfiler.from_config.
      profile_steps=(0, 0),
  )
  c.eval = dict(
      batch_size=16,
      max_batches=8,  # Val bpb over max_batches * batch_size sequences.
      segment_lines=4,  # Held-out lines printed with '|' at each boundary.
  )
  c.mesh = dict(
      data=-1,
      fsdp=1,
      tensor=1,  # Device mesh shape; -1 takes the remaining devices.
      multihost='auto',  # 'auto' | 'on' | 'off': join several hosts (distributed.py).
      # Logical axis name -> mesh axes (tokjax/sharding.py).
      rules=(
          ('batch', ('data', 'fsdp')),
          ('embed', 'fsdp'),
          ('heads', 'tensor'),
          ('kv', None),
          ('mlp', 'tensor'),
          ('vocab', 'tensor'),
          ('length', None),
      ),
  )
  # config.stages.sK: stage K's own settings where they differ from the top level's (config.boundary,
  # config.model, config.estimator): `stage_section`, every field None (inherited) until set, e.g.
  # stages.s1.boundary.target_rate (per chunk of stage 0), stages.s1.model.capacity,
  # stages.s1.model.{encoder,decoder}_layers (its chunk layers), stages.s1.model.byte_window (their
  # attention width, in bytes), stages.s1.estimator.gamma, stages.s1.boundary.policy.window. A model
  # of more stages adds c.stages.s2 = stage_section() and so on.
  c.stages = dict(s1=stage_section(c))
  return c
