"""The fault-injection tool: real SIGKILLs of real training runs, and a check that can fail."""

import json
import os
import socket
import subprocess
import sys

from conftest import trained_by
import numpy as np

from tokjax.lab import chaos
from tokjax.metric_writers import read_metrics

# The tool's tiny default config, shortened: two checkpoints before the end, one evaluation.
_SHORT = (
    '--config.train.steps=12',
    '--config.train.checkpoint_every=4',
    '--config.train.eval_every=12',
)


def _chaos(workdir, *args):
  return subprocess.run(
      [sys.executable, '-m', 'tokjax.lab.chaos', f'--workdir={workdir}', *_SHORT, *args],
      capture_output=True,
      text=True,
      timeout=1200,
      check=False,
  )


def test_killed_and_resumed_run_ends_bitwise_equal(tmp_path):
  # Seed 19 kills once just after checkpoint 4 and then, resumed from it, just after step 7 (rows 5-7
  # logged past the checkpoint): the resume must drop them from the log before appending again.
  r = _chaos(tmp_path, '--kills=2', '--seed=19')
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert 'verdict: SAME' in r.stdout
  with open(tmp_path / 'chaos.json') as f:
    record = json.load(f)
  killed = [x for x in record['launches'] if x['killed_at'] is not None]
  assert len(killed) == 2 and all(x['returncode'] == -9 for x in killed)  # Real SIGKILLs.
  assert any(
      x['checkpoint_at_kill'] is not None and x['last_step_at_kill'] > x['checkpoint_at_kill']
      for x in killed
  )  # A kill after progress past a checkpoint, which a resume must replay.
  assert record['launches'][-1]['returncode'] == 0 and record['verdict'] is None
  assert len(read_metrics(tmp_path / 'chaos' / 'metrics.jsonl')) == len(
      read_metrics(tmp_path / 'uninterrupted' / 'metrics.jsonl')
  )


def test_a_run_that_differs_is_reported(tmp_path):
  r = _chaos(tmp_path, '--kills=0', '--reference_args=--config.seed=1')
  assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
  verdict = r.stdout.strip().splitlines()[-1]
  assert verdict.startswith('verdict: DIFFERENT: state leaf '), verdict
  assert os.path.isdir(tmp_path / 'chaos' / 'checkpoints')  # Kept for a look.


def test_a_finished_run_reports_its_status(tiny_run):
  """The file chaos times its kills by: a finished run names its last step and checkpoint."""
  with open(os.path.join(tiny_run, 'status.json')) as f:
    status = json.load(f)
  # Its config saves at the last of its 6 steps; the pid is the test process that trained it.
  assert status == {
      'state': 'finished',
      'step': 6,
      'checkpoint_step': 6,
      'pid': trained_by(tiny_run),
      'host': socket.gethostname(),
  }


def test_metrics_differences_are_found(tiny_run):
  rows = read_metrics(os.path.join(tiny_run, 'metrics.jsonl'))
  assert chaos.first_metrics_difference(rows, rows) is None
  # What a resume that does not truncate the log leaves: rows after the checkpoint appear twice.
  replayed = rows + rows[-2:]
  assert 'repeats step' in chaos.first_metrics_difference(replayed, rows)
  assert 'goes back' in chaos.first_metrics_difference(rows[::-1], rows)
  i = max(i for i, r in enumerate(rows) if 'loss' in r)
  changed = [dict(r) for r in rows]
  changed[i]['loss'] = np.nextafter(changed[i]['loss'], np.inf)  # One ulp.
  assert chaos.first_metrics_difference(changed, rows).startswith(f'metrics.jsonl row {i + 1} ')
  assert 'loss' in chaos.first_metrics_difference(changed, rows)
  assert 'missing' in chaos.first_metrics_difference(rows[:-1], rows)
  timing = [
      dict(r, bytes_per_s=1.0, mfu=0.5, model_tflops=2.0) if 'bytes_per_s' in r else r for r in rows
  ]
  assert chaos.first_metrics_difference(timing, rows) is None  # Wall-clock fields may differ.


def test_a_row_cut_by_a_kill_is_reported(tiny_run, tmp_path):
  with open(os.path.join(tiny_run, 'metrics.jsonl')) as f:
    text = f.read()
  cut = tmp_path / 'metrics.jsonl'
  cut.write_text(text[: len(text) - 20])
  rows, problem = chaos.read_rows(str(cut))
  assert 'is not a JSON row' in problem and len(rows) == text.count('\n') - 1


def test_state_differences_are_found(tiny_run):
  state = chaos.load_state(tiny_run, 6)
  assert chaos.first_state_difference(state, state) is None
  name = sorted(k for k in state if 'params' in k and state[k].dtype == np.float32)[0]
  nudged = dict(state)
  nudged[name] = state[name].copy()
  nudged[name].flat[0] = np.nextafter(nudged[name].flat[0], np.float32(np.inf))
  difference = chaos.first_state_difference(nudged, state)
  assert difference.startswith(f'state leaf {name} differs in 1 of'), difference
