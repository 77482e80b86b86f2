"""A run killed with `kill -9` after a checkpoint and resumed keeps a clean record: metrics.jsonl and
TensorBoard hold each step once, in order, equal to an uninterrupted run's; curves use each step once.
"""

import glob
import os
import signal
import struct
import subprocess
import sys
import time

from conftest import tiny_config, tiny_flags, tiny_run_config
import pytest

from tokjax import train
from tokjax.metric_writers import curve_rows, is_wall_clock, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = dict(train__steps=40, train__log_every=1, train__eval_every=4, train__checkpoint_every=8)


def start_training(workdir, **overrides):
  """`python -m tokjax.train` on the tiny config in a subprocess (output to workdir.log)."""
  log = open(workdir + '.log', 'w')  # pylint: disable=consider-using-with
  return subprocess.Popen(
      [sys.executable, '-m', 'tokjax.train', *tiny_flags(workdir, **overrides)],
      cwd=REPO,
      stdout=log,
      stderr=subprocess.STDOUT,
  )


def wait_for_train_step(workdir, step, proc, timeout=300):
  """Polls metrics.jsonl until a train row of at least `step` is logged."""
  path = os.path.join(workdir, 'metrics.jsonl')
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      raise AssertionError(
          f'training exited early ({proc.returncode}): {open(workdir + ".log").read()}'
      )
    if os.path.exists(path):
      with open(path) as f:
        steps = [r['step'] for r in map(eval_row, f) if r and r['split'] == 'train']
      if steps and max(steps) >= step:
        return max(steps)
    time.sleep(0.01)
  raise AssertionError('training did not reach step {step} in time')


def eval_row(line):
  import json  # pylint: disable=g-import-not-at-top

  try:
    return json.loads(line)
  except ValueError:  # A row being written.
    return None


def config_of(workdir):
  c = tiny_config(workdir)
  for k, v in SETTINGS.items():
    section, name = k.split('__')
    c[section][name] = v
  return c


def comparable(rows):
  return [{k: v for k, v in r.items() if not is_wall_clock(k)} for r in rows]


def tensorboard_steps(workdir, tag):
  """Steps of `tag` in the run's TensorBoard event files (TFRecord framing, tensorboardX protos)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top

  steps = []
  for path in sorted(glob.glob(os.path.join(workdir, 'tensorboard', 'events.*'))):
    data = open(path, 'rb').read()
    pos = 0
    while pos < len(data):
      (n,) = struct.unpack('<Q', data[pos : pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
      pos += 12 + n + 4
      steps += [event.step for v in event.summary.value if v.tag == tag]
  return steps


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  train.train(config_of(workdir))
  return workdir


def test_kill9_after_a_checkpoint_then_resume_keeps_each_step_once(tmp_path, uninterrupted):
  workdir = str(tmp_path / 'run')
  proc = start_training(workdir, **SETTINGS)
  reached = wait_for_train_step(workdir, 10, proc)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  killed_rows = read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  assert reached < 40 and max(r['step'] for r in killed_rows) > 8  # Rows after the checkpoint.
  train.train(config_of(workdir), resume=True)
  rows = read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  keys = [(r['step'], r['split']) for r in rows]
  assert len(keys) == len(set(keys)) and [s for s, _ in keys] == sorted(s for s, _ in keys)
  assert comparable(rows) == comparable(read_metrics(os.path.join(uninterrupted, 'metrics.jsonl')))
  assert tensorboard_steps(workdir, 'train/loss') == list(range(1, 41))
  assert tensorboard_steps(workdir, 'val/bpb') == list(range(4, 41, 4))


def test_curves_use_each_step_once_in_order():
  rows = [{'step': s, 'split': 'train', 'bpb': float(s)} for s in (1, 2, 3, 4, 2, 3, 4, 5)] + [
      {'step': 4, 'split': 'val', 'bpb': 9.0}
  ]
  got = [(r['split'], r['step'], r['bpb']) for r in curve_rows(rows)]
  assert [g for g in got if g[0] == 'train'] == [('train', s, float(s)) for s in (1, 2, 3, 4, 5)]
  assert ('val', 4, 9.0) in got


def _file_digests(folder):
  import hashlib  # pylint: disable=g-import-not-at-top

  return {
      os.path.relpath(os.path.join(d, f), folder): hashlib.sha256(
          open(os.path.join(d, f), 'rb').read()
      ).hexdigest()
      for d, _, files in os.walk(folder)
      for f in files
      if f != train.LOCK_FILE  # Who holds the run now, not the run: a refused resume held it too.
  }


def test_resume_with_another_model_names_the_changed_fields_and_touches_no_checkpoint(
    tiny_run, tmp_path
):
  import shutil  # pylint: disable=g-import-not-at-top

  from tokjax import checkpointing, resuming, sharding  # pylint: disable=g-import-not-at-top
  from tokjax import trainer as trainer_lib

  workdir = str(tmp_path / 'run')
  shutil.copytree(tiny_run, workdir)
  before = _file_digests(workdir)
  proc = subprocess.run(
      [
          sys.executable,
          '-m',
          'tokjax.train',
          *tiny_flags(workdir, model__d_model=64, train__steps=9),
          '--resume',
      ],
      cwd=REPO,
      capture_output=True,
      timeout=300,
      check=False,
  )
  out = (proc.stdout + proc.stderr).decode(errors='replace')
  assert proc.returncode == 2, out[-3000:]
  # One line, on the model field only (train.steps may change on resume), and no damage reported.
  assert out.strip().splitlines() == [out.strip()], out[-3000:]
  assert out.startswith('error: ') and 'config.model.d_model=32 (64 now)' in out, out
  assert 'train.steps' not in out and 'unusable' not in out and 'train again' not in out, out
  assert _file_digests(workdir) == before
  # The run still resumes with its own config.
  config = tiny_config(workdir)
  mgr = checkpointing.manager(workdir)
  trainer = trainer_lib.Trainer(config, sharding.make_mesh(config.mesh))
  check = resuming.check(config, mgr, levels=trainer.levels)
  _, step = checkpointing.restore(mgr, trainer.abstract_state, check=check)
  assert step == 6


def test_resume_with_other_train_steps_is_refused_unless_the_schedule_is_extended(
    tiny_run, tmp_path, capsys
):
  """The cosine schedule decays to config.train.steps: a resume that changes it reshapes the rest of
  the run, so it needs --extend_schedule, which says what the schedule becomes."""
  import shutil  # pylint: disable=g-import-not-at-top

  from tokjax import inspection, trainer  # pylint: disable=g-import-not-at-top
  from tokjax.errors import UserError  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(tiny_run, workdir)
  before = _file_digests(workdir)
  config = tiny_run_config(workdir)
  config.train.steps = 7
  with pytest.raises(UserError) as e:
    train.train(config, resume=True)
  msg = str(e.value)
  assert 'config.train.steps=6 and this resume asks for 7' in msg and '\n' not in msg, msg
  assert '--extend_schedule' in msg and '--config.train.steps=6' in msg, msg
  assert _file_digests(workdir) == before and 'resumed' not in capsys.readouterr().out
  with pytest.raises(UserError, match='pass --resume with it'):
    train.train(config, extend_schedule=True)

  train.train(config, resume=True, extend_schedule=True)
  out = capsys.readouterr().out
  now = float(trainer.learning_rate_schedule(config.optim, 7)(6))
  assert 'decays by cosine to 0 at step 7 instead of step 6' in out, out
  assert f'at step 6 the rate goes from 0 to {now:.3g}' in out and now > 0, out
  assert inspection.load_config(workdir)[0].train.steps == 7
  steps = [r['step'] for r in read_metrics(os.path.join(workdir, 'metrics.jsonl'))]
  assert max(steps) == 7
  # The extended run is the run now: resuming it with its own steps is no change.
  train.train(config, resume=True)
  assert 'already finished' in capsys.readouterr().out
