"""A config saved by an earlier version of tokjax, read as this version's: `upgrade`.

A checkpoint keeps the config it was trained with (JSON, `tokjax.checkpointing.save`). Read as saved,
it lacks every field added since, and the code that reads such a field fails. So every reader of a
saved config (`tokjax.checkpointing.read_config`: resume, evaluate, segment, sample, lm_eval, the
lab's rescoring) lays it onto today's `base_config()`:
  - a field added since takes its default. A new field's default therefore keeps what the code did
    before the field existed (optim.policy_lr_factor=1.0: the policy learns at the LM's rate);
  - a field renamed since moves to its new place by `MIGRATIONS`, one entry per old name with the
    commit that renamed it;
  - a field that this version does not know and no migration names is one UserError line naming it
    (a run saved by a newer or a modified tokjax).
"""

import dataclasses
import re
from typing import Any, Callable

import ml_collections

from tokjax.config import defaults as config_defaults
from tokjax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Migration:
  """config.`old`, renamed to config.`new` by `commit` (new=None: removed, its value dropped).

  convert(old value, saved config as a dict) -> the new field's value; default: the old value.
  """

  old: str
  new: str | None
  commit: str
  convert: Callable[[Any, dict], Any] | None = None


def _baseline_of(batch_relative, saved: dict) -> str:
  """estimator.batch_relative=False switched the batch baseline off; other baselines ignored it."""
  baseline = saved.get('estimator', {}).get('baseline', 'batch')
  return 'none' if batch_relative is False and baseline == 'batch' else baseline


# config.stages before its per-stage sections: one tuple per field, entry K - 1 for stage K
# (estimator fields may be empty: every stage read config.estimator's). Field -> (section, field) of
# config.stages.sK.
_STAGE_TUPLES = {
    'method': ('boundary', 'method'),
    'target_rate': ('boundary', 'target_rate'),
    'capacity': ('model', 'capacity'),
    'encoder_layers': ('model', 'encoder_layers'),
    'decoder_layers': ('model', 'decoder_layers'),
    'window': ('model', 'byte_window'),
    'reward': ('estimator', 'reward'),
    'baseline': ('estimator', 'baseline'),
    'gamma': ('estimator', 'gamma'),
    'lambda_rl': ('estimator', 'lambda_rl'),
    'lambda_rate': ('estimator', 'lambda_rate'),
}


def _stage_sections(stages: dict, saved: dict) -> dict:
  """config.stages' tuples as the sections s1, s2, ... (a config saved with sections: unchanged).

  An entry equal to the top level's value is kept: it reads the same, and it stays the stage's own
  if the top level changes on a resume.
  """
  del saved
  if not isinstance(stages, dict) or not set(stages) & set(_STAGE_TUPLES):
    return stages
  sections: dict[str, dict[str, dict]] = {}
  for field, values in stages.items():
    part, name = _STAGE_TUPLES[field]
    for i, value in enumerate(values):
      sections.setdefault(f's{i + 1}', {}).setdefault(part, {})[name] = value
  return sections


def _saved_before_causal_bpe(boundary: dict) -> bool:
  """Whether a saved config.boundary comes from before the causal 'bpe' (which added bpe.context)."""
  return 'context' not in (boundary.get('bpe') or {})


def _bpe_as_oracle(boundary: dict) -> dict:
  """A boundary section (top level or a stage's) with method 'bpe' and its settings as 'bpe_oracle'."""
  boundary = dict(boundary)
  if 'bpe' in boundary:
    boundary['bpe_oracle'] = boundary.pop('bpe')
  if boundary.get('method') == 'bpe':
    boundary['method'] = 'bpe_oracle'
  return boundary


def _oracle_boundary(boundary, saved: dict):
  """'bpe' cut chunks at the whole window's token starts until it became causal; that rule is
  'bpe_oracle' now, so a run saved before keeps the boundaries it was trained with."""
  del saved
  if not isinstance(boundary, dict) or not _saved_before_causal_bpe(boundary):
    return boundary
  return _bpe_as_oracle(boundary)


def _oracle_stages(sections, saved: dict):
  """`_oracle_boundary` for each stage section of a config saved before the causal 'bpe' (read after
  `_oracle_boundary` moved the top level's bpe section, so an old config has none left)."""
  if not isinstance(sections, dict) or not _saved_before_causal_bpe(saved.get('boundary', {})):
    return sections
  return {
      name: (
          {**section, 'boundary': _bpe_as_oracle(section['boundary'])}
          if isinstance(section, dict) and isinstance(section.get('boundary'), dict)
          else section
      )
      for name, section in sections.items()
  }


# Every rename of a saved field, oldest first. A commit that renames or removes a field adds its entry
# here, and tests/test_saved_configs.py loads a config saved before it.
MIGRATIONS = (
    # Boundary methods and estimator baselines got their own sections (registry entries).
    Migration('boundary.window', 'boundary.policy.window', '3911346'),
    Migration('boundary.scale', 'boundary.policy.scale', '3911346'),
    Migration('boundary.temperature', 'boundary.gumbel.temperature', '3911346'),
    Migration('boundary.prior_weight', 'boundary.gumbel.prior_weight', '3911346'),
    Migration('boundary.ratio_weight', 'boundary.hnet.ratio_weight', '3911346'),
    Migration('boundary.bpe_tokenizer', 'boundary.bpe.tokenizer', '3911346'),
    Migration('estimator.rloo_k', 'estimator.rloo.k', '3911346'),
    Migration('estimator.gae_lambda', 'estimator.value.gae_lambda', '3911346'),
    Migration('estimator.value_weight', 'estimator.value.weight', '3911346'),
    Migration('estimator.batch_relative', 'estimator.baseline', '3911346', _baseline_of),
    # Whether a method trains by the score function is its registry entry's `score_function` now.
    Migration('estimator.kind', None, '3911346'),
    # Per-stage settings moved from parallel tuples to one section per stage (tokjax/stages.py).
    Migration('stages', 'stages', '73d1a58', _stage_sections),
    # 'bpe' became causal; the whole-window token starts it had are 'bpe_oracle'.
    Migration('boundary', 'boundary', 'f2b2ddc', _oracle_boundary),
    Migration('stages', 'stages', 'f2b2ddc', _oracle_stages),
)


def moved(dotted: str) -> Migration | None:
  """The last migration that renamed or removed config.`dotted` (None if none did, or if the name
  is still a field there), so that a command line with an old name can say where it lives now."""
  found = [m for m in MIGRATIONS if m.old == dotted and m.new != dotted]
  return found[-1] if found else None


def _pop(tree: dict, dotted: str):
  """Removes and returns tree[a][b]... for dotted 'a.b...' (KeyError when absent)."""
  *parents, leaf = dotted.split('.')
  for p in parents:
    tree = tree[p]
  return tree.pop(leaf)


def _put(tree: dict, dotted: str, value) -> None:
  *parents, leaf = dotted.split('.')
  for p in parents:
    tree = tree.setdefault(p, {})
  tree[leaf] = value


def _has(tree: dict, dotted: str) -> bool:
  for p in dotted.split('.'):
    if not isinstance(tree, dict) or p not in tree:
      return False
    tree = tree[p]
  return True


def migrate(saved: dict) -> dict:
  """saved (a config as a dict, e.g. read from a checkpoint) with `MIGRATIONS` applied (a copy)."""
  copy: Callable[[Any], Any] = (
      lambda v: {k: copy(x) for k, x in v.items()} if isinstance(v, dict) else v
  )
  out = copy(saved)
  for m in MIGRATIONS:
    if not _has(out, m.old):
      continue
    value = _pop(out, m.old)
    if m.new is not None:
      _put(out, m.new, value if m.convert is None else m.convert(value, out))
  return out


def _plain(value):
  """JSON's lists as the config's tuples, at every depth (config.mesh.rules)."""
  if isinstance(value, list):
    return tuple(_plain(v) for v in value)
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  return value


def _unset(value) -> bool:
  """Whether a saved stage section (or one of its fields) sets nothing: every leaf None."""
  if isinstance(value, dict):
    return all(_unset(v) for v in value.values())
  return value is None


def _merge(target: ml_collections.ConfigDict, saved: dict, name: str) -> None:
  for key, value in saved.items():
    field = f'{name}.{key}'
    if key not in target:
      is_boundary = name == 'config.boundary' or re.fullmatch(
          r'config\.stages\.s\d+\.boundary', name
      )
      if is_boundary and key == saved.get('method') and isinstance(value, dict):
        # The section of a method this process has not registered: validation says which import
        # registers it.
        target[key] = value
        continue
      if name == 'config.stages' and re.fullmatch(r's[1-9]\d*', key) and isinstance(value, dict):
        target[key] = config_defaults.stage_section()  # A stage above those the defaults declare.
      elif name.startswith('config.stages.') and _unset(value):
        continue  # A stage's section of a method this process has not registered, overriding nothing.
      else:
        raise UserError(
            f'the saved {field} is not a field of this version of tokjax, and no migration in '
            'tokjax/config/saved.py names it (a run saved by a newer or a modified tokjax); read '
            'it with the version that trained it.'
        )
    if isinstance(target[key], ml_collections.ConfigDict):
      if not isinstance(value, dict):
        raise UserError(f'the saved {field}={value!r} must be a section (a dict of fields).')
      _merge(target[key], value, field)
      continue
    try:
      target[key] = value
    except TypeError:
      raise UserError(
          f'the saved {field}={value!r} is not of the type this version reads '
          f'({type(target[key]).__name__}, default {target[key]!r}).'
      ) from None


def upgrade(saved: dict) -> ml_collections.ConfigDict:
  """The config of a saved run in this version's fields: base_config() with the saved values laid
  over it after `migrate` (see the module docstring). A config of this version comes back equal.

  Raises UserError naming a saved field that this version does not know.
  """
  config = config_defaults.base_config()
  _merge(config, _plain(migrate(saved)), 'config')
  return config
