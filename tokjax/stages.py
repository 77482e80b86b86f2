"""The levels of boundaries of a model, each resolved once from the config: `resolve(config)`.

Stage 0 draws chunk boundaries over bytes; stage s >= 1 draws them over the chunks of stage s - 1
(tokjax/models/hierarchical.py nests them). `resolve` returns one frozen `Stage` per level
(config.model.stages of them, bytes included) holding everything that level reads: its boundary
method and that method's own settings, its target rate, chunk buffer, layer counts, attention window
and score-function settings. Models, losses, the trainer, flops, decoding, the evaluator and the
checks read `stage.x`; nothing else reads config.stages.

Resolved once at each door: `tokjax.config.validation.validate` returns the levels it checked, the
Trainer holds them (`Trainer.levels`, resolving them itself only when its caller has none), and an
opened run has them (`inspection.Checkpoint.levels`); every library function below takes them as
`levels=` (or one `Stage`) and never resolves again (tests/test_stages.py counts and greps for it).

On the config side the top-level sections are every stage's settings, and config.stages.sK (K = 1 ..
S - 1, declared in tokjax/config/defaults.py) holds only what stage K changes: stages.sK.SECTION.FIELD
left None is config.SECTION.FIELD. The fields a stage may change are `OVERRIDES`, plus its method's
own settings, stages.sK.boundary.METHOD.FIELD over config.boundary.METHOD.FIELD. So
`--config.stages.s1.estimator.gamma=0.9` changes stage 1's discount alone, and
`--config.model.stages=2` alone gives a second stage that copies the first.
"""

import collections.abc
import dataclasses
import re
from typing import Any

import ml_collections

from tokjax.errors import UserError

# The one table of per-stage fields: `Stage` attribute (estimator.F: `EstimatorSettings`.F) -> the
# config.SECTION.FIELD it reads, which config.stages.sK.SECTION.FIELD overrides for stage K. The
# override list (`OVERRIDES`, the fields of config.stages.sK) derives from it. model.byte_window is an
# inner stage's window too: every window counts bytes, whatever the layers read.
PER_STAGE = {
    'method': ('boundary', 'method'),
    'target_rate': ('boundary', 'target_rate'),
    'capacity': ('model', 'capacity'),
    'encoder_layers': ('model', 'encoder_layers'),
    'decoder_layers': ('model', 'decoder_layers'),
    'window': ('model', 'byte_window'),
    'estimator.reward': ('estimator', 'reward'),
    'estimator.baseline': ('estimator', 'baseline'),
    'estimator.gamma': ('estimator', 'gamma'),
    'estimator.lambda_rl': ('estimator', 'lambda_rl'),
    'estimator.lambda_rate': ('estimator', 'lambda_rate'),
}
OVERRIDES = {
    section: tuple(f for s, f in PER_STAGE.values() if s == section)
    for section in dict.fromkeys(s for s, _ in PER_STAGE.values())
}
_SECTION = re.compile(r's([1-9][0-9]*)')


def _is_section(value) -> bool:
  return isinstance(value, (collections.abc.Mapping, ml_collections.ConfigDict))


class Settings(collections.abc.Mapping):
  """A frozen mapping whose keys read as attributes too (`settings.window`), nested mappings frozen
  as well; hashable, so a flax module may hold one. (ml_collections' FrozenConfigDict is hashable
  too, but it is no Mapping and equals no plain dict: `**settings` and `settings == {...}` fail.)"""

  def __init__(self, items=()):
    items = items.items() if _is_section(items) else items
    frozen = {k: Settings(v) if _is_section(v) else v for k, v in dict(items).items()}
    object.__setattr__(self, '_items', frozen)

  def __getitem__(self, key):
    return self._items[key]

  def __getattr__(self, key):
    try:
      return self._items[key]
    except KeyError:
      raise AttributeError(key) from None

  def __setattr__(self, key, value):
    raise AttributeError(f'Settings are frozen; cannot set {key!r}')

  def __iter__(self):
    return iter(self._items)

  def __len__(self):
    return len(self._items)

  def __hash__(self):
    return hash(tuple(sorted(self._items.items())))

  def __eq__(self, other):
    return isinstance(other, collections.abc.Mapping) and dict(self.items()) == dict(other.items())

  def __repr__(self):
    return f'Settings({self._items!r})'


@dataclasses.dataclass(frozen=True)
class EstimatorSettings:
  """The score function of one stage (tokjax/estimator.py reads it as it reads config.estimator).

  reward, baseline, gamma, lambda_rl, lambda_rate: the stage's own; target_rate: the stage's;
  lambda_early, rate_loss, off_policy_steps and the baselines' sections (`baselines`, e.g.
  `settings.baselines['rloo'].k`; `estimator.baseline_settings` reads them) are shared by every
  stage.
  """

  reward: str
  baseline: str
  gamma: float
  lambda_rl: float
  lambda_rate: float
  target_rate: float
  lambda_early: float
  rate_loss: bool
  off_policy_steps: int
  baselines: Settings = Settings()


# config.estimator fields every stage shares (a stage cannot change them): the rest of
# EstimatorSettings' fields.
SHARED_ESTIMATOR = tuple(
    f.name
    for f in dataclasses.fields(EstimatorSettings)
    if f'estimator.{f.name}' not in PER_STAGE and f.name not in ('target_rate', 'baselines')
)


@dataclasses.dataclass(frozen=True)
class Stage:
  """One level of boundaries as the code reads it (see the module docstring).

  level: s (0 draws over bytes). method: its boundary method (a registry name); settings: that
  method's own (config.boundary.METHOD with the stage's overrides). target_rate: boundaries per
  position of its input (per byte at level 0, per chunk of level s - 1 above). capacity: its chunk
  buffer. encoder_layers, decoder_layers: its layers before its boundaries and after the level above
  is added back (byte layers at level 0, chunk layers above). window: their attention width in bytes
  (0: full causal attention). estimator: its score function. sources: the dotted config field each
  value came from, for messages (`where`).
  """

  level: int
  method: str
  settings: Settings
  target_rate: float
  capacity: int
  encoder_layers: int
  decoder_layers: int
  window: int
  estimator: EstimatorSettings
  sources: Settings = dataclasses.field(default=Settings(), repr=False)

  def where(self, field: str) -> str:
    """The config field that sets `field` ('capacity', 'estimator.gamma', 'settings.window') at
    this stage: its own section's where it sets one, else the top level's."""
    return self.sources[field]


# What `resolve` returns: every level of a config, level 0 first.
Levels = tuple[Stage, ...]


def count(config) -> int:
  """S, the levels of boundaries (config.model.stages)."""
  return config.model.stages


def section_name(level: int) -> str:
  """The name of level s's section of config.stages ('s1' for level 1)."""
  return f's{level}'


def _get(section, key):
  """section[key], or None where the section or the field is absent."""
  if section is None or key not in section:
    return None
  return section[key]


def _check_sections(config, n: int) -> None:
  """config.stages holds sections s1, s2, ... and none above s{n - 1} sets a field."""
  sections = _get(config, 'stages') or {}
  for name in sections.keys():
    match = _SECTION.fullmatch(name)
    if not match:
      raise UserError(
          f'config.stages.{name} is not a stage section; config.stages holds s1, s2, ... (stage '
          'K over the chunks of stage K - 1), e.g. --config.stages.s1.boundary.target_rate=0.33.'
      )
    if not _is_section(sections[name]):
      raise UserError(
          f'config.stages.{name}={sections[name]!r} must be a section (defaults.stage_section()).'
      )
    level = int(match.group(1))
    if level < n:
      continue
    for field, value in _flat(sections[name], f'config.stages.{name}'):
      if value is not None:
        raise UserError(
            f'{field}={value!r} is set but config.model.stages={n} has no stage {level}; set '
            f'--config.model.stages={level + 1} or leave it unset.'
        )


def _flat(section, prefix):
  for key, value in section.items():
    if _is_section(value):
      yield from _flat(value, f'{prefix}.{key}')
    else:
      yield f'{prefix}.{key}', value


def _plain(section) -> dict:
  """A config section as a plain dict (references resolved)."""
  out = {}
  for key, value in section.items():
    out[key] = _plain(value) if _is_section(value) else value
  return out


def _resolve_one(config, level: int) -> Stage:
  own = None if level == 0 else _get(_get(config, 'stages'), section_name(level))
  prefix = f'config.stages.{section_name(level)}'
  values: dict[str, Any] = {}
  sources: dict[str, str] = {}

  def pick(attr, section, field):
    value = _get(_get(own, section), field)
    if value is not None:
      values[attr], sources[attr] = value, f'{prefix}.{section}.{field}'
    else:
      values[attr], sources[attr] = config[section][field], f'config.{section}.{field}'

  for attr, (section, field) in PER_STAGE.items():
    pick(attr, section, field)
  method = values['method']
  top = config.boundary[method] if method in config.boundary else {}
  mine = _get(_get(own, 'boundary'), method) or {}
  settings = {}
  for field, value in _plain(top).items():
    settings[field], sources[f'settings.{field}'] = value, f'config.boundary.{method}.{field}'
  for field, value in _plain(mine).items():
    if value is not None:
      settings[field] = value
      sources[f'settings.{field}'] = f'{prefix}.boundary.{method}.{field}'
  est = config.estimator
  estimator = EstimatorSettings(
      **{f: values.pop(f'estimator.{f}') for f in OVERRIDES['estimator']},
      target_rate=values['target_rate'],
      **{f: est[f] for f in SHARED_ESTIMATOR},
      baselines=Settings({k: _plain(v) for k, v in est.items() if _is_section(v)}),
  )
  sources['estimator.target_rate'] = sources['target_rate']
  return Stage(
      level=level,
      settings=Settings(settings),
      estimator=estimator,
      sources=Settings(sources),
      **values,
  )


def resolve(config) -> Levels:
  """One `Stage` per level of config's model, level 0 (over bytes) first: config.model.stages of
  them (one for the flat model too, whose stage nothing builds).

  Raises UserError for a config.stages entry that is no stage section, or a section above the
  model's stages that sets a field. The values themselves are checked by the code that reads them
  (tokjax/models/validation.py, tokjax/estimator.py), which name each by `Stage.where`.
  """
  n = count(config)
  _check_sections(config, n)
  return tuple(_resolve_one(config, s) for s in range(n))


def get(config, level: int) -> Stage:
  """resolve(config)[level]."""
  return resolve(config)[level]
