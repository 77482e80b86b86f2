"""SIGTERM / SIGINT with real signals to a training subprocess: the step finishes, a checkpoint is
saved, one line says how to resume, the exit code is 128 + signal; resuming continues bit for bit as
an uninterrupted run. A second signal exits at once."""

import os
import shlex
import signal
import subprocess
import sys
import time

from conftest import tiny_config
import jax
import numpy as np
import pytest
from test_resume import REPO, start_training, wait_for_train_step

from tokjax import checkpointing, inspection, train
from tokjax.metric_writers import read_metrics

SETTINGS = dict(
    train__steps=40, train__log_every=1, train__eval_every=40, train__checkpoint_every=40
)


def config_of(workdir):
  c = tiny_config(workdir)
  c.train.update(steps=40, log_every=1, eval_every=40, checkpoint_every=40)
  return c


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  train.train(config_of(workdir))
  return workdir


def _losses(workdir):
  rows = read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  return [(r['step'], r['loss']) for r in rows if r['split'] == 'train']


def _assert_same_run(a, b):
  assert _losses(a) == _losses(b)
  pa, pb = inspection.load_checkpoint(a).params, inspection.load_checkpoint(b).params
  for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _interrupt(workdir, sig, times=1):
  proc = start_training(workdir, **SETTINGS)
  wait_for_train_step(workdir, 5, proc)
  proc.send_signal(sig)
  if times == 2:  # Once the first is handled (two signals before that would count as one).
    deadline = time.time() + 60
    while f'received {sig.name}' not in open(workdir + '.log').read() and time.time() < deadline:
      time.sleep(0.002)
    proc.send_signal(sig)
  proc.wait(timeout=300)
  return proc.returncode, open(workdir + '.log').read()


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_and_resume_is_bitwise_identical(tmp_path, uninterrupted, sig):
  workdir = str(tmp_path / 'run')
  code, log = _interrupt(workdir, sig)
  assert code == 128 + sig, log[-3000:]
  assert 'Traceback' not in log
  (line,) = [l for l in log.splitlines() if l.startswith('stopped by')]
  step = int(line.split('after step ')[1].split(':')[0])
  assert f'stopped by {sig.name}' in line and 'resume with: python -m tokjax.train' in line
  assert 5 <= step < 40 and checkpointing.manager(workdir).latest_step() == step
  # Third-party INFO logs are off; "compiling" comes before the first progress line.
  assert not [l for l in log.splitlines() if l[:1] == 'I' and l[1:5].isdigit()], log[:2000]
  lines = log.splitlines()
  first = next(i for i, l in enumerate(lines) if l.startswith('step '))
  assert any(l.startswith('compiling') for l in lines[:first])
  if sig == signal.SIGTERM:  # The printed command resumes the run.
    cmd = shlex.split(line.split('resume with: ')[1])
    assert cmd[:3] == ['python', '-m', 'tokjax.train']
    proc = subprocess.run(
        [sys.executable, *cmd[1:]], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'resumed from step {step}' in proc.stdout
  else:
    train.train(config_of(workdir), resume=True)
  _assert_same_run(workdir, uninterrupted)


def test_second_signal_exits_at_once(tmp_path):
  workdir = str(tmp_path / 'run')
  code, log = _interrupt(workdir, signal.SIGTERM, times=2)
  assert code == 128 + signal.SIGTERM
  assert 'second SIGTERM: exiting at once' in log, log[-2000:]
  assert 'Traceback' not in log and 'stopped by' not in log  # No save: it exited at once.
