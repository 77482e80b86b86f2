"""Model construction from a config: `build_model(config)` (its training objective: losses.objective).

Each stage's boundary method comes from the registry (tokjax/models/registry.py) by its
`tokjax.stages.Stage` (`stages.resolve(config)`).
Every model built here is an `interface.ByteLM`: callers read its stages, init arguments and modes
from the model and its `interface.ModelOutput`, never config.model.kind.
"""

import jax.numpy as jnp

from tokjax import estimator, stages
from tokjax.models import flat, hierarchical, layers, registry
from tokjax.vocab import VOCAB_SIZE

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def build_boundary(config, stage: stages.Stage | None = None):
  """The boundary module of `stage` (default: config's stage 0), built from its method's registry
  entry."""
  stage = stages.get(config, 0) if stage is None else stage
  return registry.get(stage.method).build(stage, config)


def trains_score_function(config, s: int) -> bool:
  """Whether stage s's boundaries are trained by the score function (with `Stage.estimator`):
  config's model has a stage s (`num_stages`) and its boundary method's registry entry says
  score_function."""
  return s < num_stages(config) and registry.get(stages.get(config, s).method).score_function


def trains_critic(config) -> bool:
  """Whether the model needs its value head: stage 0 trains with the score function under a critic
  baseline (only stage 0 has one)."""
  return trains_score_function(config, 0) and estimator.baseline(config.estimator.baseline).critic


def build_model(config):
  """config.model.kind: 'flat' (FlatByteLM) or 'hierarchical' (HierarchicalByteLM)."""
  m = config.model
  levels = stages.resolve(config)
  dtype = DTYPES[m.dtype]
  opts = layers.stack_options(m)  # Remat, scanned layers, attention: checked here (UserError).
  if m.kind == 'flat':
    return flat.FlatByteLM(
        vocab_size=VOCAB_SIZE,
        d_model=m.d_model,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        mlp_hidden=m.mlp_ratio * m.d_model,
        window=m.byte_window,
        dtype=dtype,
        remat=opts['remat']['main'],
        scan_layers=opts['scan_layers'],
        attention=opts['attention'],
    )
  return hierarchical.HierarchicalByteLM(
      vocab_size=VOCAB_SIZE,
      d_model=m.d_model,
      num_heads=m.num_heads,
      encoder_layers=levels[0].encoder_layers,
      main_layers=m.main_layers,
      decoder_layers=levels[0].decoder_layers,
      boundary=build_boundary(config, levels[0]),
      byte_window=levels[0].window,
      byte_mlp_ratio=m.byte_mlp_ratio,
      main_mlp_ratio=m.main_mlp_ratio,
      capacity=levels[0].capacity,
      dtype=dtype,
      value_head=trains_critic(config),
      remat=tuple(opts['remat'][s] for s in ('encoder', 'main', 'decoder')),
      scan_layers=opts['scan_layers'],
      attention=opts['attention'],
      inner_stages=inner_stages(config),
  )


def inner_stages(config) -> tuple[hierarchical.StageSettings, ...]:
  """HierarchicalByteLM's stages 1..S-1 (`stages.resolve`): () for one stage."""
  return tuple(
      hierarchical.StageSettings(
          boundary=build_boundary(config, st),
          capacity=int(st.capacity),
          encoder_layers=int(st.encoder_layers),
          decoder_layers=int(st.decoder_layers),
          window=int(st.window),
      )
      for st in stages.resolve(config)[1:]
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
