"""A run trained by two processes (four simulated CPU devices each, the coordinator on localhost),
stopped by SIGTERM and resumed, ends bitwise equal to the same config trained uninterrupted by one
process on eight devices: the same parameters, the same metrics.jsonl (each step once, written by one
process), the same val bpb over the same rows, and one set of checkpoints.

Both runs are `python -m tokjax.train` subprocesses, since the device count is fixed when jax starts.
"""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

from conftest import XLA_FAST_COMPILE, tiny_flags
import jax
import numpy as np
import pytest

from tokjax import inspection
from tokjax.metric_writers import is_wall_clock, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8
# Batches of 8 rows (one per device), an eval at steps 4 and 8, a checkpoint every 2 steps.
SETTINGS = dict(
    data__batch_size=8,
    eval__batch_size=8,
    eval__max_batches=2,
    train__steps=STEPS,
    train__log_every=1,
    train__eval_every=4,
    train__checkpoint_every=2,
)


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(('localhost', 0))
    return sock.getsockname()[1]


def _env(devices: int, **extra) -> dict:
  return dict(
      os.environ,
      XLA_FLAGS=f'--xla_force_host_platform_device_count={devices} {XLA_FAST_COMPILE}',
      JAX_PLATFORMS='cpu',
      TF_CPP_MIN_LOG_LEVEL='3',
      **extra,
  )


def _start(workdir: str, env: dict, log: str, *args: str) -> subprocess.Popen:
  with open(log, 'w') as out:
    return subprocess.Popen(
        [sys.executable, '-m', 'tokjax.train', *tiny_flags(workdir, **SETTINGS), *args],
        cwd=REPO,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def _start_pair(workdir: str, *args: str) -> list[subprocess.Popen]:
  """The two processes of one job: process p logs to workdir.p<p>.log."""
  port = _free_port()
  return [
      _start(workdir, _env(4, **_job(p, 2, port)), f'{workdir}.p{p}.log', *args) for p in range(2)
  ]


def _job(process: int, processes: int, port: int | None = None) -> dict:
  """The environment that makes `tokjax.distributed` join `process` to a job on localhost."""
  return dict(
      JAX_COORDINATOR_ADDRESS=f'localhost:{port or _free_port()}',
      JAX_NUM_PROCESSES=str(processes),
      JAX_PROCESS_ID=str(process),
  )


def _wait(procs, logs, timeout=240) -> list[int]:
  deadline = time.time() + timeout
  codes = []
  for p in procs:
    try:
      codes.append(p.wait(timeout=max(1, deadline - time.time())))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      codes.append(None)
  if any(c not in (0, 128 + signal.SIGTERM) for c in codes):
    tails = '\n'.join(f'--- {log}\n{open(log).read()[-3000:]}' for log in logs)
    raise AssertionError(f'training exited with {codes}:\n{tails}')
  return codes


def _wait_for_step(workdir, step, procs, timeout=180) -> None:
  """Until process 0 logs a train row of at least `step`."""
  path = os.path.join(workdir, 'metrics.jsonl')
  deadline = time.time() + timeout
  while time.time() < deadline:
    if any(p.poll() is not None for p in procs):
      return  # _wait reports how it ended.
    if os.path.exists(path):
      with open(path) as f:
        lines = f.read().splitlines()
      if any(json.loads(l)['step'] >= step for l in lines[:-1]):  # The last may be half-written.
        return
    time.sleep(0.02)
  raise AssertionError(f'{workdir} did not reach step {step} in {timeout} s')


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """(one-process run, two-process run) folders; the second stopped by SIGTERM, then resumed."""
  root = tmp_path_factory.mktemp('multiprocess')
  one, two = str(root / 'one'), str(root / 'two')
  t0 = time.time()
  # Side by side with the pair's first leg. One process joins a job of one: its 8 devices then sum
  # over gloo as the pair's do (jax's in-process CPU sums add in another order, off by an ulp).
  single = _start(one, _env(8, **_job(0, 1)), one + '.log')
  pair = _start_pair(two)
  _wait_for_step(two, 1, pair)
  for p in pair:  # A preempted job: every host gets SIGTERM.
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  codes = _wait(pair, [f'{two}.p{p}.log' for p in range(2)])
  stopped = [json.loads(l)['step'] for l in open(os.path.join(two, 'metrics.jsonl'))][-1]
  first_leg = time.time() - t0
  resumed = _start_pair(two, '--resume')
  _wait([single], [one + '.log'])
  _wait(resumed, [f'{two}.p{p}.log' for p in range(2)])
  print(
      f'first leg {first_leg:.1f} s (stopped after step {stopped}), total {time.time() - t0:.1f} s'
  )
  return dict(one=one, two=two, codes=codes, stopped=stopped)


def test_the_two_process_run_was_stopped_and_resumed(runs):
  assert runs['codes'] == [128 + signal.SIGTERM] * 2, 'SIGTERM came after the run had finished'
  assert runs['stopped'] < STEPS
  log = open(runs['two'] + '.p0.log').read()
  assert 'resumed from step' in log and "'data': 8" in log


def test_two_processes_end_bitwise_equal_to_one(runs):
  a, b = (inspection.load_checkpoint(runs[k]) for k in ('one', 'two'))
  assert a.step == b.step == STEPS
  leaves = lambda ckpt: jax.tree_util.tree_leaves_with_path(jax.device_get(ckpt.params))
  for (path, x), (_, y) in zip(leaves(a), leaves(b), strict=True):
    assert np.array_equal(x, y), jax.tree_util.keystr(path)


def test_metrics_are_written_once_and_equal_one_process(runs):
  # NaN (bpb_se of one document) as None, so that equal rows compare equal.
  comparable = lambda rows: [
      {k: None if v != v else v for k, v in r.items() if not is_wall_clock(k)} for r in rows
  ]
  one, two = (read_metrics(os.path.join(runs[k], 'metrics.jsonl')) for k in ('one', 'two'))
  assert [(r['split'], r['step']) for r in two] == [(r['split'], r['step']) for r in one]
  assert comparable(two) == comparable(one)
  # Evaluation covers both processes' rows: the bytes scored and the bpb are the one-process run's.
  val = [r for r in two if r['split'] == 'val']
  assert [r['step'] for r in val] == [4, 8] and val[-1]['bytes'] > 8 * 64
  events = lambda d: glob.glob(os.path.join(d, 'tensorboard', 'events.*'))
  assert len(events(runs['two'])) == len(events(runs['one'])) == 1
  status = json.load(open(os.path.join(runs['two'], 'status.json')))
  assert status['state'] == 'finished' and status['step'] == STEPS


def test_checkpoints_are_written_once(runs):
  listing = lambda d: sorted(os.listdir(os.path.join(d, 'checkpoints')))
  assert listing(runs['two']) == listing(runs['one']) == ['6', '8']
  step = os.path.join(runs['two'], 'checkpoints', '8')
  assert sorted(os.listdir(step)) == sorted(
      os.listdir(os.path.join(runs['one'], 'checkpoints', '8'))
  )
  # The data item holds each process's iterator position, one file each.
  positions = [f for f in os.listdir(os.path.join(step, 'data')) if f.endswith('.json')]
  assert sorted(positions) == ['process_0-of-2.json', 'process_1-of-2.json']
