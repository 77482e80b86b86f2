"""The full set of config fields with their defaults, and their validation.

Config files in configs/ start from `base_config()` and change what they need; every field can be
overridden on the command line (`--config.model.d_model=256`). A config file may hold named variants
(big_vision style): `get_config(arg)` receives the text after ':' in `--config configs/x.py:NAME`,
and its `VARIANTS` dict names them (see `parse_variant`, `load`). `validate` turns a bad value into
one `UserError` line that says which field is wrong and what it accepts.
"""

import importlib.util
import math
import os

import ml_collections

from tokjax import estimator
from tokjax.errors import UserError
from tokjax.models import registry


def base_config() -> ml_collections.ConfigDict:
  """Defaults: the score-function method at CPU size on the embedded standard-library corpus."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.data = dict(
      # 'stdlib_docs' (English: the standard library's docstrings and help() topics) | 'stdlib' (its
      # source code) | 'shakespeare' | 'bible' | 'hf:fineweb' | 'hf:codeparrot' | 'prepared:DIR' | a path.
      corpus='stdlib_docs',
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
  # Stages (tokjax/models/hierarchical.py): model.stages = S levels of boundaries. Stage 0 draws chunk
  # boundaries over bytes with config.model / config.boundary; stages 1..S-1 each draw boundaries over
  # the chunks of the stage below with the settings below, one tuple entry per stage (all S - 1 long).
  # A method's own settings (config.boundary.NAME) are shared by every stage that uses it.
  c.model.stages = 1  # 1 = the paper's model (bytes -> chunks); 2 adds chunks of chunks.
  c.stages = dict(
      method=(),  # Boundary method of each stage: one that supports inner stages (registry).
      target_rate=(),  # Boundaries per position of that stage's input (per chunk of the stage below).
      capacity=(),  # Chunk buffer of each stage (>= 2; static shapes).
      encoder_layers=(),  # Layers over the stage's input chunks before its boundaries.
      decoder_layers=(),  # Layers over them after the inner stages' output is added back.
      window=(),  # Attention width of those layers in bytes (0 = full causal attention).
      # The score function of each stage (tokjax/estimator.py, `estimator.stage_settings`): one entry
      # per stage, or () for config.estimator's value at every stage (the default).
      gamma=(),
      lambda_rl=(),
      lambda_rate=(),
      baseline=(),  # 'none' | 'batch' | 'rloo' (only with estimator.baseline='rloo').
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
      reward='early_exit',  # 'early_exit' (CE_early - CE_full) | 'plain' (-CE_full).
      # 'batch' (the paper's batch-relative advantage) | 'none' | 'rloo' (leave-one-out over
      # estimator.rloo.k draws per sequence, one encoder pass) | 'value' (critic head on the encoder
      # state, GAE(gamma, estimator.value.gae_lambda)): `estimator.BASELINES`.
      baseline='batch',
      gamma=0.99,
      lambda_rl=0.01,
      lambda_rate=0.01,
      lambda_early=0.1,  # Weight of the early-exit head's CE (every hierarchical model).
      rate_loss=True,
      target_rate=target_rate,
      # Warm start: draw the first N steps' decisions from Bernoulli(r*), importance-weighted by each
      # decision's own ratio (an approximation: see tokjax/estimator.py).
      off_policy_steps=0,
      **{name: dict(b.defaults) for name, b in estimator.BASELINES.items() if b.defaults},
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
  # Memory and speed options for the paper's sizes on accelerators (tokjax/models/layers.py,
  # tokjax/train_state.py). The defaults change nothing; each is checked where it is used
  # (layers.stack_options, train_state.Trainer).
  c.model.remat = dict(encoder='none', main='none', decoder='none')  # 'none' | 'dots' | 'full'.
  c.model.scan_layers = False  # nn.scan over identical blocks (a different parameter tree).
  c.model.attention = 'blocked'  # 'blocked' | 'dot_product' | 'cudnn' (GPU, bfloat16).
  c.optim.grad_accum_steps = 1  # Micro-batches per step (divides data.batch_size).
  # Profiling at scale: jax.profiler trace of train steps N..M inclusive, written to <workdir>/profile;
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
    'estimator.reward': ('early_exit', 'plain'),
}


def drop_foreign_sections(saved: dict) -> dict:
  """saved (a config as a dict) without the settings of boundary methods this process has not
  registered and the config does not use.

  A method added in the user's own file (README, "Extending tokjax") puts its section
  config.boundary.NAME into every config built while it is imported, whichever method trains; a
  command that restores such a checkpoint without that import must still read it.
  """
  boundary = saved.get('boundary')
  if not isinstance(boundary, dict):
    return saved
  known = base_config().boundary
  kept = {
      k: v
      for k, v in boundary.items()
      if k in known or not isinstance(v, dict) or k == boundary.get('method')
  }
  return {**saved, 'boundary': kept}


def _get(config, dotted):
  for part in dotted.split('.'):
    config = config[part]
  return config


def _non_finite(value, name):
  """The dotted name of the first NaN or infinite number in value (nested dicts, lists), or None."""
  if isinstance(value, float) and not math.isfinite(value):
    return name
  if isinstance(value, (dict, ml_collections.ConfigDict)):
    for k, v in value.items():
      found = _non_finite(v, f'{name}.{k}')
      if found:
        return found
  if isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      found = _non_finite(v, f'{name}[{i}]')
      if found:
        return found
  return None


def _check_sections(config) -> None:
  """Unknown fields of config.boundary and config.estimator."""
  base = base_config()
  for section in ('boundary', 'estimator'):
    for key in config[section].keys():
      if key in base[section]:
        continue
      dotted = f'{section}.{key}'
      if section == 'boundary' and key == config.boundary.get('method'):
        registry.get(key)  # The section of the chosen method: say that the method is unknown.
      raise UserError(
          f'config.{dotted} is not a field; config.{section} has {sorted(base[section].keys())}.'
      )


STAGE_FIELDS = ('method', 'target_rate', 'capacity', 'encoder_layers', 'decoder_layers', 'window')


def stage_count(config) -> int:
  """S, the levels of boundaries (configs saved before stages existed have one)."""
  return config.model.get('stages', 1)


def stage_config(config, s: int) -> ml_collections.ConfigDict:
  """The config as stage s's boundary method reads it: for s >= 1, config.boundary.method,
  config.boundary.target_rate and config.model.capacity replaced by config.stages' entry s - 1."""
  if s == 0:
    return config
  view = config.copy_and_resolve_references()
  with view.unlocked():
    view.boundary.method = config.stages.method[s - 1]
    view.boundary.target_rate = float(config.stages.target_rate[s - 1])
    view.model.capacity = int(config.stages.capacity[s - 1])
  return view


def _validate_stages(config) -> None:
  n = stage_count(config)
  if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
    raise UserError(
        f'config.model.stages={n!r} must be an integer >= 1 (1 = bytes -> chunks, the paper; '
        '2 = chunks of chunks too).'
    )
  if n == 1:
    return
  if config.model.kind != 'hierarchical':
    raise UserError(
        f'config.model.stages={n} needs config.model.kind="hierarchical" (a flat model has no '
        'boundaries).'
    )
  st = config.stages
  for field in STAGE_FIELDS:
    if len(st[field]) != n - 1:
      raise UserError(
          f'config.stages.{field} has {len(st[field])} entries but config.model.stages={n} needs '
          f'{n - 1} (one per stage above the bytes): e.g. --config.stages.{field}="'
          f'{tuple(st[field][:1]) * (n - 1) if len(st[field]) else "(...,)"}".'
      )
  for s in range(1, n):
    i = s - 1
    method = registry.get(st.method[i])
    if not method.inner_stages:
      ok = tuple(k for k, m in registry.methods().items() if m.inner_stages)
      raise UserError(
          f'config.stages.method[{i}]={st.method[i]!r} cannot draw boundaries over chunks (it '
          f'reads bytes); stage {s} accepts {ok}.'
      )
    if not 0.0 < st.target_rate[i] < 1.0:
      raise UserError(f'config.stages.target_rate[{i}]={st.target_rate[i]!r} must be in (0, 1).')
    for field, low in (
        ('capacity', 2),
        ('encoder_layers', 0),
        ('decoder_layers', 0),
        ('window', 0),
    ):
      v = st[field][i]
      if not (isinstance(v, int) and not isinstance(v, bool) and v >= low):
        raise UserError(f'config.stages.{field}[{i}]={v!r} must be an integer >= {low}.')
    if method.validate:
      method.validate(stage_config(config, s))
  _validate_stage_estimators(config, n)
  if config.estimator.baseline == 'value':
    raise UserError(
        f'config.estimator.baseline="value" has one critic, for stage 0; with config.model.stages='
        f'{n} use "batch", "rloo" or "none" (each applies per stage).'
    )


def _validate_stage_estimators(config, n: int) -> None:
  st, est = config.stages, config.estimator
  for field in estimator.STAGE_FIELDS:
    if len(st.get(field, ())) not in (0, n - 1):
      raise UserError(
          f'config.stages.{field} has {len(st[field])} entries but config.model.stages={n} needs '
          f'{n - 1} (one per stage above the bytes) or none (config.estimator.{field} at every '
          'stage).'
      )
  draws = estimator.baseline(est.baseline).draws(est)
  for s in range(1, n):
    i, cfg = s - 1, estimator.stage_settings(config, s)
    if len(st.get('gamma', ())) and not 0.0 <= cfg.gamma <= 1.0:
      raise UserError(f'config.stages.gamma[{i}]={st.gamma[i]!r} must be in [0, 1].')
    for field in ('lambda_rl', 'lambda_rate'):
      if len(st.get(field, ())) and not cfg[field] >= 0.0:
        raise UserError(f'config.stages.{field}[{i}]={st[field][i]!r} must be >= 0.')
    if not len(st.get('baseline', ())):
      continue
    name = st.baseline[i]
    if name not in estimator.BASELINES:
      raise UserError(
          f'config.stages.baseline[{i}]={name!r} is not valid; use one of '
          f'{tuple(k for k, b in estimator.BASELINES.items() if not b.critic)}.'
      )
    b = estimator.baseline(name)
    if b.critic:
      raise UserError(
          f'config.stages.baseline[{i}]={name!r} needs a critic, and the model has one only for '
          'stage 0; use "batch", "rloo" or "none".'
      )
    if b.draws(est) not in (1, draws):
      raise UserError(
          f'config.stages.baseline[{i}]={name!r} needs {b.draws(est)} boundary draws per sequence, '
          f'which every stage shares: set config.estimator.baseline={name!r} too, or use "batch".'
      )


def validate(config) -> None:
  """Raises UserError naming the first bad field and what it accepts."""
  bad = _non_finite(config.to_dict(), 'config')
  if bad:
    raise UserError(f'{bad}={_get(config, bad[len("config."):])!r} must be a finite number.')
  for field, choices in _CHOICES.items():
    if _get(config, field) not in choices:
      raise UserError(f'config.{field}={_get(config, field)!r} is not valid; use one of {choices}.')
  _check_sections(config)
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
  if config.optim.lr <= 0:
    raise UserError(f'config.optim.lr={config.optim.lr} must be positive.')
  method = registry.get(config.boundary.method)
  if method.validate:
    method.validate(config)
  _validate_stages(config)
  est = config.estimator
  baseline = estimator.baseline(est.baseline)
  if baseline.validate:
    baseline.validate(est)
  policy_gradient = config.model.kind == 'hierarchical' and method.score_function
  if (baseline.critic or baseline.draws(est) > 1) and not policy_gradient:
    raise UserError(
        f'config.estimator.baseline={est.baseline!r} needs a hierarchical model whose boundary '
        f'method trains with the score function (boundary.method="policy"); this config has '
        f'model.kind={config.model.kind!r}, boundary.method={config.boundary.method!r}. Set '
        '--config.estimator.baseline=batch.'
    )
  if est.off_policy_steps > 0 and not policy_gradient:
    raise UserError(
        f'config.estimator.off_policy_steps={est.off_policy_steps} needs a boundary method '
        'trained with the score function (boundary.method="policy"); set it to 0.'
    )
  if policy_gradient and not est.rate_loss and config.model.capacity < config.data.seq_len:
    raise UserError(
        f'config.estimator.rate_loss=False needs config.model.capacity >= config.data.seq_len '
        f'(here {config.model.capacity} < {config.data.seq_len}): nothing holds the rate down, and '
        f'a smaller buffer caps it at about capacity / seq_len; set '
        f'--config.model.capacity={config.data.seq_len}.'
    )


# The paper's reference setups: d, heads, down/mid/up, seq, batch, lr, bytes, corpus.
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

  The stage-1 layers attend over the byte layers' 64 bytes (config.stages.window counts bytes), so
  only the main layers, one state per stage-1 chunk, reach further back: stage 1 is a bottleneck whose
  chunk ends decide what is carried past 64 bytes. With full attention there (window 0) the stage-1
  layers read every stage-0 chunk and stage 1's decisions would change the loss only at second order.
  """
  c = paper_config(size)
  c.model.stages = 2
  c.model.main_layers = main_layers
  c.stages.update(
      method=('policy',),
      target_rate=(0.5,),
      capacity=(512,),
      encoder_layers=(stage_layers,),
      decoder_layers=(stage_layers,),
      window=(c.model.byte_window,),
  )
  c.train.workdir = f'runs/paper_two_stage_{size}'
  c.data.corpus = corpus
  return c


def tiny(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a CPU config to smoke-test size in place (the experiments' --tiny): d_model 32, 1 main
  layer, L = 64, B = 4, one eval batch."""
  c.model.update(d_model=32, num_heads=2, main_layers=1, capacity=32)
  c.model.byte_window = 16 if c.model.kind == 'hierarchical' else 0
  c.data.update(seq_len=64, batch_size=4)
  c.eval.update(batch_size=4, max_batches=1)
  c.optim.warmup_steps = 2
  return c


def parse_variant(arg, variants, default: str) -> tuple[str, set[str]]:
  """'NAME' or 'NAME,tiny' (the text after ':' in --config FILE:ARG) -> (NAME, {'tiny'}).

  variants: the names the file offers; default: the name when arg is None or empty.
  """
  name, *options = (arg or default).split(',')
  if name not in variants:
    raise UserError(f'unknown config variant {name!r}; use one of {",".join(variants)}.')
  unknown = set(options) - {'tiny'}
  if unknown:
    raise UserError(f'unknown config option(s) {sorted(unknown)} after {name!r}; use "tiny".')
  return name, set(options)


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')


def load_module(name: str):
  """The module of configs/NAME.py (loaded by path: configs/ is not a package)."""
  path = os.path.join(CONFIGS_DIR, name + '.py')
  spec = importlib.util.spec_from_file_location(f'tokjax_configs_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """get_config(arg) of configs/NAME.py: what `--config configs/NAME.py:ARG` gives tokjax.train."""
  module = load_module(name)
  return module.get_config() if arg is None else module.get_config(arg)
