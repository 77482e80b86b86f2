"""`validate(config)`: one UserError line that names the first bad field and what it accepts; it returns
the config's resolved levels (`tokjax.stages.resolve`), checked, for its caller to pass down.

What holds for every field (a finite number; a field that tokjax.config.defaults declares) is checked here;
each section of the config is checked by the code that reads it:
  data, eval                      tokjax/data/pipeline.py (`build_data` reads both)
  model, boundary, stages         tokjax/models/validation.py, on each `tokjax.stages.Stage` (a
                                  boundary method's own settings by its registry entry's `validate`)
  train, optim                    tokjax/trainer.py (train.profile_steps: tokjax/profiling.py)
  seed, optim.warmup_steps        here (`_check_counts`)
  estimator, stages' estimator    tokjax/estimator.py (a baseline's own section by its `validate`)
"""

import math

import ml_collections

from tokjax import estimator, models, profiling, stages, trainer
from tokjax.config import defaults as config_defaults
from tokjax.data import pipeline
from tokjax.errors import UserError
from tokjax.models import registry
from tokjax.models import validation as model_validation


def _non_finite(value, name):
  """(dotted name, value) of the first NaN or infinite number in value (nested dicts, lists), or
  None; an entry of a tuple is named with its index (config.mesh.rules[0])."""
  if isinstance(value, float) and not math.isfinite(value):
    return name, value
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
  """Unknown fields of config.boundary and config.estimator, whose sub-sections come from the
  registries (a field there that nothing declares would be silently ignored)."""
  base = config_defaults.base_config()
  for section in ('boundary', 'estimator'):
    for key in config[section].keys():
      if key in base[section]:
        continue
      if section == 'boundary' and key == config.boundary.method:
        registry.get(key)  # The section of the chosen method: say that the method is unknown.
      raise UserError(
          f'config.{section}.{key} is not a field; config.{section} has '
          f'{sorted(base[section].keys())}.'
      )
  template = base.stages.s1
  for name, own in config.stages.items():
    if not isinstance(own, ml_collections.ConfigDict):
      continue  # stages.resolve names what config.stages may hold.
    for part, fields in own.items():
      if part not in template or not isinstance(fields, ml_collections.ConfigDict):
        raise UserError(
            f'config.stages.{name}.{part} is not a section; a stage section has '
            f'{sorted(template.keys())}.'
        )
      for key in fields.keys():
        if key in template[part]:
          continue
        if part == 'boundary' and key == fields.get('method'):
          registry.get(key)
        raise UserError(
            f'config.stages.{name}.{part}.{key} is not a field; it has '
            f'{sorted(template[part].keys())}.'
        )


def _check_counts(config) -> None:
  """Whole numbers that must not be negative: the seeds (jax.random.PRNGKey takes none below 0) and
  optim.warmup_steps (a negative warm-up made the schedule start past its peak)."""
  for field in ('seed', 'data.split_seed', 'optim.warmup_steps'):
    value = config
    for part in field.split('.'):
      value = value[part]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      raise UserError(
          f'config.{field}={value!r} must be a whole number of at least 0; e.g. '
          f'--config.{field}=0.'
      )


def validate(config) -> stages.Levels:
  """Raises UserError naming the first bad field and what it accepts; returns config's levels
  (`stages.resolve`), which the checks read and the caller passes on, so that its entry point
  resolves them once."""
  bad = _non_finite(config.to_dict(), 'config')
  if bad:
    raise UserError(f'{bad[0]}={bad[1]!r} must be a finite number.')
  _check_sections(config)
  _check_counts(config)
  profiling.validate(config)
  pipeline.validate(config)
  model_validation.validate(config)
  levels = stages.resolve(config)  # After the count of levels is checked.
  model_validation.validate_levels(config, levels)
  trainer.validate(config)
  estimator.validate(
      config,
      levels,
      score_function=tuple(models.trains_score_function(config, st) for st in levels),
  )
  return levels
