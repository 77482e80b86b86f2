"""Opening a saved run for inspection: `load_checkpoint` rebuilds the model and its Trainer from a run
folder's saved config and restores the params of one step (the latest that loads, by default), for
evaluate, segment, sample, lm_eval, export and the lab; `load_config` reads only the config.

Saving, reading a step's items and restoring a run to resume training are tokjax.checkpointing's;
its step checks and one-line reports serve here too, so a damaged step is reported and skipped the
same way (see its docstring).
"""

import dataclasses
import functools

import jax
import ml_collections
import orbax.checkpoint as ocp

from tokjax import checkpointing, paths, sharding, stages
from tokjax import evaluator as evaluator_lib
from tokjax import trainer as trainer_lib
from tokjax.config import validation as config_validation
from tokjax.errors import UserError


@dataclasses.dataclass
class Checkpoint:
  """A restored run: its saved config, a Trainer rebuilt from it, the params and the step."""

  config: ml_collections.ConfigDict
  trainer: trainer_lib.Trainer
  params: dict
  step: int
  path: str

  @property
  def model(self):
    return self.trainer.model

  @property
  def levels(self) -> stages.Levels:
    """The saved config's levels, resolved once when the run was opened (`stages.resolve`)."""
    return self.trainer.levels

  def steps(self) -> list[int]:
    """The run folder's checkpoint steps, ascending."""
    return sorted(inspection_manager(self.path).all_steps())

  def at(self, step: int) -> 'Checkpoint':
    """Another step of the same run, restored with this one's trainer (no rebuild, no recompile)."""
    try:
      return _load_step(inspection_manager(self.path), self.path, step, None, self.trainer)
    except checkpointing.BadStep as e:
      raise UserError(f'checkpoint step {step} of {self.path} is unusable: {e}.') from None

  @functools.cached_property
  def evaluator(self) -> evaluator_lib.Evaluator:
    """The run's evaluator (its forwards compile once per checkpoint)."""
    return evaluator_lib.Evaluator(self.trainer)


def inspection_manager(path: str) -> ocp.CheckpointManager:
  """A read-only manager of the run folder `path` (or its checkpoints/ folder; a local path or URL)."""
  folder = paths.resolve(paths.absolute(path))
  if not folder.exists():
    raise UserError(
        f'checkpoint folder {path} does not exist; pass the run folder '
        '(config.train.workdir) of a training run.'
    )
  if not folder.is_dir():
    raise UserError(f'--checkpoint {path} is a file; pass the run folder (config.train.workdir).')
  sub = folder / 'checkpoints'
  root = sub if sub.is_dir() else folder
  steps = [d for d in root.iterdir() if d.name.isdigit() and d.is_dir()]
  if not steps:
    raise UserError(
        f'{path} holds no checkpoint (no step folders in {root}); train first with '
        '`python -m tokjax.train --config.train.workdir=DIR`.'
    )
  return ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(create=False))


def load_config(checkpoint_dir: str):
  """The config saved with the latest readable checkpoint of a run folder (or its checkpoints/ folder).

  Returns (config: ConfigDict, manager: a read-only CheckpointManager, step: int).
  """
  mgr = inspection_manager(checkpoint_dir)
  for i, s in enumerate(checkpointing.steps_to_try(mgr, None)):
    try:
      return checkpointing.read_config(mgr, s), mgr, s
    except checkpointing.BadStep as e:
      checkpointing.warn_fallback(mgr, s, str(e), sorted(mgr.all_steps(), reverse=True)[i + 1 :])
  raise UserError(
      f'{checkpoint_dir} holds no complete checkpoint (empty or partly written); '
      'point at a run folder with a finished save.'
  )


def inspection_mesh(config):
  """The run's own mesh when this machine's devices can form it, else all of them on the data axis.

  A run trained on a pod slice (say data 16 x fsdp 4) is often inspected on a workstation: inspection
  needs only the parameters, and the state restores onto any mesh (tests/test_sharding.py), so the
  layout falls back instead of failing. config.mesh is updated to the mesh used.
  """
  try:
    return sharding.make_mesh(config.mesh)
  except UserError as e:
    print(
        f"note: the run's mesh does not fit {jax.device_count()} device(s) here ({e}); "
        'using data=-1, fsdp=1, tensor=1.'
    )
    config.mesh.update(data=-1, fsdp=1, tensor=1)
    return sharding.make_mesh(config.mesh)


def _reason(e: Exception) -> str:
  """e's message on one line (a KeyError's str is its key's repr, and ml_collections adds a
  suggestion on a second line)."""
  text = (str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)).strip()
  line = text.splitlines()[0] if text else type(e).__name__
  return f'no field {line.strip(chr(39))!r}' if isinstance(e, KeyError) else line


def _load_step(mgr, path: str, step: int, mesh, trainer=None) -> Checkpoint:
  """One step of a run folder restored for inspection, or checkpointing.BadStep naming what is wrong.

  trainer: reuse this one (another step of the same run) instead of building one from the config.
  """
  problem = checkpointing.step_problem(mgr.directory / str(step))
  if problem:
    raise checkpointing.BadStep(problem)
  config = checkpointing.read_config(mgr, step)
  if trainer is not None:
    config = trainer.config
  else:
    try:
      levels = config_validation.validate(config)
      mesh = inspection_mesh(config) if mesh is None else mesh
      trainer = trainer_lib.Trainer(config, mesh, levels=levels)
    except (KeyError, AttributeError, TypeError, UserError) as e:
      # Not damage: every step of the run holds this config, so no older step is tried.
      raise UserError(
          f'checkpoint step {step} in {mgr.directory}: its saved config does not build a model in '
          f'this version of tokjax ({_reason(e)}).'
      ) from None
  try:
    state = mgr.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(trainer.abstract_state))
    ).state
  except (ValueError, KeyError, TypeError) as e:
    checkpointing.ignore_abandoned_io()
    if 'shape' in str(e).lower() or isinstance(e, (KeyError, TypeError)):
      raise checkpointing.BadStep(
          f'its "state" item does not fit its saved config ({checkpointing.first_line(e)}): the folder mixes '
          'runs'
      ) from None
    raise checkpointing.BadStep(
        f'its "state" item fails to load ({checkpointing.first_line(e)})'
    ) from None
  except Exception as e:  # pylint: disable=broad-except
    checkpointing.ignore_abandoned_io()
    raise checkpointing.BadStep(
        f'its "state" item fails to load ({checkpointing.first_line(e)})'
    ) from None
  want = jax.tree.map(lambda x: x.shape, trainer.abstract_state.params)
  got = jax.tree.map(lambda x: x.shape, state.params)
  if want != got:
    raise checkpointing.BadStep(
        'its "state" item has other parameter shapes than its saved config builds'
    )
  return Checkpoint(config=config, trainer=trainer, params=state.params, step=int(step), path=path)


def load_checkpoint(path: str, step: int | None = None, mesh=None) -> Checkpoint:
  """Restores the params of `step` (default: the latest step that loads) of the run folder `path`.

  A damaged latest step is reported on one line and the next older one is used; a demanded step
  that is damaged, a missing or empty folder, or a folder whose steps all fail raise UserError.
  mesh: default `inspection_mesh` of the saved config.
  """
  mgr = inspection_manager(path)
  candidates = checkpointing.steps_to_try(mgr, step)
  for i, s in enumerate(candidates):
    try:
      return _load_step(mgr, path, s, mesh)
    except checkpointing.BadStep as e:
      if step is not None or len(candidates) == 1:
        hint = (
            'drop --step to use the latest complete step'
            if step is not None
            else 'no other step to fall back to: train again'
        )
        raise UserError(
            f'checkpoint step {s} in {mgr.directory} is unusable: {e}; {hint}.'
        ) from None
      checkpointing.warn_fallback(mgr, s, str(e), candidates[i + 1 :])
  raise UserError(f'no checkpoint step in {path} loads; train again.')


def eval_key(config):
  """The key the trainer evaluates with (train.train splits PRNGKey(seed) into init, train, eval)."""
  return jax.random.split(jax.random.PRNGKey(config.seed), 3)[2]
