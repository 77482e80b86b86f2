"""Checks of the config sections the model reads: config.model, config.boundary, config.stages.

Every stage is checked as the model reads it, on its `tokjax.stages.Stage`, and a bad value is named
by the field that set it (`Stage.where`: config.stages.s1.model.capacity, or config.model.capacity
where stage 1 inherits it). Each boundary method checks its own settings through its registry
entry's `validate` (tokjax/models/registry.py). tokjax/config/validation.py runs this with the other
sections' checks: `validate` on the config before its stages are resolved (their count among them),
then `validate_levels` on the resolved levels.
"""

from tokjax import stages
from tokjax.errors import UserError
from tokjax.models import registry

_CHOICES = {
    'kind': ('hierarchical', 'flat'),
    'dtype': ('float32', 'bfloat16'),
}


def _is_int(v, low: int) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v >= low


def validate(config) -> None:
  """Raises UserError naming the first bad field of config.model, config.model.stages among them:
  what `stages.resolve` needs to hold."""
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
  _validate_count(config)


def _validate_count(config) -> None:
  """config.model.stages: a count of levels that the model kind has."""
  n = stages.count(config)
  if not _is_int(n, 1):
    raise UserError(
        f'config.model.stages={n!r} must be an integer >= 1 (1 = bytes -> chunks, the paper; '
        '2 = chunks of chunks too).'
    )
  if n > 1 and config.model.kind != 'hierarchical':
    raise UserError(
        f'config.model.stages={n} needs config.model.kind="hierarchical" (a flat model has no '
        'boundaries).'
    )


def validate_levels(config, levels: stages.Levels) -> None:
  """Raises UserError naming the first bad field of a level of config's model (config.boundary,
  config.stages, the model fields each level reads); levels: config's (`stages.resolve`)."""
  for st in levels:
    _validate_stage(config, st)


def _validate_stage(config, st: stages.Stage) -> None:
  """One stage's method, rate, buffer and layers, and its method's own settings."""
  method = registry.get(st.method)
  if st.level and not method.inner_stages:
    ok = tuple(k for k, m in registry.methods().items() if m.inner_stages)
    raise UserError(
        f'{st.where("method")}={st.method!r} cannot draw boundaries over chunks (it reads bytes); '
        f'stage {st.level} accepts {ok}.'
    )
  if not (isinstance(st.target_rate, (int, float)) and 0.0 < st.target_rate < 1.0):
    raise UserError(f'{st.where("target_rate")}={st.target_rate!r} must be in (0, 1).')
  if config.model.kind == 'hierarchical' or st.level:
    for field, low in (
        ('capacity', 2),
        ('encoder_layers', 0),
        ('decoder_layers', 0),
        ('window', 0),
    ):
      value = getattr(st, field)
      if not _is_int(value, low):
        hint = (
            ' (first and last chunk); about 2 * target_rate * seq_len is a safe size'
            if (field == 'capacity')
            else ''
        )
        raise UserError(f'{st.where(field)}={value!r} must be an integer >= {low}{hint}.')
  if method.validate:
    method.validate(st)
