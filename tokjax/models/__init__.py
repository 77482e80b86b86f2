"""Model construction from a config and its resolved levels: `build_model(config, levels=...)` (its
training objective: losses.objective).

Each stage's boundary method comes from the registry (tokjax/models/registry.py) by its
`tokjax.stages.Stage` (the caller's `stages.resolve(config)`, resolved once at its entry point).
Every model built here is an `interface.ByteLM`: callers read its stages, init arguments and modes
from the model and its `interface.ModelOutput`, never config.model.kind.
"""

import jax.numpy as jnp

from tokjax import estimator, stages
from tokjax.models import flat, hierarchical, layers, registry
from tokjax.vocab import VOCAB_SIZE

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def build_boundary(config, stage: stages.Stage):
  """The boundary module of `stage`, built from its method's registry entry."""
  return registry.get(stage.method).build(stage, config)


def trains_score_function(config, stage: stages.Stage) -> bool:
  """Whether `stage`'s boundaries are trained by the score function (with `Stage.estimator`):
  config's model builds it (`num_stages`) and its boundary method's registry entry says
  score_function."""
  return stage.level < num_stages(config) and registry.get(stage.method).score_function


def trains_critic(config, *, levels: stages.Levels) -> bool:
  """Whether the model needs its value head: stage 0 trains with the score function under a critic
  baseline (only stage 0 has one). levels: config's (`stages.resolve`)."""
  first = levels[0]
  return (
      trains_score_function(config, first) and estimator.baseline(first.estimator.baseline).critic
  )


def build_model(config, *, levels: stages.Levels):
  """config.model.kind: 'flat' (FlatByteLM) or 'hierarchical' (HierarchicalByteLM); levels: config's
  (`stages.resolve`, resolved by the caller's entry point)."""
  m = config.model
  dtype = DTYPES[m.dtype]
  opts = layers.stack_options(m)  # Remat, scanned layers, attention: checked here (UserError).
  if m.kind == 'flat':
    return flat.FlatByteLM(
        vocab_size=VOCAB_SIZE,
        d_model=m.d_model,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        mlp_hidden=m.mlp_ratio * m.d_model,
        window=levels[0].window,  # The flat model's one stage, built by no one, holds its window.
        dtype=dtype,
        remat=opts['remat']['main'],
        scan_layers=opts['scan_layers'],
        attention=opts['attention'],
    )
  return hierarchical.HierarchicalByteLM(
      vocab_size=VOCAB_SIZE,
      d_model=m.d_model,
      num_heads=m.num_heads,
      main_layers=m.main_layers,
      levels=tuple(level(config, st) for st in levels),
      byte_mlp_ratio=m.byte_mlp_ratio,
      main_mlp_ratio=m.main_mlp_ratio,
      dtype=dtype,
      value_head=trains_critic(config, levels=levels),
      remat=hierarchical.Remat(**opts['remat']),
      scan_layers=opts['scan_layers'],
      attention=opts['attention'],
      train_length=int(config.data.seq_len),
  )


def level(config, stage: stages.Stage) -> hierarchical.Level:
  """HierarchicalByteLM's level of `stage` (`stages.resolve`)."""
  return hierarchical.Level(
      boundary=build_boundary(config, stage),
      capacity=int(stage.capacity),
      encoder_layers=int(stage.encoder_layers),
      decoder_layers=int(stage.decoder_layers),
      window=int(stage.window),
  )


def num_stages(config) -> int:
  """`interface.ByteLM.num_stages` of config's model without building it: 0 for the flat model."""
  return 0 if config.model.kind == 'flat' else stages.count(config)


def init_args(config, batch_size: int, seq_len: int):
  """Dummy arguments for model.init of config's model without building it: (tokens,) or (tokens,
  key), as `interface.ByteLM.init_args`."""
  import jax  # pylint: disable=g-import-not-at-top

  tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
  return (tokens, jax.random.PRNGKey(0)) if num_stages(config) else (tokens,)
