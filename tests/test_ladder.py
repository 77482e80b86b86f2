"""The budget ladder: paired statistics over seeds, and a stopped ladder resuming exactly."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tokjax import config_files, evaluation
from tokjax.errors import UserError
from tokjax.lab import ladder


def _result(method, seed, unit_ce, bpb, budget=1e6):
  nbytes = [100] * len(unit_ce)
  split = {'bpb': bpb, 'bpb_se': 0.01, 'unit_ce': unit_ce, 'unit_bytes': nbytes, 'rate': 0.2}
  return {
      'run': dict(method=method, budget=budget, seed=seed, seq_len=256, lr=2e-3),
      'val': dict(split),
      'test': dict(split),
      'cross': {},
      'params': 10,
      'train_flops': 1e12,
      'train_bytes': int(budget),
      'train_rate': 0.2,
      'train_bytes_per_s': 1.0,
  }


def test_paired_over_seeds_averages_units_over_matching_seeds():
  a = [_result('hnet', 0, [10.0, 20.0, 30.0], 2.0), _result('hnet', 1, [12.0, 22.0, 28.0], 2.1)]
  b = [_result('policy', 1, [11.0, 19.0, 27.0], 2.05), _result('policy', 0, [9.0, 21.0, 33.0], 1.9)]
  p = ladder.paired_over_seeds(a, b, 'test')
  want = evaluation.paired_difference(
      np.mean([[10, 20, 30], [12, 22, 28]], axis=0),
      np.mean([[9, 21, 33], [11, 19, 27]], axis=0),
      [100, 100, 100],
  )
  assert p['diff'] == pytest.approx(want['diff']) and p['se'] == pytest.approx(want['se'])
  # Seeds are matched by number, not by order: per-seed differences 2.0 - 1.9 and 2.1 - 2.05.
  assert p['seed_se'] == pytest.approx(np.std([0.1, 0.05], ddof=1) / math.sqrt(2))
  assert p['seeds'] == 2


def test_summarize_pairs_every_method_with_the_reference_at_its_best_lr():
  results = [_result('policy', 0, [10.0, 10.0], 1.5), _result('uniform', 0, [11.0, 12.0], 1.6)]
  worse = _result('policy', 0, [50.0, 50.0], 9.0)
  worse['run']['lr'] = 1e-3
  worse['val']['bpb'] = 9.0
  rows = ladder.summarize(results + [worse], 'policy')
  uni = next(r for r in rows if r['method'] == 'uniform')
  assert uni['paired']['diff'] == pytest.approx(3.0 / 200 / math.log(2))
  assert uni['paired']['a_better'] == 0.0
  assert ladder.best_lrs(rows) == {'policy': 2e-3, 'uniform': 2e-3}


def _ladder(out, *extra, methods='policy'):
  """The ladder command over tiny runs (39 steps each, checkpoints every 10).

  Enough steps after the first checkpoint that the stop below lands before the run ends, and few
  checkpoints: each save costs about a second.
  """
  cmd = [sys.executable, '-m', 'tokjax.lab.ladder', '--tiny', '--corpus', 'stdlib']
  cmd += ['--set', 'data.max_bytes=200000', '--set', 'train.checkpoint_every=10']
  cmd += ['--set', 'train.log_every=5', '--set', 'eval.max_batches=2']
  cmd += ['--budgets', '1e4', '--methods', methods, '--jobs', '1', '--progress_s', '2']
  return cmd + ['--out', str(out), *extra]


def _run_dir(out, method='policy'):
  (name,) = [n for n in os.listdir(os.path.join(out, 'runs')) if n.startswith(method + '-')]
  return os.path.join(out, 'runs', name)


def test_trend_fits_each_paired_difference_over_budgets_and_checks_the_papers_ordering():
  results = [_result('policy', 0, [10.0, 10.0], 2.0, b) for b in (1e6, 4e6)]
  results += [_result('bpe', 0, [9.0, 9.0], 1.9, 1e6), _result('bpe', 0, [9.5, 9.5], 1.95, 4e6)]
  results += [_result(m, 0, [11.0, 11.0], 2.1, 4e6) for m in ('hnet', 'uniform')]
  t = ladder.trend(ladder.summarize(results, 'policy'), 'policy')[256]
  nats_to_bpb = 1 / 100 / math.log(2)  # One nat more per 100-byte unit.
  assert t['rungs'][1e6]['bpe'][0] == pytest.approx(-nats_to_bpb)
  slope, crossing = t['fits']['bpe']
  # Half the gap closes per 4x budget: the line reaches 0 one more 4x step on, at 1.6e7 bytes.
  assert slope == pytest.approx(nats_to_bpb / 2) and crossing == pytest.approx(1.6e7)
  assert 'hnet' not in t['fits']  # One budget only: no line.
  # At 1e6 H-Net and uniform are missing; at 4e6 BPE-guided still beats the policy.
  assert t['ordering'] == {1e6: None, 4e6: False}
  results[3] = _result('bpe', 0, [10.0, 10.0], 2.0, 4e6)
  t = ladder.trend(ladder.summarize(results, 'policy'), 'policy')[256]
  assert t['ordering'][4e6] is True and t['fits']['bpe'][1] is None  # At 0: nothing to reach.


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """A tiny ladder run trained without a stop, started in the background; call to wait for it.

  It is pinned to the last core (a child inherits the affinity of the thread that starts it), so that
  the stopped ladder, whose one job takes the first core, runs beside it instead of sharing one core
  while another idles.
  """
  whole = tmp_path_factory.mktemp('whole')
  cores = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {max(cores)})
  try:
    reference = subprocess.Popen(_ladder(whole), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  finally:
    os.sched_setaffinity(0, cores)

  def wait():
    if reference.returncode is None:
      out = reference.communicate(timeout=600)[0]
      assert reference.returncode == 0, out
    return whole

  yield wait
  if reference.poll() is None:
    reference.kill()


def _final(out):
  """A finished run's test bpb, per-unit CE and logged metrics (timings left out)."""
  with open(os.path.join(_run_dir(out), 'result.json')) as f:
    r = json.load(f)
  rows = [json.loads(x) for x in open(os.path.join(_run_dir(out), 'metrics.jsonl'))]
  logged = [
      {k: v for k, v in x.items() if k not in ('bytes_per_s', 'model_tflops', 'mfu')} for x in rows
  ]
  return r['test']['bpb'], r['test']['unit_ce'], logged


def test_a_stopped_ladder_resumes_and_ends_as_an_uninterrupted_one(tmp_path, uninterrupted):
  stopped = tmp_path / 'stopped'
  # Two runs, one job: the second is still waiting when the first is stopped.
  two = dict(methods='policy,uniform')
  proc = subprocess.Popen(_ladder(stopped, **two), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 300
  while time.time() < deadline:  # Stop once the run has saved its first checkpoint.
    runs = stopped / 'runs'
    if runs.exists() and os.listdir(runs):
      ckpts = os.path.join(_run_dir(stopped), 'checkpoints')
      if os.path.isdir(ckpts) and any(n.isdigit() for n in os.listdir(ckpts)):
        break
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out = proc.communicate(timeout=300)[0].decode()
  assert proc.returncode == 2, out
  assert 'error: stopped by SIGTERM' in out and '--resume' in out.splitlines()[-1], out
  assert not os.path.exists(os.path.join(_run_dir(stopped), 'result.json'))

  run, scoring = ladder.read_spec(_run_dir(stopped))  # The command's own run, as it wrote it.
  with pytest.raises(UserError, match='holds an unfinished run; pass --resume'):
    ladder.execute(str(stopped), [run], scoring, 1, False, 60, 4)

  resumed = subprocess.run(
      _ladder(stopped, '--resume', **two), capture_output=True, text=True, timeout=600
  )
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  log = open(os.path.join(_run_dir(stopped), 'train.log')).read()
  assert 'resumed from step' in log  # The run really was cut short and continued.
  assert 'continue with the ladder command and --resume' in log
  assert _final(stopped) == _final(uninterrupted())  # Bitwise: exact resume.

  # Idempotent: a finished ladder reads its results back and trains nothing.
  assert ladder.status(str(stopped), run, scoring) == 'done'
  assert os.path.exists(os.path.join(_run_dir(stopped, 'uniform'), 'result.json'))
  mtime = os.path.getmtime(os.path.join(_run_dir(stopped), 'metrics.jsonl'))
  assert ladder.execute(str(stopped), [run], scoring, 1, False, 60, 4) == 0
  assert os.path.getmtime(os.path.join(_run_dir(stopped), 'metrics.jsonl')) == mtime
  for name in ('results.md', 'results.json', 'ladder.png'):
    assert os.path.getsize(stopped / name) > 0
  assert ladder.status(str(stopped), run, ladder.Scoring(scoring.unit_bytes, ('stdlib_docs',))) == (
      'rescore'
  )


def test_a_job_on_two_cores_splits_the_batch_over_two_devices_and_trains_the_same_run(
    tmp_path, uninterrupted
):
  whole = uninterrupted()
  two = tmp_path / 'two'
  done = subprocess.run(
      _ladder(two, '--cores_per_job', '2'), capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stdout + done.stderr
  with open(os.path.join(_run_dir(two), 'result.json')) as f:
    assert json.load(f)['train_devices'] == 2
  with open(os.path.join(_run_dir(whole), 'result.json')) as f:
    assert json.load(f)['train_devices'] == 1
  # The same run up to the order of the gradient's sums over the two halves of the batch.
  bpb, unit_ce, logged = _final(two)
  ref_bpb, ref_unit_ce, ref_logged = _final(whole)
  assert bpb == pytest.approx(ref_bpb, rel=1e-5)
  np.testing.assert_allclose(unit_ce, ref_unit_ce, rtol=1e-4)
  assert [r['step'] for r in logged] == [r['step'] for r in ref_logged]
  losses = [r['loss'] for r in logged if 'loss' in r]
  np.testing.assert_allclose(losses, [r['loss'] for r in ref_logged if 'loss' in r], rtol=1e-4)


def test_bad_ladder_flags_get_one_line(tmp_path):
  bad_table = tmp_path / 'lr.json'
  bad_table.write_text('{"policy": "fast"}')
  cases = [
      (['--methods', 'policy,nosuch'], 'unknown method'),
      (['--budgets', 'lots'], '--budgets and --lrs take numbers'),
      (['--methods', 'uniform'], '--reference=policy must be one of --methods'),
      (['--override', 'hnet'], 'must be METHOD:FIELD=VALUE'),
      (['--set', 'model.nosuch=1'], 'not a config field'),
      (['--lr_table', str(tmp_path / 'nosuch.json')], 'nosuch.json: no such file'),
      (['--lr_table', str(bad_table)], 'is not a {method: lr} JSON object'),
      (['--cores_per_job', '3'], '--cores_per_job=3 must divide the batch of 16'),
      (['--cores_per_job', '4', '--set', 'data.batch_size=6'], 'must divide the batch of 6'),
      (['--cores_per_job', '0'], '--cores_per_job=0 must be at least 1'),
  ]
  # Side by side: each command is all start-up (importing jax), and those overlap.
  procs = [
      (
          subprocess.Popen(
              [sys.executable, '-m', 'tokjax.lab.ladder', '--out', str(tmp_path / str(i)), *args],
              stdout=subprocess.PIPE,
              stderr=subprocess.PIPE,
              text=True,
          ),
          words,
      )
      for i, (args, words) in enumerate(cases)
  ]
  for p, words in procs:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error:') and words in lines[0], err


@pytest.mark.parametrize('method', ['policy', 'bpe', 'hnet', 'uniform'])
def test_the_proxy_config_is_the_ladders_run_of_its_rung(method):
  """configs/proxy.py promises the ladder's numbers for its rung, so it must train that run."""
  overrides = {
      'hnet': ('boundary.hnet.ratio_weight=0.3',),
      'bpe': ('boundary.bpe.pretokenize=none',),
  }.get(method, ())
  run = ladder.Run(method, 4e6, 0, 256, 8e-3, overrides, corpus='shakespeare')
  want = ladder.build_config(run).to_dict()
  got = config_files.load('proxy', method).to_dict()
  for c in (want, got):
    c['train'].pop('workdir')
  assert got == want
