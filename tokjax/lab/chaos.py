r"""Fault injection: SIGKILL a training run at random moments, resume it each time, and check that it
ends exactly where an uninterrupted run of the same config ends.

  python -m tokjax.lab.chaos [--kills 5] [--seed 0] [--workdir DIR] \
      [--config tokjax/lab/chaos_config.py] [--config.train.steps=40 ...]

First the config trains uninterrupted in DIR/uninterrupted; its timeline (compile time, time per
step, time per checkpoint save) calibrates the kills. Then the same config trains in DIR/chaos, and
each of --kills launches gets a real SIGKILL at a moment of one of four kinds (each kind as often as
the others, order and moments drawn with --seed):

  compile       after the run reports itself running (status.json), within the time the latest
                launch took from then to its first logged step (the uninterrupted run's, at first),
                and at the latest at its first logged step
  mid_step      a random fraction of a step time after a random step up to the next checkpoint is
                logged (its train row in metrics.jsonl)
  during_save   while orbax writes the next checkpoint (in the first half of a typical save)
  after_save    a random fraction of a step time after the next checkpoint is complete

and is resumed with `--resume` (a launch killed before any checkpoint existed starts again from
scratch in an emptied folder, as a user would). The last launch runs to the end. The check: every
leaf of the final train state (parameters, optimizer state, step, counters) is bitwise equal to the
uninterrupted run's, and metrics.jsonl holds each (step, split) once, in order, with equal values
(wall-clock fields such as bytes_per_s excepted). Prints one line per kill and a verdict, writes
DIR/chaos.json (every launch's events, read from the run's files: status.json, metrics.jsonl and
the checkpoint folders, never its console), and exits 1 at the first difference, described in one
line. A temporary DIR is removed after a clean result. The default config logs every step and saves
every 5 of its 30 steps, so that kills land in every phase; a config of your own should do the same.
"""

import dataclasses
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags
import jax
from ml_collections import config_flags
import numpy as np
import orbax.checkpoint as ocp

from tokjax import cli, metric_writers
from tokjax.errors import UserError

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'chaos_config.py')
KINDS = ('compile', 'mid_step', 'during_save', 'after_save')

if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CONFIG = config_flags.DEFINE_config_file(
      'config', DEFAULT_CONFIG, 'Training config, overridable with --config.* as for tokjax.train.'
  )
  _KILLS = flags.DEFINE_integer('kills', 5, 'How many times to SIGKILL the run before it finishes.')
  _SEED = flags.DEFINE_integer('seed', 0, 'Seed of the kill kinds and moments.')
  _WORKDIR = flags.DEFINE_string(
      'workdir',
      '',
      'Folder for both runs (default: a temporary one, removed after a clean result).',
  )
  _REFERENCE_ARGS = flags.DEFINE_string(
      'reference_args',
      '',
      'Extra tokjax.train flags for the uninterrupted run only: a differing reference (e.g. '
      '--config.seed=1) shows that the check fails.',
  )
  _LAUNCH_TIMEOUT = flags.DEFINE_float(
      'launch_timeout', 3600.0, 'Seconds one training launch may run before it counts as hung.'
  )

_TMP_STEP = re.compile(r'^(\d+)\.orbax-checkpoint-tmp')
_ABSL_LOG = re.compile(r'^[IWEF]\d{4} ')  # absl's log lines, e.g. orbax's INFO lines.


@dataclasses.dataclass
class Launch:
  """One training process: its events, in seconds after it started."""

  command: list[str]
  resumed_from: int | None  # Latest complete checkpoint step when it started (None: from scratch).
  # status.json first names this process as running: data loaded, model built, compile next.
  started: float | None = None
  steps: dict[int, float] = dataclasses.field(default_factory=dict)  # Train rows of metrics.jsonl.
  save_start: dict[int, float] = dataclasses.field(default_factory=dict)  # Temporary folder seen.
  save_done: dict[int, float] = dataclasses.field(default_factory=dict)  # Step folder seen.
  kind: str | None = None
  kill_note: str = ''
  killed_at: float | None = None
  last_step_at_kill: int | None = None
  checkpoint_at_kill: int | None = None  # Latest complete checkpoint step when killed.
  saving_at_kill: list[int] = dataclasses.field(default_factory=list)
  returncode: int | None = None
  wall: float = 0.0
  last_line: str = ''


@dataclasses.dataclass
class Calibration:
  """Phase durations of the uninterrupted run, in seconds."""

  compile_s: float  # The run's start (status.json) to its first logged step.
  step_s: float  # Median time between logged steps, per step.
  save_s: float  # Median time a checkpoint's temporary folder lived.


def _listdir(path: str) -> list[str]:
  try:
    return os.listdir(path)
  except FileNotFoundError:
    return []


def _stamp(folder: str, name: str) -> tuple[int, int] | None:
  """(inode, mtime) of folder/name: a folder deleted and made again, or written, gets a new one."""
  try:
    st = os.stat(os.path.join(folder, name))
  except FileNotFoundError:
    return None
  return st.st_ino, st.st_mtime_ns


def latest_step(workdir: str) -> int | None:
  """Latest complete checkpoint step of a run folder (orbax renames a step folder when complete)."""
  steps = [int(n) for n in _listdir(os.path.join(workdir, 'checkpoints')) if n.isdigit()]
  return max(steps, default=None)


def _status(workdir: str) -> dict | None:
  """The run's status.json (see `tokjax.train.write_status`), or None before the first one."""
  try:
    with open(os.path.join(workdir, 'status.json')) as f:
      return json.load(f)
  except FileNotFoundError:
    return None


def _size_stamp(path: str) -> tuple[int, int, int] | None:
  """(inode, size, mtime) of a file: a line appended within one mtime tick still changes it."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return None
  return st.st_ino, st.st_size, st.st_mtime_ns


def _train_steps(path: str, after: int) -> list[int]:
  """Steps of the train rows of a metrics.jsonl after step `after` (a line still being written is
  left for the next look)."""
  try:
    with open(path) as f:
      text = f.read()
  except FileNotFoundError:
    return []
  steps = []
  for line in text.split('\n')[:-1]:
    try:
      row = json.loads(line)
    except ValueError:
      continue  # A row cut by a kill: not this launch's (a resume rewrites the log first).
    if row.get('split') == 'train' and row['step'] > after:
      steps.append(row['step'])
  return steps


def _last_line(log_path: str) -> str:
  """The last line of a launch's output that is not an absl log line (the error, if it failed)."""
  with open(log_path, errors='replace') as f:
    lines = [line.strip() for line in f if line.strip() and not _ABSL_LOG.match(line)]
  return lines[-1] if lines else ''


def launch(command, workdir, log_path, trigger=None, timeout=3600.0) -> Launch:
  """Runs a training command, records its events, and SIGKILLs it once trigger(rec, now) says so.

  The events come from the run's files, not its console: its start from status.json (once it names
  this process), each logged step from the train rows of metrics.jsonl (which a resume has cut back
  to its checkpoint by then), and the saves from orbax's folders under checkpoints/.

  Args:
    command: the tokjax.train command line.
    workdir: its config.train.workdir (its files are watched there).
    log_path: where its stdout and stderr go.
    trigger: None (run to the end) or a function of (Launch, seconds since start) returning a
      description of the moment to kill at, or None to wait.
    timeout: seconds after which the process is killed and reported as hung.

  Returns:
    The Launch record; returncode is -9 when it was killed.
  """
  ckpt = os.path.join(workdir, 'checkpoints')
  metrics = os.path.join(workdir, 'metrics.jsonl')
  rec = Launch(command=list(command), resumed_from=latest_step(workdir))
  present = {n for n in _listdir(ckpt) if n.isdigit()}
  # Temporary folders of saves that an earlier kill cut, until deleted or written again.
  stale = {n: _stamp(ckpt, n) for n in _listdir(ckpt) if _TMP_STEP.match(n)}
  seen = None  # `_size_stamp` of metrics.jsonl when last read.
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  start = time.monotonic()
  with open(log_path, 'w') as log:
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    while proc.poll() is None:
      now = time.monotonic() - start
      if rec.started is None and (_status(workdir) or {}).get('pid') == proc.pid:
        rec.started = now
      if rec.started is not None and _size_stamp(metrics) != seen:
        seen = _size_stamp(metrics)
        for step in _train_steps(metrics, rec.resumed_from or 0):
          rec.steps.setdefault(step, now)
      names = _listdir(ckpt)
      for name in names:
        if name in stale and _stamp(ckpt, name) != stale[name]:
          del stale[name]  # Orbax reuses a step's temporary folder name: this is a new save.
        if name in present or name in stale:
          continue
        if m := _TMP_STEP.match(name):
          rec.save_start.setdefault(int(m.group(1)), now)
        elif name.isdigit():
          rec.save_done.setdefault(int(name), now)
      for name in [n for n in stale if n not in names]:
        del stale[name]  # Deleted: the next folder of that name is a new save.
      present &= set(names)  # A discarded step saved again is a new save.
      note = trigger(rec, now) if trigger else None
      if note is None and now > timeout:
        note = f'hung: still running after {timeout:.0f}s'
      if note is not None:
        os.kill(proc.pid, signal.SIGKILL)
        rec.killed_at, rec.kill_note = now, note
        rec.last_step_at_kill = max(rec.steps, default=None)
        rec.checkpoint_at_kill = latest_step(workdir)
        rec.saving_at_kill = sorted(
            int(m.group(1)) for n in _listdir(ckpt) if n not in stale and (m := _TMP_STEP.match(n))
        )
        proc.wait()
        break
      time.sleep(0.002)
  rec.returncode, rec.wall = proc.returncode, time.monotonic() - start
  rec.last_line = _last_line(log_path)
  return rec


def calibrate(ref: Launch) -> Calibration:
  if ref.started is None or not ref.steps:
    raise UserError(
        'the uninterrupted run reported no start (status.json) or no logged train steps '
        '(metrics.jsonl) to time the kills by; log more often (--config.train.log_every=1).'
    )
  steps = sorted(ref.steps)
  per_step = [(ref.steps[b] - ref.steps[a]) / (b - a) for a, b in zip(steps, steps[1:])] or [
      ref.steps[steps[0]] - ref.started
  ]
  saves = [ref.save_done[s] - t for s, t in ref.save_start.items() if s in ref.save_done]
  return Calibration(
      compile_s=ref.steps[steps[0]] - ref.started,
      step_s=statistics.median(per_step),
      save_s=statistics.median(saves) if saves else 0.0,
  )


def checkpoint_steps(config) -> list[int]:
  total, every = config.train.steps, config.train.checkpoint_every
  return sorted(set(range(every, total + 1, every)) | {total})


def make_trigger(kind, rng: random.Random, cal: Calibration, config, resumed: int):
  """(kind, kill trigger for `launch`): the trigger's target and delay drawn from rng.

  Targets lie before or at the next checkpoint after `resumed`, so that each kill moves the run on
  by at most one checkpoint and many kills fit in one run. An after-save kill with no checkpoint
  left before the last one kills during the last save instead (killing after it ends the run).
  """
  total, u = config.train.steps, rng.random()
  following = next(s for s in checkpoint_steps(config) if s > resumed)
  if kind == 'after_save' and following == total:
    kind = 'during_save'
  if kind == 'compile':
    delay = u * cal.compile_s

    def trigger(rec, now):
      if rec.started is not None and now >= rec.started + delay:
        return f'{delay:.2f}s after the run started ({u:.0%} of the expected compile time)'
      if rec.steps:  # Compiled sooner than expected (a warm compilation cache): still no progress.
        return f'at the first logged step ({min(rec.steps)}), before the drawn {delay:.2f}s'

  elif kind == 'mid_step':
    last = min(following, total - 1)
    logged = [s for s in range(resumed + 1, last + 1) if s % config.train.log_every == 0]
    target, delay = rng.choice(logged or [following]), u * cal.step_s

    def trigger(rec, now):
      if target in rec.steps and now >= rec.steps[target] + delay:
        return f'{delay:.2f}s after step {target} was logged ({u:.0%} of a step)'

  elif kind == 'during_save':
    # Within the first half of a typical save, so that most of these kills find the save running.
    target, delay = following, u * cal.save_s / 2

    def trigger(rec, now):
      if target in rec.save_done:  # Saved faster than this process could look.
        return f'just after step {target} was saved (its save ended before the kill moment)'
      if target in rec.save_start and now >= rec.save_start[target] + delay:
        return f'while saving step {target}, {delay:.3f}s after its temporary folder appeared'

  elif kind == 'after_save':
    target, delay = following, u * cal.step_s

    def trigger(rec, now):
      if target in rec.save_done and now >= rec.save_done[target] + delay:
        return f'{delay:.2f}s after checkpoint step {target} was complete ({u:.0%} of a step)'

  else:
    raise ValueError(f'unknown kill kind {kind!r}; use one of {KINDS}')
  return kind, trigger


def kill_schedule(kills: int, rng: random.Random) -> list[str]:
  """`kills` kinds, each kind as often as the others (within one), in a seeded random order."""
  start = list(KINDS)
  rng.shuffle(start)  # Which kinds a short schedule (kills < 4) gets.
  kinds = [start[i % len(KINDS)] for i in range(kills)]
  rng.shuffle(kinds)
  return kinds


def read_rows(path: str) -> tuple[list[dict], str | None]:
  """The rows of a metrics.jsonl and a description of its first unreadable line (or None)."""
  if not os.path.exists(path):
    return [], f'{path} does not exist'
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      try:
        rows.append(json.loads(line))
      except ValueError:
        return rows, f'metrics.jsonl line {number} is not a JSON row: {line.strip()[:60]!r}'
  return rows, None


def _same(a, b) -> bool:
  nan = lambda x: isinstance(x, float) and math.isnan(x)
  return a == b or (nan(a) and nan(b))


def first_metrics_difference(rows: list[dict], reference: list[dict]) -> str | None:
  """One line on the first way `rows` is not the reference log: repeated or out-of-order steps,
  a different row, a different value, or missing or extra rows. None when they are the same."""
  seen: dict[tuple, int] = {}
  last = None
  for i, row in enumerate(rows, 1):
    key = (row.get('step'), row.get('split'))
    if key in seen:
      return f'metrics.jsonl row {i} repeats step {key[0]} {key[1]!r} (first at row {seen[key]})'
    if last is not None and key[0] < last:
      return f'metrics.jsonl row {i} goes back from step {last} to step {key[0]}'
    seen[key], last = i, key[0]
  for i, (row, ref) in enumerate(zip(rows, reference), 1):
    key, ref_key = (row.get('step'), row.get('split')), (ref.get('step'), ref.get('split'))
    if key != ref_key:
      return (
          f'metrics.jsonl row {i} is step {key[0]} {key[1]!r}; the uninterrupted run has step '
          f'{ref_key[0]} {ref_key[1]!r} there'
      )
    for name in sorted((set(row) | set(ref)) - {'step', 'split'}):
      if not metric_writers.is_wall_clock(name) and not _same(row.get(name), ref.get(name)):
        return (
            f'metrics.jsonl row {i} (step {key[0]} {key[1]!r}): {name} = {row.get(name)!r}, '
            f'the uninterrupted run has {ref.get(name)!r}'
        )
  if len(rows) != len(reference):
    longer, what = (rows, 'extra') if len(rows) > len(reference) else (reference, 'missing')
    first = longer[min(len(rows), len(reference))]
    return (
        f'metrics.jsonl has {len(rows)} rows, the uninterrupted run {len(reference)} (first '
        f'{what}: step {first.get("step")} {first.get("split")!r})'
    )
  return None


def load_state(workdir: str, step: int) -> dict[str, np.ndarray]:
  """Every leaf of the train state saved at `step`, by its path, as host arrays."""
  path = os.path.abspath(os.path.join(workdir, 'checkpoints', str(step), 'state'))
  with ocp.StandardCheckpointer() as ckptr:
    tree = ckptr.restore(path)
  return {
      jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)
  }


def first_state_difference(state: dict, reference: dict) -> str | None:
  """One line on the first leaf that is not bitwise equal to the reference's. None: all equal."""
  for name in sorted(set(state) | set(reference)):
    if name not in state or name not in reference:
      where = 'the uninterrupted run' if name in reference else 'the interrupted run'
      return f'state leaf {name} exists only in {where}'
    a, b = state[name], reference[name]
    if a.dtype != b.dtype or a.shape != b.shape:
      return (
          f'state leaf {name} is {a.dtype}{list(a.shape)}, uninterrupted {b.dtype}{list(b.shape)}'
      )
    if a.tobytes() != b.tobytes():
      bits = lambda x: np.ascontiguousarray(x).reshape(-1).view(np.uint8).reshape(x.size, -1)
      n = int(np.any(bits(a) != bits(b), axis=1).sum())
      gap = ''
      if np.issubdtype(a.dtype, np.number):
        gap = f', max |difference| {np.max(np.abs(a.astype(np.float64) - b)):.3g}'
      return f'state leaf {name} differs in {n} of {a.size} elements{gap}'
  return None


def _describe(i: int, n: int, rec: Launch) -> str:
  start = 'from scratch' if rec.resumed_from is None else f'resumed from step {rec.resumed_from}'
  if rec.killed_at is None:
    return f'kill {i}/{n} ({rec.kind}): launch {start} ended by itself (status {rec.returncode})'
  last = '-' if rec.last_step_at_kill is None else rec.last_step_at_kill
  saving = ', '.join(map(str, rec.saving_at_kill)) or 'none'
  return (
      f'kill {i}/{n} ({rec.kind}): launch {start}, SIGKILL at {rec.killed_at:.2f}s, '
      f'{rec.kill_note}; last logged step: {last}; checkpoint being written: {saving}'
  )


def run(config, config_path, overrides, kills, seed, workdir, reference_args=(), timeout=3600.0):
  """Runs the uninterrupted and the killed-and-resumed training; returns the first difference
  (one line) or None."""
  total = config.train.steps
  train = [sys.executable, '-m', 'tokjax.train', f'--config={config_path}', *overrides]
  ref_dir, chaos_dir = os.path.join(workdir, 'uninterrupted'), os.path.join(workdir, 'chaos')
  for d in (ref_dir, chaos_dir):
    if os.path.exists(d):
      raise UserError(f'{d} already exists; pass a new --workdir.')
  print(
      f'chaos: {kills} kills (seed {seed}) of {config_path} ({total} steps, a checkpoint every '
      f'{config.train.checkpoint_every}); runs in {workdir}',
      flush=True,
  )
  ref = launch(
      train + list(reference_args) + [f'--config.train.workdir={ref_dir}'],
      ref_dir,
      os.path.join(workdir, 'uninterrupted.log'),
      timeout=timeout,
  )
  if ref.returncode != 0:
    raise UserError(
        f'the uninterrupted run failed (status {ref.returncode}): {ref.last_line}; see '
        f'{workdir}/uninterrupted.log'
    )
  cal = calibrate(ref)
  print(
      f'uninterrupted run: {ref.wall:.1f}s; start to first step {cal.compile_s:.2f}s, '
      f'{cal.step_s:.3f}s per step, {cal.save_s:.3f}s per save',
      flush=True,
  )
  rng = random.Random(seed)
  launches, verdict = [], None
  for i, kind in enumerate(kill_schedule(kills, rng), 1):
    resumed = latest_step(chaos_dir)
    if resumed == total:
      print(f'kill {i}/{kills}: the run is complete already; no more kills', flush=True)
      break
    command = _continue(train, chaos_dir)
    kind, trigger = make_trigger(kind, rng, cal, config, resumed or 0)
    rec = launch(command, chaos_dir, os.path.join(workdir, f'chaos_{i}.log'), trigger, timeout)
    rec.kind = kind
    launches.append(rec)
    if rec.started is not None and rec.steps:  # Start-up of a resume (a warm compilation cache).
      cal.compile_s = rec.steps[min(rec.steps)] - rec.started
    print(_describe(i, kills, rec), flush=True)
    if rec.killed_at is None and rec.returncode != 0:
      verdict = f'launch {i} failed (status {rec.returncode}): {rec.last_line}'
      break
    if rec.kill_note.startswith('hung'):
      verdict = f'launch {i} {rec.kill_note}'
      break
  if verdict is None:
    resumed = latest_step(chaos_dir)
    final = launch(
        _continue(train, chaos_dir),
        chaos_dir,
        os.path.join(workdir, 'chaos_final.log'),
        timeout=timeout,
    )
    launches.append(final)
    print(
        f'final launch: {"from scratch" if resumed is None else f"resumed from step {resumed}"}, ended with status {final.returncode} '
        f'after {final.wall:.1f}s',
        flush=True,
    )
    if final.returncode != 0:
      verdict = f'the final resume failed (status {final.returncode}): {final.last_line}'
  if verdict is None:
    verdict = _compare(ref_dir, chaos_dir, total)
  with open(os.path.join(workdir, 'chaos.json'), 'w') as f:
    json.dump(
        dict(
            kills=kills,
            seed=seed,
            config=config_path,
            overrides=list(overrides),
            calibration=dataclasses.asdict(cal),
            uninterrupted=dataclasses.asdict(ref),
            launches=[dataclasses.asdict(r) for r in launches],
            verdict=verdict,
        ),
        f,
        indent=1,
    )
  return verdict


def _continue(train: list[str], workdir: str) -> list[str]:
  """The command that continues the run in workdir: --resume, or from scratch in an emptied folder
  when it was killed before its first checkpoint (as a user would start it again)."""
  command = train + [f'--config.train.workdir={workdir}']
  if latest_step(workdir) is not None:
    return command + ['--resume']
  shutil.rmtree(workdir, ignore_errors=True)
  return command


def _compare(ref_dir: str, chaos_dir: str, total: int) -> str | None:
  """The first difference between the two finished runs, or None; prints what was compared."""
  if latest_step(chaos_dir) != total:
    return (
        f'the interrupted run has no checkpoint of step {total} (latest {latest_step(chaos_dir)})'
    )
  state, ref_state = load_state(chaos_dir, total), load_state(ref_dir, total)
  diff = first_state_difference(state, ref_state)
  if diff is not None:
    return diff
  print(f'state: all {len(state)} leaves bitwise equal at step {total}', flush=True)
  rows, bad = read_rows(os.path.join(chaos_dir, 'metrics.jsonl'))
  ref_rows, ref_bad = read_rows(os.path.join(ref_dir, 'metrics.jsonl'))
  if bad or ref_bad:
    return bad or f'uninterrupted run: {ref_bad}'
  diff = first_metrics_difference(rows, ref_rows)
  if diff is None:
    print(
        f'metrics: {len(rows)} rows, each (step, split) once, in order, equal to the '
        'uninterrupted run',
        flush=True,
    )
  return diff


def _config_overrides(argv: list[str]) -> list[str]:
  """The --config.* flags of a command line (with their values), minus the workdir."""
  out, it = [], iter(argv)
  for arg in it:
    if arg.startswith('--config.'):
      flag = [arg] if '=' in arg else [arg, next(it, '')]
      if not arg.startswith('--config.train.workdir'):
        out += flag
  return out


def main(argv):
  del argv
  if _KILLS.value < 0:
    raise UserError(f'--kills must be 0 or more, got {_KILLS.value}.')
  config = _CONFIG.value
  config_path = config_flags.get_config_filename(flags.FLAGS['config'])
  workdir = _WORKDIR.value or tempfile.mkdtemp(prefix='tokjax-chaos-')
  os.makedirs(workdir, exist_ok=True)
  verdict = run(
      config,
      config_path,
      _config_overrides(sys.argv[1:]),
      _KILLS.value,
      _SEED.value,
      workdir,
      shlex.split(_REFERENCE_ARGS.value),
      _LAUNCH_TIMEOUT.value,
  )
  if verdict is not None:
    print(f'verdict: DIFFERENT: {verdict} (runs kept in {workdir})', flush=True)
    sys.exit(1)
  print('verdict: SAME: the killed and resumed run ends bitwise equal to the uninterrupted one')
  if not _WORKDIR.value:
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == '__main__':
  cli.run(main)
