r"""Train a tokjax model from a config file.

  python -m tokjax.train --config configs/default.py [--config.train.steps=1000] [--resume [--step N]]
      [--overwrite] [--verbosity=0]

Writes into config.train.workdir (a local path or a URL such as gs://bucket/run when its filesystem
package, e.g. gcsfs, is installed): metrics.jsonl, status.json (`write_status`), TensorBoard events
(tensorboard/), orbax checkpoints (checkpoints/), curves.png, and at the end prints val bits-per-byte
beside the gzip -9 / xz -9 figures of the same split and those of PPMd and a byte n-gram LM that have
seen the training split (tokjax/data/baselines.py; computed once per corpus, then cached) and, for a
hierarchical model, the learned segmentation of held-out text.

--resume continues from the latest checkpoint that loads (a damaged one is reported and skipped;
--step=N demands step N); the metrics logged after that step are dropped and logged again. A resume
with another config.train.steps than the run's is refused, since the learning-rate schedule decays to
that step: --extend_schedule accepts it and says what the schedule becomes. SIGTERM or
SIGINT (Ctrl-C) finishes the current step, saves a checkpoint and exits with 128 + the signal number,
printing how to resume; a second signal exits at once. Third-party INFO logs show with --verbosity=0.

A run has one writer: training locks workdir/train.lock (`lock_workdir`) for as long as it runs, so
another training, a --resume or an --overwrite of that workdir is refused in one line naming the
process; the kernel drops the lock of a killed process. --overwrite with --resume is refused. A
checkpoint save whose write fails (disk full, no permission) ends the run in one line naming the
cause and the intact checkpoint to resume from.
"""

import json
import os
import shlex
import signal
import socket
import sys
import time
from typing import cast

from absl import flags
import jax
from jax.experimental import multihost_utils
from ml_collections import config_flags
import numpy as np

from tokjax import (
    checkpointing,
    cli,
    distributed,
    flops,
    paths,
    profiling,
    resuming,
    sharding,
    significance,
    tokenization,
)
from tokjax import evaluator as evaluator_lib
from tokjax import trainer as trainer_lib
from tokjax.config import validation as config_validation
from tokjax.data import baselines, pipeline
from tokjax.errors import Interrupted, UserError
from tokjax.metric_writers import MetricWriter, plot_curves, read_metrics
from tokjax.models import interface


def define_flags():
  """The command-line flags (defined only when this module is the entry point, so that the other
  tools can import it without clashing flag names)."""
  config_flags.DEFINE_config_file('config', 'configs/default.py', 'Config file (ml_collections).')
  flags.DEFINE_bool('resume', False, 'Continue from the latest checkpoint in the workdir.')
  flags.DEFINE_integer(
      'step', None, 'With --resume: continue from this checkpoint step (newer steps are discarded).'
  )
  flags.DEFINE_bool(
      'overwrite', False, "Delete the workdir's metrics and checkpoints and train from scratch."
  )
  flags.DEFINE_bool(
      'extend_schedule',
      False,
      'With --resume and a changed --config.train.steps: decay the learning-rate schedule to the '
      'new last step (without it such a resume is refused).',
  )


RUN_FILES = ('metrics.jsonl', 'status.json', 'tensorboard', 'checkpoints', 'curves.png')
# In the workdir, held by the training process while it runs (`lock_workdir`). Not a run file: it is
# never deleted, since a process that opened it before the deletion would lock a file no one sees.
LOCK_FILE = 'train.lock'


def write_status(workdir: str, state: str, step: int, checkpoint_step: int | None) -> None:
  """workdir/status.json := how the run stands, for tools that watch it (tokjax.lab.chaos) rather
  than read its console: state ('running' from the first step's compilation on, then 'finished',
  'stopped' by a signal or Ctrl-C, or 'failed' by an error), the last step done, the last checkpoint
  step (None before the first), and the pid and host of the process. Replaced atomically: a reader
  never sees half a file. A killed process writes no end: `read_status` tells that case."""
  if jax.process_index() != 0:
    return
  path = paths.join(workdir, 'status.json')
  text = json.dumps(
      {
          'state': state,
          'step': step,
          'checkpoint_step': checkpoint_step,
          'pid': os.getpid(),
          'host': socket.gethostname(),
      }
  )
  if not paths.is_local(workdir):
    path.write_text(text)  # One object upload: atomic on cloud storage.
    return
  tmp = path.with_name(path.name + '.tmp')
  tmp.write_text(text)
  os.replace(tmp, path)


def read_status(workdir: str) -> dict | None:
  """The run's status.json (`write_status`), or None before its first; 'running' reads 'dead' when
  the process that wrote it is gone (killed, so that it wrote no end): the workdir's lock is free,
  or, without a lock file (a run of an earlier version, a URL workdir), its pid is no live process
  on this host."""
  path = paths.join(workdir, 'status.json')
  if not path.exists():
    return None
  status = json.loads(path.read_text())
  if status.get('state') == 'running' and not _writer_alive(workdir, status):
    status['state'] = 'dead'
  return status


def _writer_alive(workdir: str, status: dict) -> bool:
  if paths.is_local(workdir) and paths.join(workdir, LOCK_FILE).exists():
    return paths.is_locked(paths.join(workdir, LOCK_FILE))
  if status.get('host', socket.gethostname()) != socket.gethostname():
    return True  # Its pid means nothing here.
  try:
    os.kill(int(status['pid']), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, KeyError, TypeError, ValueError):
    pass  # Another user's live process, or no pid recorded: say nothing new.
  return True


class RunStatus:
  """status.json of the run in progress: the state the loop last wrote, and the step it has reached,
  for the end it comes to (`end`)."""

  def __init__(self, workdir: str, step: int, checkpoint_step: int | None):
    self.workdir, self.step, self.checkpoint_step = workdir, step, checkpoint_step

  def write(self, state: str) -> None:
    write_status(self.workdir, state, self.step, self.checkpoint_step)

  def end(self, state: str) -> None:
    """write(state), when the run ends by a signal or an error: a disk that failed a write may fail
    this one too, and the error that ended the run is the one to show."""
    try:
      self.write(state)
    except OSError:
      pass


def lock_workdir(workdir: str) -> int | None:
  """Claims the workdir for this training run: an exclusive lock on workdir/train.lock, held until
  the returned file descriptor is closed or the process ends (a killed run leaves no stale lock).
  Returns None where this process takes no lock: a multi-process job's other processes (process 0,
  which writes the metrics and status, holds it for the job) and a URL workdir (no file locks there).

  Raises UserError naming the process that holds it, in every process of the job.
  """
  fd, holder = None, 0
  if jax.process_index() == 0 and paths.is_local(workdir):
    path = paths.join(workdir, LOCK_FILE)
    fd = paths.lock(path, owner=f'{os.getpid()} {socket.gethostname()}')
    if fd is None:
      holder = _lock_holder(workdir) or -1
  if jax.process_count() > 1:  # Every process stops, not only the one that tried.
    holder = int(multihost_utils.broadcast_one_to_all(np.int32(holder)))
  if holder:
    who = f'process {holder}' if holder > 0 else 'another process'
    stop = f'stop it (kill -TERM {holder} saves a checkpoint)' if holder > 0 else 'stop it'
    raise UserError(
        f'{workdir} is in use: {who} is training there (it holds {LOCK_FILE}); wait for it to '
        f'end or {stop} before you resume or overwrite it, or choose another '
        '--config.train.workdir.'
    )
  return fd


def _lock_holder(workdir: str) -> int:
  """The holder's pid from the lock file, or from status.json when the holder has not written it
  there yet; 0 when neither names one."""
  words = paths.lock_owner(paths.join(workdir, LOCK_FILE)).split()
  if words and words[0].isdigit():
    return int(words[0])
  try:
    status = read_status(workdir) or {}
  except (OSError, ValueError):
    status = {}
  pid = status.get('pid')
  return pid if isinstance(pid, int) and status.get('state') == 'running' else 0


def prepare_workdir(workdir: str, resume: bool, overwrite: bool = False) -> int | None:
  """Checks the workdir (a local path or URL, see tokjax.paths) is writable, claims it
  (`lock_workdir`: returns the lock to hold while training) and checks it holds no other run (or
  clears it with overwrite). A URL whose filesystem package is missing raises UserError."""
  root = paths.resolve(workdir)
  try:
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f'.write_test{jax.process_index()}'  # Each process its own: they run at once.
    probe.write_text('ok')
    probe.unlink()
  except OSError as e:
    raise UserError(
        f'cannot write to workdir {workdir!r} ({e.strerror or e}); choose a writable folder '
        'with --config.train.workdir=PATH.'
    ) from None
  lock = lock_workdir(workdir)
  try:
    if overwrite:
      for name in RUN_FILES:
        path = root / name
        if path.is_dir():
          path.rmtree()
        elif path.exists():
          path.unlink()
    elif not resume and (root / 'metrics.jsonl').exists():
      raise UserError(
          f'{workdir} already holds a run; pass --resume to continue it, --overwrite to replace '
          'it, or choose a new --config.train.workdir.'
      )
  except BaseException:
    release(lock)
    raise
  return lock


def release(lock: int | None) -> None:
  """Gives up the workdir's lock (`lock_workdir`), if this process holds it."""
  if lock is not None:
    os.close(lock)


def format_eta(seconds: float) -> str:
  seconds = int(seconds)
  return f'{seconds // 60}m{seconds % 60:02d}s'


def show_segmentation(trainer, params, data, config, key) -> str:
  """Held-out lines (from the test split) with '|' after each chunk ('||' where a stage-1 chunk ends
  too, and so on: `tokenization.render`), greedy and sampled."""
  text = data.splits['test'][0]
  lines = []
  for mode in ('greedy', 'sample'):
    shown, actions, _ = tokenization.boundaries_for(
        trainer.model, params, text, config.data.seq_len, key, mode
    )
    lines.append(f'--- {mode} boundaries ---')
    lines.append(
        tokenization.render(shown, actions, max_lines=config.eval.segment_lines, terminal=True)
    )
  return '\n'.join(lines)


class Reporter:
  """What a training run shows and records: console lines, metrics.jsonl / TensorBoard, curves.png.

  The loop calls `compiled` after the first step, `train_step` at log steps, `val` after each
  evaluation and `finish` at the end. Per-step throughput is computed in one place, `throughput`.
  """

  def __init__(self, config, trainer, data, start_step: int, restored: bool):
    self.config, self.trainer, self.data = config, trainer, data
    self.stages = trainer.model.num_stages  # Levels of boundaries the lines and metrics report.
    self.total, self.start_step = config.train.steps, start_step
    self.ref = data.reference_bpb('val')
    self.writer = MetricWriter(
        config.train.workdir,
        enabled=jax.process_index() == 0,
        restored_step=start_step if restored else None,
    )
    # Peak FLOP/s of one device: the table's for accelerators, a measured matmul peak on a CPU.
    self.peak = flops.peak_flops(cpu_peak=flops.measure_matmul_peak() if _on_cpu() else None)
    self.t0 = self.last_t = time.time()
    self.last_step = start_step

  def header(self, mesh) -> None:
    c = self.config
    print(
        f'tokjax: {c.model.kind} model, {self.trainer.num_params / 1e6:.2f}M parameters, '
        f'{len(jax.devices())} device(s) mesh {dict(mesh.shape)}, corpus {c.data.corpus!r} '
        f'({self.data.num_bytes("train") / 1e6:.1f} MB train)',
        flush=True,
    )
    print('compiling the train step...', flush=True)

  def compiled(self, step: int) -> None:
    """After the first step (compilation included): throughput counts from here on."""
    print(f'compiled; step {step} done after {time.time() - self.t0:.1f} s', flush=True)
    self.last_t, self.last_step = time.time(), step

  def throughput(self, steps: int, seconds: float, rate=None) -> dict:
    """Per-step throughput of `steps` steps in `seconds`: bytes/s, model TFLOP/s (the main network
    costed at the realised boundary `rate` of the logged step, see tokjax/flops.py) and MFU against
    the devices' peak (when known)."""
    c = self.config.data
    seconds = max(seconds, 1e-9)
    model_flops = flops.step_flops(self.config, rate, levels=self.trainer.levels) * steps / seconds
    out = {
        'bytes_per_s': steps * c.batch_size * c.seq_len / seconds,
        'model_tflops': model_flops / 1e12,
    }
    if self.peak:
      out['mfu'] = flops.mfu(model_flops, 1.0, self.peak, jax.device_count())
    return out

  def train_step(self, done: int, metrics) -> None:
    metrics = jax.device_get(metrics)
    now = time.time()
    rate = None
    if self.stages:  # Stage 0's chunks per byte, then each inner stage's rate.
      rate = tuple(float(metrics[k]) for k in interface.stage_metrics(self.trainer.model, 'rate'))
    speed = self.throughput(done - self.last_step, now - self.last_t, rate)
    eta = (self.total - done) * (now - self.t0) / max(done - self.start_step, 1)
    self.writer.write(done, 'train', dict(metrics, **speed))
    # rate is set whenever self.stages is.
    extra = (
        f' | rate {metrics["rate"]:.3f} ws {metrics["whitespace_recall"]:.2f}'
        f' word-end {metrics["word_end_recall"]:.2f}'
        + ''.join(
            f' | stage {s} rate {r:.3f}'
            for s, r in enumerate(cast(tuple[float, ...], rate)[1:], start=1)
        )
        if self.stages
        else ''
    )
    print(
        f'step {done:>6}/{self.total} | {speed["bytes_per_s"] / 1e3:6.1f}k B/s'
        + (f' {speed["mfu"]:.1%} MFU' if 'mfu' in speed else '')
        + ' | loss '
        f'{metrics["loss"]:.4f} | bpb {metrics["bpb"]:.4f}{extra} | left {format_eta(eta)}',
        flush=True,
    )
    self.last_t, self.last_step = now, done

  def val(self, done: int, val: dict, params, key) -> None:
    self.writer.write(done, 'val', val)
    ref = self.ref
    greedy = f' (greedy {val["greedy_bpb"]:.4f})' if self.stages else ''
    seg = (
        f' | rate {val["rate"]:.3f} ws {val["whitespace_recall"]:.2f} greedy ws '
        f'{val["greedy_whitespace_recall"]:.2f} word-end {val["greedy_word_end_recall"]:.2f}'
        + ''.join(
            f' | stage {s} rate {val[interface.stage_metric(s, "rate")]:.3f} ws lift '
            f'{val[interface.stage_metric(s, "whitespace_lift")]:+.3f} +- '
            f'{val[interface.stage_metric(s, "whitespace_lift_se")]:.3f}'
            for s in range(1, self.stages)
        )
        if self.stages
        else ''
    )
    print(
        f'  val bpb {significance.format_bpb(val["bpb"], val["bpb_se"])}{greedy} | '
        f'{baselines.describe(ref)}{seg}',
        flush=True,
    )
    # Watch the tokenization form: a held-out line with greedy boundaries (every level).
    if self.stages:
      shown, actions, _ = tokenization.boundaries_for(
          self.trainer.model,
          params,
          self.data.splits['test'][0],
          self.config.data.seq_len,
          key,
          'greedy',
      )
      print(f'  greedy: {tokenization.preview(shown, actions)}', flush=True)

  def finish(self, val: dict, params, key, checkpoint_dir: str) -> None:
    self.writer.close()
    png = paths.join(self.config.train.workdir, 'curves.png')
    if self.writer.enabled:
      plot_curves(self.writer.path, png)
    print(
        f'final val bpb {val["bpb"]:.4f} | {baselines.describe(self.ref)} | '
        f'wall {format_eta(time.time() - self.t0)}'
    )
    print(f'wrote {self.writer.path}, {png}, checkpoints in {checkpoint_dir}')
    if self.stages:
      legend = tokenization.legend(self.stages)
      print(f'learned segmentation of held-out text ({legend}):')
      print(show_segmentation(self.trainer, params, self.data, self.config, key))


class StopSignals:
  """SIGTERM / SIGINT ask the loop to stop after the current step; a second signal exits at once.

  With several processes, JAX's preemption service owns SIGTERM and orbax's `reached_preemption`
  makes every host stop (and save) at the same step; only SIGINT is handled here then.
  """

  def __init__(self, mgr, on_exit=lambda: None):
    self.mgr, self.signum, self.on_exit = mgr, None, on_exit
    self.multihost = jax.process_count() > 1
    self.previous = {}

  def __enter__(self):
    sigs = (signal.SIGINT,) if self.multihost else (signal.SIGTERM, signal.SIGINT)
    for s in sigs:
      try:
        self.previous[s] = signal.signal(s, self._handle)
      except ValueError:  # Not the main thread: signals stay with the caller.
        pass
    return self

  def __exit__(self, *exc):
    for s, handler in self.previous.items():
      signal.signal(s, handler)

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:
      print(f'\nsecond {signal.Signals(signum).name}: exiting at once', file=sys.stderr, flush=True)
      self.on_exit()
      os._exit(128 + signum)  # pylint: disable=protected-access
    self.signum = signum
    print(
        f'\nreceived {signal.Signals(signum).name}: finishing the step and saving a checkpoint '
        '(send it again to exit at once)',
        file=sys.stderr,
        flush=True,
    )

  def stop(self, step: int) -> bool:
    if self.multihost and self.mgr.reached_preemption(step):
      self.signum = self.signum or signal.SIGTERM
    return self.signum is not None


def _on_cpu() -> bool:
  return jax.devices()[0].platform == 'cpu'


def resume_command() -> str:
  """The command line that resumes this run (the current one, with --resume and without --step)."""
  args = [a for a in sys.argv[1:] if a not in ('--resume', '--overwrite', '--noresume')]
  args = [a for a in args if not a.startswith('--step')]
  return 'python -m tokjax.train ' + ' '.join(map(shlex.quote, args + ['--resume']))


def initial_state(
    config,
    trainer,
    data,
    mgr,
    key,
    *,
    resume: bool,
    step: int | None,
    extend_schedule: bool = False,
):
  """(state, restored: bool): the restored checkpoint with resume (dropping newer steps), else a
  fresh init. Refuses to start fresh over a run's metrics without a checkpoint, and a changed
  config.train.steps without extend_schedule (`resuming.check_schedule`)."""
  workdir = config.train.workdir
  if step is not None and not resume:
    raise UserError('--step picks the checkpoint to resume from: pass --resume with it.')
  if not resume:
    return trainer.init(key), False
  if not mgr.all_steps():
    if paths.join(workdir, 'metrics.jsonl').exists():
      raise UserError(
          f'{workdir} holds metrics but no checkpoint to resume from; pass --overwrite to start '
          'the run again from scratch, or choose a new --config.train.workdir.'
      )
    print(f'note: no checkpoint in {mgr.directory}; --resume starts a fresh run.', flush=True)
    return trainer.init(key), False
  check = resuming.check(config, mgr, levels=trainer.levels, extend_schedule=extend_schedule)
  state, restored = checkpointing.restore(
      mgr, trainer.abstract_state, data.train_iter, step, check=check
  )
  newer = [s for s in mgr.all_steps() if s > restored]
  if newer:  # Damaged or abandoned steps: the resumed run writes its own.
    print(f'note: discarding checkpoint steps {sorted(newer)} after step {restored}.', flush=True)
    for s in newer:
      paths.rmtree(mgr.directory / str(s))
    mgr.reload()
  print(f'resumed from step {restored}', flush=True)
  return state, True


def train(
    config,
    resume: bool = False,
    step: int | None = None,
    overwrite: bool = False,
    extend_schedule: bool = False,
) -> dict:
  """Runs training; returns the final val metrics. Raises UserError for fixable input problems (a
  workdir another process trains in among them) and Interrupted after saving when a stop signal
  arrives. The workdir stays locked while this runs (`lock_workdir`). extend_schedule: see
  `initial_state`."""
  if overwrite and resume:  # Before anything is touched: which one was meant is unknowable.
    raise UserError(
        '--overwrite deletes the run that --resume would continue; pass --resume to continue it '
        'or --overwrite to train it again from scratch, not both.'
    )
  if not str(config.train.workdir).strip():
    raise UserError(
        'config.train.workdir is empty; pass the run folder, e.g. --config.train.workdir=runs/NAME.'
    )
  levels = config_validation.validate(config)
  if extend_schedule and not resume:
    raise UserError("--extend_schedule stretches a resumed run's schedule: pass --resume with it.")
  distributed.maybe_initialize(config.mesh.multihost)  # Before anything touches JAX.
  lock = prepare_workdir(config.train.workdir, resume, overwrite)
  try:
    return _train(config, levels, resume=resume, step=step, extend_schedule=extend_schedule)
  finally:
    release(lock)


def _train(config, levels, *, resume: bool, step: int | None, extend_schedule: bool) -> dict:
  """`train` in a workdir this process has claimed; levels: config's, resolved by `train`."""
  mesh = sharding.make_mesh(config.mesh)
  data = pipeline.build_data(config)
  trainer = trainer_lib.Trainer(config, mesh, levels=levels)
  mgr = checkpointing.manager(config.train.workdir, config.train.keep_checkpoints)
  init_key, train_key, eval_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  state, restored = initial_state(
      config,
      trainer,
      data,
      mgr,
      init_key,
      resume=resume,
      step=step,
      extend_schedule=extend_schedule,
  )
  total, start = config.train.steps, int(state.step)
  if start >= total:
    return finished(config, start)
  report = Reporter(config, trainer, data, start, restored)
  report.header(mesh)
  status = RunStatus(config.train.workdir, start, start if restored else None)
  status.write('running')
  try:
    state, val = _loop(
        config,
        trainer,
        data,
        mgr,
        state,
        report=report,
        status=status,
        train_key=train_key,
        eval_key=eval_key,
    )
  except checkpointing.SaveFailed as e:
    status.end('failed')
    advice = (
        f'checkpoint step {e.last} is intact: free disk space or fix the permissions of '
        f'{mgr.directory}, then resume with: {resume_command()}'
        if e.last is not None
        else 'no checkpoint was saved before it: free disk space or fix the permissions of '
        f'{mgr.directory} and train again'
    )
    raise UserError(f'{e}; {advice}') from None
  except (Interrupted, KeyboardInterrupt):
    status.end('stopped')
    raise
  except Exception:
    status.end('failed')
    raise
  status.write('finished')
  report.finish(val, state.params, eval_key, str(mgr.directory))
  return val


def _loop(config, trainer, data, mgr, state, *, report, status, train_key, eval_key):
  """The training steps from state.step to config.train.steps: (final state, last val metrics)."""
  total, start = config.train.steps, int(state.step)
  evaluator, val, bad_at_start = evaluator_lib.Evaluator(trainer), {}, int(state.nonfinite)
  every = lambda done, n: done % n == 0 or done == total
  profiler = profiling.StepProfiler.from_config(config)  # Off unless config.train.profile_steps.
  with StopSignals(mgr, on_exit=lambda: status.end('stopped')) as signals:
    for done in range(start + 1, total + 1):
      profiler.before_step(done)
      state, metrics = trainer.train_step(
          state, sharding.global_batch(next(data.train_iter), trainer.mesh), train_key
      )
      status.step = done
      profiler.after_step(done, metrics)
      if done == start + 1:
        jax.block_until_ready(metrics)
        report.compiled(done)
      if every(done, config.train.log_every):
        report.train_step(done, metrics)
      t = config.train
      if any(every(done, n) for n in (t.log_every, t.eval_every, t.checkpoint_every)):
        check_finite(state, bad_at_start, done, mgr)
      if every(done, t.eval_every):
        val = evaluator_lib.scalars(
            evaluator.run(state.params, data.splits['val'], eval_key, batches=data.val_batches)
        )
        report.val(done, val, state.params, eval_key)
      stop = signals.stop(done)
      if every(done, t.checkpoint_every) or stop:
        checkpointing.save(mgr, done, state, data.train_iter, config)
        status.checkpoint_step = done
        status.write('running')
      if stop and done < total:
        report.writer.close()
        raise Interrupted(
            f'stopped by {signal.Signals(signals.signum).name} after step {done}: checkpoint saved '
            f'in {mgr.directory}; resume with: {resume_command()}',
            signals.signum,
        )
  profiler.close()
  return state, val


def check_finite(state, bad_at_start: int, done: int, mgr) -> None:
  """Stops the run when updates were skipped for a non-finite loss or gradient."""
  if int(state.nonfinite) <= bad_at_start:
    return
  last = mgr.latest_step()
  advice = (
      f'checkpoint step {last} is intact: lower --config.optim.lr or use '
      '--config.model.dtype=float32, then rerun with --resume to continue from it.'
      if last is not None
      else 'no checkpoint was saved yet: lower --config.optim.lr or use '
      '--config.model.dtype=float32 and train again from scratch (add --overwrite).'
  )
  raise UserError(
      f'the loss or gradient became NaN/inf before step {done} (those updates were skipped); '
      + advice
  )


def finished(config, step: int) -> dict:
  """A resumed run that has nothing left to do: say so, and return its last val metrics."""
  path = paths.join(config.train.workdir, 'metrics.jsonl')
  rows = read_metrics(path) if path.exists() else []
  val: dict = next((r for r in reversed(rows) if r['split'] == 'val' and r['step'] <= step), {})
  shown = f'; its last val bpb is {val["bpb"]:.4f} (step {val["step"]})' if 'bpb' in val else ''
  print(
      f'the run in {config.train.workdir} already finished: its checkpoint is at step {step} and '
      f'config.train.steps={config.train.steps}{shown}. Raise --config.train.steps and pass '
      '--extend_schedule to train on (the learning-rate schedule then decays to the new last step).'
  )
  return {k: v for k, v in val.items() if k not in ('step', 'split')}


def main(argv):
  del argv
  f = flags.FLAGS
  train(
      f.config,
      resume=f.resume,
      step=f.step,
      overwrite=f.overwrite,
      extend_schedule=f.extend_schedule,
  )


if __name__ == '__main__':
  define_flags()
  cli.run(main)
