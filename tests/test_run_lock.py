"""One writer per run: a training holds its workdir's lock, so a second training, a resume or an
--overwrite of a running run is refused in one line naming its pid; status.json tells how each run
ended (a killed one reads 'dead'); a checkpoint save whose write fails ends the run in one line with
the earlier checkpoints intact. Real processes and real write failures throughout."""

import json
import os
import shutil
import signal
import subprocess
import sys

from conftest import command_lines, tiny_flags
from test_resume import REPO, start_training, wait_for_train_step

from tokjax import checkpointing, inspection, train
from tokjax.metric_writers import read_metrics

# Long enough to outlast the refused commands: the test stops it.
LONG = dict(
    train__steps=100_000,
    train__log_every=5,
    train__eval_every=100_000,
    train__checkpoint_every=100_000,
)


def _error_line(err: str) -> str:
  assert 'Traceback' not in err, err[-3000:]
  (line,) = [l for l in err.splitlines() if l.startswith('error:')]
  return line


def test_a_running_training_owns_its_workdir_and_a_killed_one_lets_go(tmp_path):
  live, killed = str(tmp_path / 'live'), str(tmp_path / 'killed')
  proc, victim = start_training(live, **LONG), start_training(killed, **LONG)
  try:
    wait_for_train_step(killed, 5, victim)
    victim.kill()  # SIGKILL: nothing in it runs to write its end.
    victim.wait(timeout=60)
    with open(os.path.join(killed, 'status.json')) as f:
      assert json.load(f)['state'] == 'running'
    assert train.read_status(killed)['state'] == 'dead'
    train.release(train.lock_workdir(killed))  # The kernel dropped its lock.

    wait_for_train_step(live, 5, proc)
    argv = lambda *extra: [*tiny_flags(live, **LONG), *extra]
    cases = [argv(), argv('--resume'), argv('--overwrite'), argv('--overwrite', '--resume')]
    ended = command_lines('tokjax.train', cases, cwd=REPO)
    assert proc.poll() is None  # The refusals met a live run.
    status = train.read_status(live)
    assert (status['state'], status['pid']) == ('running', proc.pid)
    for code, err in ended[:3]:
      assert code == 2 and f'process {proc.pid} is training there' in _error_line(err), err
    code, err = ended[3]
    assert code == 2 and '--overwrite deletes the run' in _error_line(err)

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 128 + signal.SIGTERM
  finally:
    for p in (proc, victim):
      if p.poll() is None:
        p.kill()
  status = train.read_status(live)
  assert status['state'] == 'stopped' and status['checkpoint_step'] == status['step']
  assert checkpointing.manager(live).latest_step() == status['step']
  rows = [r for r in read_metrics(os.path.join(live, 'metrics.jsonl')) if r['split'] == 'train']
  # One writer from step 5 on: every logged step once, in order, none deleted.
  assert [r['step'] for r in rows] == list(range(5, status['step'] + 1, 5))


def test_a_failed_checkpoint_write_ends_the_run_in_one_line(tiny_run, tmp_path):
  """A resume of the shared run (checkpoints at steps 3 and 6) to step 9, in a process whose files
  may not grow past 40 kB (RLIMIT_FSIZE): the run's logs stay under it, the step 9 checkpoint's
  array files do not, and the kernel fails their writes (EFBIG), as a full disk would (ENOSPC)."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(tiny_run, workdir)
  flags = tiny_flags(workdir, train__steps=9, train__log_every=1, train__checkpoint_every=3)
  limit = 40_000
  # The limit is set in the child before it becomes `python -m tokjax.train` (exec keeps it).
  limited = (
      'import os, resource, sys; '
      f'resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); '
      "os.execv(sys.executable, [sys.executable, '-m', 'tokjax.train', *sys.argv[1:]])"
  )
  proc = subprocess.run(
      [sys.executable, '-c', limited, *flags, '--resume', '--extend_schedule'],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
      # Read the suite's compilation cache but write nothing to it: an entry cut at the limit
      # would be a damaged entry for every later test.
      env=dict(os.environ, JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=str(1 << 50)),
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = _error_line(proc.stderr)
  assert 'saving checkpoint step 9' in line and 'File too large (EFBIG)' in line, line
  assert 'checkpoint step 6 is intact' in line and 'resume with: python -m tokjax.train' in line
  assert proc.stderr.count('Traceback') == 0
  status = train.read_status(workdir)
  assert (status['state'], status['step'], status['checkpoint_step']) == ('failed', 9, 6)
  ckpt = os.path.join(workdir, 'checkpoints')
  assert sorted(os.listdir(ckpt)) == ['3', '6']  # No partial step 9 left behind.
  for step in (3, 6):
    assert checkpointing.step_problem(os.path.join(ckpt, str(step))) is None
  assert inspection.load_checkpoint(workdir).step == 6
