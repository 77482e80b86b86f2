"""The full set of config fields with their defaults, and their validation.

Config files in configs/ start from `base_config()` and change what they need; every field can be
overridden on the command line (`--config.model.d_model=256`). `validate` turns a bad value into one
`UserError` line that says which field is wrong and what it accepts.
"""

import ml_collections

from tokjax.errors import UserError


def base_config() -> ml_collections.ConfigDict:
  """Defaults: the score-function method at CPU size on the embedded standard-library corpus."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.data = dict(
      corpus='stdlib',  # 'stdlib' | 'shakespeare' | 'bible' | 'hf:fineweb' | 'hf:codeparrot' | a path.
      data_dir='',  # Cache of prepared corpora ('' = $TOKJAX_DATA_DIR or ~/.cache/tokjax).
      max_bytes=0,  # Read at most this many bytes of documents (0 = all).
      val_fraction=0.05,
      test_fraction=0.05,
      split_seed=0,
      seq_len=256,  # Bytes per training sequence (L).
      batch_size=16,  # Sequences per step, global over all devices and hosts (B).
  )

  target_rate = ml_collections.FieldReference(
      0.2
  )  # Chunks per byte, r*; shared by policy and loss.
  c.model = dict(
      kind='hierarchical',  # 'hierarchical' | 'flat'.
      d_model=128,
      num_heads=4,
      encoder_layers=1,
      main_layers=2,
      decoder_layers=1,  # Hierarchical: down / mid / up.
      num_layers=4,  # Flat only.
      byte_window=64,  # Sliding-window width of byte layers (0 = full attention).
      byte_mlp_ratio=1,
      main_mlp_ratio=4,
      mlp_ratio=4,  # mlp_ratio: flat model.
      capacity=128,  # Chunk buffer size C; boundaries beyond it are dropped (see boundaries.py).
      dtype='float32',  # Compute dtype: 'float32' | 'bfloat16' (parameters stay float32).
  )
  c.boundary = dict(
      method='policy',  # 'policy' (score function) or a rival: see tokjax/models/rivals.py.
      target_rate=target_rate,
      window=1,  # Policy window w: 1 = independent decisions, 8 = sequential (paper ref cfg).
      scale=1.0 / 16.0,  # Logit scale s of the sequential (w > 1) policy.
      # Rivals (tokjax/models/rivals/): 'hnet' | 'gumbel' | 'entropy' | 'whitespace' | 'stride' |
      # 'uniform' | 'bpe'; they train with estimator.kind='none' and add their own rate losses.
      temperature=1.0,  # Gumbel-sigmoid temperature ('gumbel').
      prior_weight=1.0,  # Weight of the binomial rate prior ('gumbel').
      ratio_weight=0.03,  # Weight of H-Net's ratio loss ('hnet').
      bpe_tokenizer='',  # 'bpe': tokenizer JSON path; '' = train one on the training split (cached).
  )
  c.estimator = dict(
      kind='score_function',  # 'score_function' | 'none' (methods trained without a policy gradient).
      reward='early_exit',  # 'early_exit' (CE_early - CE_full) | 'plain' (-CE_full).
      batch_relative=True,
      gamma=0.99,
      lambda_rl=0.01,
      lambda_rate=0.01,
      lambda_early=0.1,
      rate_loss=True,
      target_rate=target_rate,
      off_policy_steps=0,  # Warm start: draw from Bernoulli(r*) for this many steps.
      # Baseline of the score function (tokjax/estimator.py): 'batch' (the paper's batch-relative
      # advantage, switched by batch_relative) | 'rloo' (leave-one-out over rloo_k boundary draws per
      # sequence, one encoder pass) | 'value' (critic head on the encoder state, GAE(gamma, gae_lambda),
      # critic regression weighted by value_weight).
      baseline='batch',
      rloo_k=4,
      gae_lambda=0.95,
      value_weight=0.01,
  )
  c.optim = dict(
      lr=2e-3,
      warmup_steps=50,
      warmup_init_factor=0.1,
      min_lr_factor=0.0,
      weight_decay=0.1,
      b1=0.9,
      b2=0.95,
      grad_clip=1.0,
  )
  c.train = dict(
      steps=600,
      log_every=25,
      eval_every=100,
      checkpoint_every=200,
      keep_checkpoints=2,
      workdir='runs/default',
  )
  # Memory and speed options (issue 15; tokjax/models/layers.py, tokjax/train_state.py). The defaults
  # change nothing; each is checked where it is used (layers.stack_options, train_state.Trainer).
  c.model.remat = dict(encoder='none', main='none', decoder='none')  # 'none' | 'dots' | 'full'.
  c.model.scan_layers = False  # nn.scan over identical blocks (a different parameter tree).
  c.model.attention = 'blocked'  # 'blocked' | 'dot_product' | 'cudnn' (GPU, bfloat16).
  c.optim.grad_accum_steps = 1  # Micro-batches per step (divides data.batch_size).
  # scale (#15): jax.profiler trace of train steps N..M inclusive, written to <workdir>/profile;
  # (0, 0) = off. Read by tokjax.profiling.StepProfiler.from_config.
  c.train.profile_steps = (0, 0)
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
  return c


_CHOICES = {
    'model.kind': ('hierarchical', 'flat'),
    'model.dtype': ('float32', 'bfloat16'),
    'estimator.kind': ('score_function', 'none'),
    'estimator.reward': ('early_exit', 'plain'),
}


def _get(config, dotted):
  for part in dotted.split('.'):
    config = config[part]
  return config


def validate(config) -> None:
  """Raises UserError naming the first bad field and what it accepts."""
  for field, choices in _CHOICES.items():
    if _get(config, field) not in choices:
      raise UserError(f'config.{field}={_get(config, field)!r} is not valid; use one of {choices}.')
  positive = [
      'data.batch_size',
      'model.d_model',
      'model.num_heads',
      'train.steps',
      'eval.batch_size',
      'eval.max_batches',
      'train.log_every',
      'train.eval_every',
      'train.checkpoint_every',
  ]
  for field in positive:
    if not _get(config, field) > 0:
      raise UserError(f'config.{field}={_get(config, field)!r} must be a positive number.')
  if config.data.seq_len < 2:
    raise UserError(
        f'config.data.seq_len={config.data.seq_len} is too short: a sequence needs at least '
        '2 bytes (one input, one target); set --config.data.seq_len=256 or similar.'
    )
  if (
      config.model.d_model % config.model.num_heads
      or (config.model.d_model // config.model.num_heads) % 2
  ):
    raise UserError(
        f'config.model.d_model={config.model.d_model} must split into num_heads='
        f'{config.model.num_heads} heads of even width (RoPE rotates pairs).'
    )
  if not 0.0 < config.boundary.target_rate < 1.0:
    raise UserError(f'config.boundary.target_rate={config.boundary.target_rate} must be in (0, 1).')
  if config.model.kind == 'hierarchical' and config.model.capacity < 2:
    raise UserError(
        f'config.model.capacity={config.model.capacity} must be at least 2 (first and last '
        'chunk); about 2 * target_rate * seq_len is a safe size.'
    )
  if not 0.0 <= config.estimator.gamma <= 1.0:
    raise UserError(f'config.estimator.gamma={config.estimator.gamma} must be in [0, 1].')
  est = config.estimator
  baseline = est.get('baseline', 'batch')  # Configs saved before these fields existed still load.
  if baseline not in ('batch', 'rloo', 'value'):
    raise UserError(
        f'config.estimator.baseline={baseline!r} is not valid; use one of '
        "('batch', 'rloo', 'value')."
    )
  if baseline == 'rloo' and not (isinstance(est.rloo_k, int) and est.rloo_k >= 2):
    raise UserError(
        f'config.estimator.rloo_k={est.rloo_k!r} must be an integer >= 2 (leave-one-out '
        'needs at least two boundary draws per sequence).'
    )
  if baseline == 'value' and not 0.0 <= est.gae_lambda <= 1.0:
    raise UserError(f'config.estimator.gae_lambda={est.gae_lambda} must be in [0, 1].')
  if baseline != 'batch' and (est.kind != 'score_function' or config.model.kind != 'hierarchical'):
    raise UserError(
        f'config.estimator.baseline={baseline!r} needs estimator.kind="score_function" and '
        'model.kind="hierarchical"; set --config.estimator.baseline=batch.'
    )
  if config.optim.lr <= 0:
    raise UserError(f'config.optim.lr={config.optim.lr} must be positive.')


# The paper's reference setups (method.md): d, heads, down/mid/up, seq, batch, lr, bytes, corpus.
PAPER_SIZES = {
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
  c = base_config()
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
  c.boundary.window = 8
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
