"""Resuming a run: what its config may change against the config saved with its checkpoints.

`check` is what `checkpointing.restore` asks of each step before its state loads. A state that the
saved config built and the resuming config cannot hold is no damage: the resume is refused in one line
naming the fields that set the parameters' shapes (each tried alone by building a Trainer of the saved
config with it, `_shape_fields`). A changed config.train.steps reshapes the learning-rate schedule and
is refused unless the schedule is extended (`check_schedule`). Any other change is printed in one note.

Checkpoint storage (tokjax.checkpointing) sits below the trainer and knows none of this.
"""

import dataclasses

import ml_collections

from tokjax import checkpointing, sharding, stages
from tokjax import trainer as trainer_lib
from tokjax.errors import UserError


def check(config, mgr, *, levels: stages.Levels, extend_schedule: bool = False):
  """The `check` of `checkpointing.restore` for resuming mgr's run with config (levels: its, as its
  entry point resolved them): (saved config, step, fits) -> None.

  A step whose state does not fit and whose saved config differs raises UserError naming the fields
  that set the shapes; one whose state does not fit under the same config is left to restore as
  damage. A fitting step is refused when config.train.steps changed without extend_schedule, and
  otherwise its changes are printed in one note.
  """

  def check_step(saved, step: int, fits: bool) -> None:
    changes = config_changes(saved, config, levels=levels)
    if not fits:
      if changes:
        raise UserError(_misfit(mgr, saved, config, changes))
      return
    check_schedule(saved, config, step, extend_schedule)
    if changes:
      print(f'note: resuming with a changed config ({"; ".join(changes)}).', flush=True)

  return check_step


# Sections a resumed run may change freely: how long and how often it runs and saves (train), and the
# device layout (the state restores onto any mesh).
RUN_CONTROL = ('train', 'mesh')


_ABSENT = object()


def _differences(saved, config) -> list[tuple[str, object, object]]:
  """(dotted field, saved value, value now) of each field outside `RUN_CONTROL` whose value differs
  between the saved config and config (tuples and JSON's lists compare equal; a field only one has
  is `_ABSENT` in the other)."""

  def plain(v):
    if isinstance(v, (dict, ml_collections.ConfigDict)):
      return {k: plain(x) for k, x in v.items()}
    return tuple(plain(x) for x in v) if isinstance(v, (list, tuple)) else v

  def walk(a, b, name):
    if isinstance(a, dict) and isinstance(b, dict):
      for k in sorted(set(a) | set(b)):
        yield from walk(a.get(k, _ABSENT), b.get(k, _ABSENT), f'{name}.{k}')
    elif a != b:
      yield name, a, b

  a, b = plain(saved), plain(config)
  return [
      d
      for k in sorted(set(a) | set(b))
      if k not in RUN_CONTROL
      for d in walk(a.get(k, _ABSENT), b.get(k, _ABSENT), k)
  ]


def config_changes(saved, config, *, levels: stages.Levels) -> list[str]:
  """'config.F: A saved, B now' for each field F outside `RUN_CONTROL` whose value differs between
  the saved config and config (tuples and JSON's lists compare equal; a field only one has is
  'absent' in the other). levels: config's (`stages.resolve`)."""
  shown = lambda v: 'absent' if v is _ABSENT else repr(v)
  differences = _differences(saved, config)
  if _same_stages(saved, levels):
    # A stage section that now inherits what it used to set (or the reverse) changes nothing.
    differences = [d for d in differences if not d[0].startswith('stages.')]
  return [f'config.{f}: {shown(a)} saved, {shown(b)} now' for f, a, b in differences]


def _same_stages(saved, levels: stages.Levels) -> bool:
  """Whether the saved config resolves to the same stages as levels (where each value came from
  aside)."""

  def bare(resolved):
    return [dataclasses.replace(s, sources=stages.Settings()) for s in resolved]

  try:
    # The saved config is another config than the resuming one: its levels are resolved here.
    return bare(stages.resolve(saved)) == bare(levels)
  except UserError:
    return False


def _shape_fields(saved, config) -> list[tuple[str, object, object]]:
  """The differences between saved and config (`_differences`) that alone give the saved config
  other parameter shapes: each is tried on a copy of the saved config (on config's mesh)."""
  mesh = sharding.make_mesh(config.mesh)

  def shapes(c):
    try:
      return checkpointing.leaf_shapes(trainer_lib.Trainer(c, mesh).abstract_state.params)
    except UserError:  # The field alone makes no valid config: it is not the one to name.
      return None

  def saved_with(dotted=None, value=None):
    c = saved.copy_and_resolve_references()
    c.mesh = config.mesh.copy_and_resolve_references()
    if dotted:
      *parents, leaf = dotted.split('.')
      node = c
      for p in parents:
        node = node[p]
      node[leaf] = value
    return c

  plain = lambda v: v is not _ABSENT and not isinstance(v, dict)
  before = shapes(saved_with())
  return [
      (dotted, a, b)
      for dotted, a, b in _differences(saved, config)
      if before is not None
      and plain(a)
      and plain(b)
      and shapes(saved_with(dotted, b)) not in (None, before)
  ]


def _misfit(mgr, saved, config, changes: list[str]) -> str:
  """The one line for a resume whose config builds parameters of other shapes than the run's
  (changes: `config_changes`)."""
  fields = _shape_fields(saved, config)
  if not fields:
    return (
        f'the run in {mgr.directory} was trained with another config, and its checkpoints do not '
        f'fit this one ({"; ".join(changes)}); resume with the saved '
        'values, or train this config in a new --config.train.workdir.'
    )
  shown = ', '.join(f'config.{f}={a!r} ({b!r} now)' for f, a, b in fields)
  flags_ = ' '.join(f'--config.{f}={a}' for f, a, _ in fields)
  return (
      f'the run in {mgr.directory} was trained with {shown}, which sets the shapes of its '
      f'parameters; resume with {flags_}, or train this config in a new --config.train.workdir.'
  )


def check_schedule(saved, config, step: int, extend: bool) -> None:
  """A resume from `step` whose config.train.steps differs from the run's reshapes the learning-rate
  schedule (`trainer.learning_rate_schedule` decays to train.steps): UserError unless `extend`,
  then a note on what the schedule becomes. Nothing to say when no step is left to train."""
  old, new = saved.train.steps, config.train.steps
  if old == new or step >= new:
    return
  was = float(trainer_lib.learning_rate_schedule(saved.optim, old)(step))
  now = float(trainer_lib.learning_rate_schedule(config.optim, new)(step))
  end = config.optim.lr * config.optim.min_lr_factor
  if not extend:
    raise UserError(
        f'the run was trained with config.train.steps={old} and this resume asks for {new}, which '
        f'reshapes its learning-rate schedule from step {step} on (the rate there becomes '
        f'{now:.3g}, not {was:.3g}); resume with --config.train.steps={old}, or pass '
        f'--extend_schedule to decay the schedule to step {new} instead.'
    )
  print(
      f'note: --extend_schedule: the learning-rate schedule now decays by cosine to {end:.3g} at '
      f'step {new} instead of step {old}; at step {step} the rate goes from {was:.3g} to '
      f'{now:.3g}.',
      flush=True,
  )
