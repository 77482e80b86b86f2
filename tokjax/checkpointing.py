"""Orbax checkpoints of a run: saving, and validated restoring to resume training (what a resumed
run's config may change is tokjax.resuming's, which restore calls back; opening a saved run for
inspection is tokjax.inspection's). Storage sits below the trainer: it builds no model.

A checkpoint step directory holds `state` (restorable onto any mesh: pass an abstract state whose
leaves carry the target shardings), `data` (the train iterator's state, so a resumed run sees exactly
the batches an uninterrupted run would) and `config` (JSON, so tools can rebuild the model; read back
by `read_config` in this version's fields, whichever version saved it: tokjax/config/saved.py).
Orbax writes each step to a temporary folder and renames it when complete, so an interrupted save
never leaves a half-written step that `latest_step` would pick.

Restoring validates each step it tries: a step whose items are missing or fail to load (a truncated
array file, a missing `_METADATA`, a missing or unreadable config, an emptied data-iterator file) is
reported in one line naming the step and the bad item, and the next older step is tried, unless a
step was demanded (`step=`), which then either loads or raises UserError.
"""

import errno
import logging
import os
import re
import sys

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp

from tokjax import paths
from tokjax.config import defaults as config_defaults
from tokjax.config import saved as config_saved
from tokjax.errors import UserError


class BadStep(Exception):
  """A checkpoint step that cannot be used; the message names the step's bad item."""


def manager(workdir: str, keep: int = 2, create: bool = True) -> ocp.CheckpointManager:
  """The run's checkpoints/ folder; workdir may be a local path or a URL (see tokjax.paths)."""
  return ocp.CheckpointManager(
      paths.resolve(paths.absolute(paths.join(workdir, 'checkpoints'))),
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create),
  )


class SaveFailed(Exception):
  """A checkpoint save whose write failed (disk full, no permission); the steps saved before it are
  intact. cause: the OS error, e.g. 'No space left on device (ENOSPC)'; last: the newest intact
  step (None when there is none)."""

  def __init__(self, step: int, directory, cause: str, last: int | None):
    super().__init__(f'saving checkpoint step {step} in {directory} failed: {cause}')
    self.step, self.cause, self.last = step, cause, last


def save(mgr, step: int, state, data_iterator, config) -> None:
  """Saves step synchronously: it is complete on disk when this returns.

  A write that fails (an OSError: disk full, no permission) raises SaveFailed and leaves no partial
  step; orbax's own reports of it (an error log with a traceback from each of its writer threads)
  are dropped, since SaveFailed says the same in one line. Any other error propagates as it is.
  """
  items = dict(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config.to_dict()))
  if data_iterator is not None:
    items['data'] = grain.checkpoint.CheckpointSave(data_iterator)
  last = mgr.latest_step()  # Orbax deletes old steps only after a save completes.
  held, hooks = _HeldLogs(), (sys.unraisablehook, sys.excepthook)
  ignore_abandoned_io()
  failed_writes = _FailedWriteLogs()
  logging.getLogger('asyncio').addFilter(failed_writes)
  with held:
    try:
      mgr.save(step, args=ocp.args.Composite(**items), force=True)
      mgr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      cause = write_failure(e)
      if cause is None:
        sys.unraisablehook, sys.excepthook = hooks
        logging.getLogger('asyncio').removeFilter(failed_writes)
        raise
      held.records.clear()
      _remove_partial(mgr, step)
      raise SaveFailed(step, mgr.directory, cause, last) from None
  # A failed save keeps them: its writes end later.
  sys.unraisablehook, sys.excepthook = hooks
  logging.getLogger('asyncio').removeFilter(failed_writes)


class _FailedWriteLogs(logging.Filter):
  """Drops asyncio's 'exception was never retrieved' reports of orbax writes that failed or were
  abandoned (each with a traceback, when the garbage collector finds their futures): the save's
  SaveFailed already says it in one line. Other asyncio reports still show."""

  def filter(self, record):
    exc = record.exc_info[1] if record.exc_info else None
    return exc is None or (write_failure(exc) is None and not _abandoned(exc))


class _HeldLogs(logging.Filter):
  """Holds back the log records of a save, to show them after it unless it failed."""

  def __init__(self):
    super().__init__()
    self.records: list[logging.LogRecord] = []

  def filter(self, record):
    self.records.append(record)
    return False

  def __enter__(self):
    logging.getLogger('absl').addFilter(self)
    return self

  def __exit__(self, *exc):
    logging.getLogger('absl').removeFilter(self)
    for record in self.records:
      logging.getLogger(record.name).handle(record)


_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def write_failure(e: BaseException | None) -> str | None:
  """The OS error under a failed save, e.g. 'No space left on device (ENOSPC)', or None when e has
  none. Python's writes raise OSError; tensorstore's (the arrays) raise ValueError with the code in
  its text: "... Failed to write ... [os_error_code='28']"."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    code = e.errno if isinstance(e, OSError) else None
    found = _OS_ERROR_CODE.search(str(e))
    code = code or (int(found.group(1)) if found else None)
    if code:
      return f'{os.strerror(code)} ({errno.errorcode.get(code, code)})'
    e = e.__cause__ or e.__context__
  return None


def _remove_partial(mgr, step: int) -> None:
  """Deletes what a failed save of step left (orbax's temporary folder), freeing its space."""
  try:
    for path in mgr.directory.iterdir():
      if path.name.startswith(f'{step}.orbax-checkpoint-tmp'):
        paths.rmtree(path)
  except OSError:
    pass  # A disk that fails its writes may fail this too; restoring skips such folders.


_ABANDONED = (
    (RuntimeError, 'Event loop is closed'),
    (ImportError, 'sys.meta_path is None'),
    # The other reads of a restore that failed on one array (their text embeds tensorstore's specs).
    (Exception, 'Encountered error while reading array index'),
)


def _abandoned(exc) -> bool:
  return any(isinstance(exc, t) and text in str(exc) for t, text in _ABANDONED)


def ignore_abandoned_io() -> None:
  """When one write fails, orbax leaves its other writes' coroutines pending on an event loop it
  has closed: each reports 'Event loop is closed' when its write ends (during the save or after
  it), and again when the interpreter exits; a restore that fails on one array leaves its other
  reads to report their own errors when collected. These reports (up to hundreds of tracebacks)
  are dropped while a save runs and, once a save or restore has failed, for good; every other one
  still shows."""

  abandoned = _abandoned
  unraisable, excepthook = sys.unraisablehook, sys.excepthook
  if getattr(unraisable, 'drops_abandoned_writes', False):
    return

  def on_unraisable(arg):
    if not abandoned(arg.exc_value):
      unraisable(arg)

  def on_exception(kind, value, tb):
    if not abandoned(value):
      excepthook(kind, value, tb)

  on_unraisable.drops_abandoned_writes = True  # type: ignore[attr-defined]
  sys.unraisablehook, sys.excepthook = on_unraisable, on_exception


def step_problem(step_dir, items=('state', 'config')) -> str | None:
  """Why a step folder (a local path or URL) is not a complete tokjax checkpoint (naming the bad
  item), or None."""
  step_dir = paths.resolve(step_dir)
  if not (step_dir / 'commit_success.txt').exists():
    return 'has no commit_success.txt marker (the save did not finish)'
  for item in items:
    if not (step_dir / item).is_dir():
      return f'lacks its "{item}" item'
  if 'state' in items and not (step_dir / 'state' / '_METADATA').exists():
    return 'lacks state/_METADATA (the state item is incomplete)'
  if 'config' in items and not (step_dir / 'config' / 'metadata').exists():
    return 'lacks config/metadata (the config item is incomplete)'
  if 'data' in items:
    files = [f for f in (step_dir / 'data').iterdir() if f.name.endswith('.json')]
    if not files or any(f.stat().length == 0 for f in files):
      return 'has an empty or missing data-iterator file in its "data" item'
  return None


def first_line(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f'{type(e).__name__}: {text[0][:200]}' if text else type(e).__name__


def _load_item(mgr, step: int, item: str, args):
  """Restores one item of step, or raises BadStep naming it."""
  try:
    return getattr(mgr.restore(step, args=ocp.args.Composite(**{item: args})), item)
  except Exception as e:  # pylint: disable=broad-except
    ignore_abandoned_io()
    # Orbax, tensorstore and grain raise many types for damaged files; all mean "this item is bad".
    raise BadStep(f'its "{item}" item fails to load ({first_line(e)})') from None


def drop_foreign_sections(saved: dict) -> dict:
  """saved (a config as a dict) without the settings of boundary methods this process has not
  registered and the config does not use.

  A method added in the user's own file (README, "Extending tokjax") puts its section
  config.boundary.NAME into every config built while it is imported, whichever method trains; a
  command that restores such a checkpoint without that import must still read it.
  """
  boundary = saved.get('boundary')
  if not isinstance(boundary, dict):
    return saved
  known = config_defaults.base_config().boundary
  keep = lambda section: {
      k: v
      for k, v in section.items()
      if k in known or not isinstance(v, dict) or k == section.get('method')
  }
  out = {**saved, 'boundary': keep(boundary)}
  stages = saved.get('stages')
  if isinstance(stages, dict):  # Each stage's section (config.stages.sK) has one per method too.
    out['stages'] = {
        name: {**own, 'boundary': keep(own['boundary'])}
        if isinstance(own, dict) and isinstance(own.get('boundary'), dict)
        else own
        for name, own in stages.items()
    }
  return out


def read_config(mgr, step: int) -> ml_collections.ConfigDict:
  """The config saved with step, in this version's fields (`tokjax.config.saved.upgrade`: a field
  added since takes its default, a renamed one moves). Every reader of a saved config comes here.

  Raises BadStep when the config item is missing or unreadable, and UserError naming a saved field
  that this version does not know (every step of the run has it: no older step is tried).
  """
  problem = step_problem(mgr.directory / str(step), items=('config',))
  if problem:
    raise BadStep(problem)
  cfg = _load_item(mgr, step, 'config', ocp.args.JsonRestore())
  if not isinstance(cfg, dict) or 'model' not in cfg:
    raise BadStep('its "config" item holds no tokjax config')
  try:
    return config_saved.upgrade(drop_foreign_sections(cfg))
  except UserError as e:
    raise UserError(f'checkpoint step {step} in {mgr.directory}: {e}') from None


def leaf_shapes(tree) -> dict[str, tuple]:
  """{'params.decoder.block_0...': shape} of a pytree of arrays, abstract arrays or orbax metadata."""
  name = lambda k: str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k))))
  return {
      '.'.join(map(name, path)): tuple(leaf.shape)
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


def _state_fits(mgr, step: int, abstract_state) -> bool:
  """Whether the state item of step holds arrays of abstract_state's tree and shapes, read from its
  metadata alone (a restore that does not fit fails in orbax's threads, each with a traceback)."""
  try:
    saved = ocp.StandardCheckpointHandler().metadata(mgr.directory / str(step) / 'state')
  except Exception as e:  # pylint: disable=broad-except
    raise BadStep(f'its "state" item fails to load ({first_line(e)})') from None
  return leaf_shapes(saved.tree) == leaf_shapes(abstract_state)


def steps_to_try(mgr, step: int | None) -> list[int]:
  steps = sorted(mgr.all_steps(), reverse=True)
  if step is None:
    return steps
  if step not in steps:
    raise UserError(
        f'{mgr.directory} has no checkpoint of step {step}; it has steps {sorted(steps)}.'
    )
  return [step]


def warn_fallback(mgr, step: int, why: str, rest: list[int]) -> None:
  nxt = f'using step {rest[0]} instead' if rest else 'no older step is left'
  print(
      f'warning: checkpoint step {step} in {mgr.directory} is unusable: {why}; {nxt}.', flush=True
  )


def restore(mgr, abstract_state, data_iterator=None, step=None, *, check=None):
  """Restores (state, step) from `step`, or from the latest step that loads; advances
  data_iterator in place. Damaged steps are reported and skipped (see the module docstring).

  check: what the run that resumes asks of each step before its state loads (`resuming.check`),
  called as check(saved config, step, fits) where fits says whether the step's state fits
  abstract_state. It raises UserError to refuse the resume before any checkpoint is read further or
  skipped (a state that the saved config built and the resuming one cannot hold is no damage), and
  may print what changed. A state that does not fit and that check lets pass is damage.

  Raises UserError when there is no checkpoint, when the demanded step is damaged, when check
  refuses, or when no step loads.
  """
  candidates = steps_to_try(mgr, step)
  if not candidates:
    raise UserError(f'no checkpoint in {mgr.directory}; train first or drop --resume.')
  items = ('state', 'config') + (('data',) if data_iterator is not None else ())
  for i, s in enumerate(candidates):
    try:
      problem = step_problem(mgr.directory / str(s), items)
      if problem:
        raise BadStep(problem)
      saved = read_config(mgr, s)
      fits = _state_fits(mgr, s, abstract_state)
      if check is not None:
        check(saved, s, fits)
      if not fits:
        raise BadStep('its "state" item holds other arrays than the model being restored')
      state = _load_item(mgr, s, 'state', ocp.args.StandardRestore(abstract_state))
      if data_iterator is not None:
        _load_item(mgr, s, 'data', grain.checkpoint.CheckpointRestore(data_iterator))
      return state, s
    except BadStep as e:
      if step is not None:
        raise UserError(
            f'checkpoint step {s} in {mgr.directory} is unusable: {e}; drop --step to use the '
            'latest complete step.'
        ) from None
      warn_fallback(mgr, s, str(e), candidates[i + 1 :])
  raise UserError(f'no checkpoint step in {mgr.directory} loads; train again.')
