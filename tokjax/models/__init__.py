"""Model construction from a config: `build_model(config)` and the matching objective."""

import functools

import jax.numpy as jnp

from tokjax import losses
from tokjax.data import VOCAB_SIZE
from tokjax.models import boundaries, flat, hierarchical, layers

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def build_boundary(config):
  """The boundary method named by config.boundary.method."""
  b, m = config.boundary, config.model
  if b.method == 'policy':
    return boundaries.BoundaryPolicy(
        target_rate=b.target_rate, window=b.window, scale=b.scale, capacity=m.capacity
    )
  from tokjax.models import rivals  # pylint: disable=g-import-not-at-top

  return rivals.build(config)


def build_model(config):
  """config.model.kind: 'flat' (FlatByteLM) or 'hierarchical' (HierarchicalByteLM)."""
  m = config.model
  dtype = DTYPES[m.dtype]
  opts = layers.stack_options(m)  # Remat, scanned layers, attention: checked here (UserError).
  if m.kind == 'flat':
    return flat.FlatByteLM(
        VOCAB_SIZE,
        m.d_model,
        m.num_layers,
        m.num_heads,
        m.mlp_ratio * m.d_model,
        m.byte_window,
        dtype,
        opts['remat']['main'],
        opts['scan_layers'],
        opts['attention'],
    )
  return hierarchical.HierarchicalByteLM(
      VOCAB_SIZE,
      m.d_model,
      m.num_heads,
      m.encoder_layers,
      m.main_layers,
      m.decoder_layers,
      build_boundary(config),
      byte_window=m.byte_window,
      byte_mlp_ratio=m.byte_mlp_ratio,
      main_mlp_ratio=m.main_mlp_ratio,
      capacity=m.capacity,
      dtype=dtype,
      value_head=config.estimator.get('baseline', 'batch') == 'value',
      remat=tuple(opts['remat'][s] for s in ('encoder', 'main', 'decoder')),
      scan_layers=opts['scan_layers'],
      attention=opts['attention'],
  )


def init_args(config, batch_size: int, seq_len: int):
  """Dummy arguments for model.init: (tokens,) or (tokens, key)."""
  import jax  # pylint: disable=g-import-not-at-top

  tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
  return (tokens,) if config.model.kind == 'flat' else (tokens, jax.random.PRNGKey(0))


def objective(config, model, mode: str = 'sample'):
  """(params, batch, key, step) -> (loss, (metrics, ce float32[B, L])) for this config's model."""
  if config.model.kind == 'flat':
    return functools.partial(losses.flat_objective, model)
  return functools.partial(losses.hierarchical_objective, model, cfg=config, mode=mode)
