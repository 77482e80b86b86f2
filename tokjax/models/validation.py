"""Checks of the config sections the model reads: config.model, config.boundary, config.stages.

Each boundary method checks its own section through its registry entry's `validate`
(tokjax/models/registry.py); `validate` here checks the rest and calls those, for stage 0 and for
every stage above it (on `stage_views.stage_config`). tokjax/config/validation.py runs it with the
other sections' checks.
"""

from tokjax.errors import UserError
from tokjax.models import registry, stage_views

_CHOICES = {
    'kind': ('hierarchical', 'flat'),
    'dtype': ('float32', 'bfloat16'),
}


def _is_int(v, low: int) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v >= low


def validate(config) -> None:
  """Raises UserError naming the first bad field of config.model, config.boundary, config.stages."""
  m = config.model
  for field, choices in _CHOICES.items():
    if m[field] not in choices:
      raise UserError(f'config.model.{field}={m[field]!r} is not valid; use one of {choices}.')
  for field in ('d_model', 'num_heads'):
    if not m[field] > 0:
      raise UserError(f'config.model.{field}={m[field]!r} must be a positive number.')
  if m.d_model % m.num_heads or (m.d_model // m.num_heads) % 2:
    raise UserError(
        f'config.model.d_model={m.d_model} must split into num_heads={m.num_heads} heads of even '
        'width (RoPE rotates pairs).'
    )
  if not 0.0 < config.boundary.target_rate < 1.0:
    raise UserError(f'config.boundary.target_rate={config.boundary.target_rate} must be in (0, 1).')
  if m.kind == 'hierarchical' and m.capacity < 2:
    raise UserError(
        f'config.model.capacity={m.capacity} must be at least 2 (first and last chunk); about '
        '2 * target_rate * seq_len is a safe size.'
    )
  method = registry.get(config.boundary.method)
  if method.validate:
    method.validate(config)
  _validate_stages(config)


def _validate_stages(config) -> None:
  """config.model.stages and the model fields of config.stages (`stage_views.STAGE_FIELDS`)."""
  n = stage_views.stage_count(config)
  if not _is_int(n, 1):
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
  for field in stage_views.STAGE_FIELDS:
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
      if not _is_int(st[field][i], low):
        raise UserError(f'config.stages.{field}[{i}]={st[field][i]!r} must be an integer >= {low}.')
    if method.validate:
      method.validate(stage_views.stage_config(config, s))
