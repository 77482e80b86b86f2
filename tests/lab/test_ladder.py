"""The budget ladder: paired statistics over matched seeds and clusters judged by the rule, a stopped
ladder resuming exactly, and finished runs packed to their result.json."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from conftest import command_lines
import numpy as np
import pytest
from scipy import stats

from tokjax import significance
from tokjax.config import files as config_files
from tokjax.data import baselines, pipeline
from tokjax.errors import UserError
from tokjax.lab import ladder, ladder_report


def _result(method, seed, unit_ce, bpb, budget=1e6, documents=None, clusters=None):
  nbytes = [100] * len(unit_ce)
  documents = list(range(len(unit_ce))) if documents is None else documents
  split = {'bpb': bpb, 'bpb_se': 0.01, 'unit_ce': unit_ce, 'unit_bytes': nbytes, 'rate': 0.2}
  split['unit_documents'] = documents
  split['unit_clusters'] = documents if clusters is None else clusters
  return {
      'run': dict(
          method=method, budget=budget, seed=seed, seq_len=256, lr=2e-3, corpus='shakespeare'
      ),
      'val': dict(split),
      'test': dict(split),
      'cross': {},
      'params': 10,
      'train_flops': 1e12,
      'train_bytes': int(budget),
      'train_rate': 0.2,
      'train_bytes_per_s': 1.0,
  }


def test_paired_over_seeds_averages_units_over_matching_seeds_and_clusters_them_by_work():
  docs = [0, 1, 2, 3, 4]
  works = [0, 0, 1, 2, 2]  # Windows of documents 0 and 1 (two pieces of one play) share a cluster.
  ces = {
      ('hnet', 0): [10.0, 20.0, 30.0, 5.0, 8.0],
      ('hnet', 1): [12.0, 22.0, 28.0, 6.0, 9.0],
      ('policy', 1): [11.0, 19.0, 27.0, 5.0, 9.0],
      ('policy', 0): [9.0, 21.0, 33.0, 4.0, 7.0],
  }
  bpb = {('hnet', 0): 2.0, ('hnet', 1): 2.1, ('policy', 1): 2.05, ('policy', 0): 1.9}
  run = lambda m, s: _result(m, s, ces[m, s], bpb[m, s], documents=docs, clusters=works)
  a = [run('hnet', 0), run('hnet', 1)]
  b = [run('policy', 1), run('policy', 0)]
  b.append(_result('policy', 2, [1.0] * 5, 0.5, documents=docs, clusters=works))  # No hnet seed 2.
  p = ladder_report.paired_over_seeds(a, b, 'test')
  mean = lambda m: np.mean([ces[m, 0], ces[m, 1]], axis=0)
  want = significance.paired_difference(mean('hnet'), mean('policy'), [100] * 5, works)
  assert p['diff'] == pytest.approx(want['diff']) and p['se'] == pytest.approx(want['se'])
  assert p['clustered_se'] == pytest.approx(want['clustered_se']) and p['clusters'] == 3
  by_doc = significance.paired_difference(mean('hnet'), mean('policy'), [100] * 5, docs)
  assert p['clustered_se'] != pytest.approx(by_doc['clustered_se'])  # Works, not documents.
  # Seeds are matched by number, not by order: per-seed differences 2.0 - 1.9 and 2.1 - 2.05.
  seed_se = np.std([0.1, 0.05], ddof=1) / math.sqrt(2)
  assert p['seed_se'] == pytest.approx(seed_se) and p['seeds'] == [0, 1]
  # The rule: both errors in quadrature, Welch-Satterthwaite df from 3 - 1 and 2 - 1, a t-test.
  c = want['clustered_se']
  combined = math.sqrt(c**2 + seed_se**2)
  df = combined**4 / (c**4 / 2 + seed_se**4 / 1)
  assert p['combined_se'] == pytest.approx(combined) and p['df'] == pytest.approx(df)
  assert p['p'] == pytest.approx(2 * stats.t.sf(abs(p['diff']) / combined, df))
  assert p['p'] == pytest.approx(0.822, abs=1e-3) and p['verdict'] == 'not found'
  # A lead over ten seeds of little spread is found: nearly all the error is the seeds' (df 9).
  shift = lambda s: 1.0 + 0.01 * (s % 2)  # Nats per window.
  bpb_of = lambda ce: sum(ce) / 500 / math.log(2)
  many_a = [[1.0 + shift(s) + w for w in range(5)] for s in range(10)]
  many_b = [[1.0 + w + 0.001 * (w % 2) for w in range(5)] for s in range(10)]
  q = ladder_report.paired_over_seeds(
      [
          _result('hnet', s, ce, bpb_of(ce), documents=docs, clusters=works)
          for s, ce in enumerate(many_a)
      ],
      [
          _result('policy', s, ce, bpb_of(ce), documents=docs, clusters=works)
          for s, ce in enumerate(many_b)
      ],
      'test',
  )
  assert (
      q['diff'] > 0
      and q['df'] == pytest.approx(9, abs=0.5)
      and q['p'] < 0.05
      and q['verdict'] == 'found'
  )


def test_pairing_refuses_seed_sets_that_share_no_seed():
  a = [_result('hnet', 0, [10.0, 20.0], 2.0), _result('hnet', 1, [12.0, 22.0], 2.1)]
  b = [_result('policy', 2, [11.0, 19.0], 2.05)]
  with pytest.raises(
      UserError, match=r'hnet \(seeds \[0, 1\]\) and policy \(seeds \[2\]\) share no seed'
  ):
    ladder_report.paired_over_seeds(a, b, 'test')
  with pytest.raises(UserError, match='no seed to pair'):
    ladder_report.summarize(a + b, 'policy')


def test_every_column_of_a_row_uses_the_seeds_it_shares_with_the_reference():
  policy = [_result('policy', s, [10.0, 10.0], 2.0) for s in (0, 1, 2)]
  hnet = [_result('hnet', s, [11.0 + s, 11.0], 2.1 + s) for s in (0, 1)]
  lone = _result('hnet', 3, [99.0, 99.0], 9.0)  # The policy has no seed 3: left out everywhere.
  (row,) = [
      r for r in ladder_report.summarize(policy + hnet + [lone], 'policy') if r['method'] == 'hnet'
  ]
  assert row['seeds'] == [0, 1]
  assert row['test_bpb'] == pytest.approx(2.6) and row['val_bpb'] == pytest.approx(2.6)
  assert row['paired']['seeds'] == [0, 1]
  assert row['paired']['diff'] == pytest.approx(2.5 / 200 / math.log(2))


def test_out_of_domain_uses_the_seeds_scored_there_and_names_them(tmp_path):
  def run(method, seed, cross_ce):
    r = _result(method, seed, [10.0, 10.0], 2.0)
    if cross_ce is not None:  # A run trained before --cross has no out-of-domain score.
      r['cross'] = {'code': _result(method, seed, cross_ce, cross_ce[0] / 100)['test']}
      r['cross']['code']['rate'] = 0.2 + 0.05 * seed  # Each method's rate there is printed.
    return r

  policy = [run('policy', 0, None), run('policy', 1, [30.0, 30.0]), run('policy', 2, [32.0, 30.0])]
  hnet = [run('hnet', 0, None), run('hnet', 1, [31.0, 30.0]), run('hnet', 2, [34.0, 31.0])]
  rows = ladder_report.summarize(policy + hnet, 'policy')
  (row,) = [r for r in rows if r['method'] == 'hnet']
  assert row['seeds'] == [0, 1, 2] and row['cross_seeds'] == {'code': [1, 2]}
  assert row['cross_bpb']['code'] == pytest.approx((0.31 + 0.34) / 2)
  p = row['cross_paired']['code']
  assert p['seeds'] == [1, 2] and p['diff'] == pytest.approx(4.0 / 400 / math.log(2))
  meta = dict(reference='policy', target_rate=0.2, command='ladder', corpus='c', unit_bytes=200)
  ladder_report.write_outputs(str(tmp_path), rows, meta)
  md = (tmp_path / 'results.md').read_text()
  assert row['cross_rate'] == {'code': pytest.approx(0.275)}
  assert (
      '0.325, rate 0.275 (seeds 1,2) | +0.0144' in md
      and '0.310, rate 0.275 (seeds 1,2) | (ref)' in md
  )


def test_the_lr_is_picked_over_the_seeds_every_lr_has():
  runs = [_result('policy', 0, [10.0, 10.0], 2.0), _result('policy', 1, [10.0, 10.0], 1.0)]
  other = _result('policy', 0, [10.0, 10.0], 1.9)
  other['run']['lr'] = 4e-3
  # Over both seeds lr 2e-3 averages 1.5, but on seed 0, the only one both lrs have, 4e-3 is better.
  rows = ladder_report.summarize(runs + [other], 'policy')
  assert ladder_report.best_lrs(rows) == {'policy': 4e-3}


def test_summarize_pairs_every_method_with_the_reference_at_its_best_lr():
  results = [_result('policy', 0, [10.0, 10.0], 1.5), _result('uniform', 0, [11.0, 12.0], 1.6)]
  worse = _result('policy', 0, [50.0, 50.0], 9.0)
  worse['run']['lr'] = 1e-3
  worse['val']['bpb'] = 9.0
  rows = ladder_report.summarize(results + [worse], 'policy')
  uni = next(r for r in rows if r['method'] == 'uniform')
  assert uni['paired']['diff'] == pytest.approx(3.0 / 200 / math.log(2))
  assert uni['paired']['a_better'] == 0.0
  assert ladder_report.best_lrs(rows) == {'policy': 2e-3, 'uniform': 2e-3}


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


def _noisy(method, seed, base, shift, budget):
  """A run whose windows (two per document) are base + shift nats, the shift seed-dependent."""
  ce = [x + shift for x in base]
  docs = [i // 2 for i in range(len(base))]
  return _result(method, seed, ce, sum(ce) / 100 / len(ce) / math.log(2), budget, documents=docs)


def test_trend_fits_each_paired_difference_over_budgets_and_checks_the_papers_ordering():
  base = [10.0, 12.0, 9.0, 11.0, 10.5, 11.5, 9.5, 12.5]  # 8 windows of 4 documents.
  seeds = (0, 1, 2)
  results = [_noisy('policy', s, base, 0.0, b) for b in (1e6, 4e6) for s in seeds]
  results += [_noisy('bpe', s, base, -1.0, 1e6) for s in seeds]
  results += [_noisy('bpe', s, base, -0.5 - 0.1 * (s % 2), 4e6) for s in seeds]
  results += [
      _noisy(m, s, base, 1.0 + 0.1 * (s % 2), 4e6) for m in ('hnet', 'uniform') for s in seeds
  ]
  t = ladder_report.trend(ladder_report.summarize(results, 'policy'), 'policy')[256]
  nats_to_bpb = 1 / 100 / math.log(2)  # One nat more per 100-byte unit.
  assert t['rungs'][1e6]['bpe']['diff'] == pytest.approx(-nats_to_bpb)
  slope, crossing = t['fits']['bpe']
  # Half the gap (and a bit) closes per 4x budget: the line reaches 0 one more 4x step on.
  shrink = 1 - 0.5 - 0.1 / 3  # The mean 4e6 gap is 0.5 + 0.1 / 3 nats.
  assert slope == pytest.approx(shrink * nats_to_bpb) and crossing == pytest.approx(
      4e6 * 4 ** ((1 - shrink) / shrink)
  )
  assert 'hnet' not in t['fits']  # One budget only: no line.
  # At 1e6 H-Net and uniform are missing; at 4e6 BPE-guided is found better than the policy.
  assert t['rungs'][4e6]['bpe']['verdict'] == 'found'
  assert t['ordering'] == {1e6: 'not all run', 4e6: 'does not hold'}
  results = [r for r in results if not (r['run']['method'] == 'bpe' and r['run']['budget'] == 4e6)]
  results += [_noisy('bpe', s, base, 0.0, 4e6) for s in seeds]
  t = ladder_report.trend(ladder_report.summarize(results, 'policy'), 'policy')[256]
  assert t['ordering'][4e6] == 'holds' and t['fits']['bpe'][1] is None  # At 0: nothing to reach.
  # With one seed the seed error is unknown: the same differences only count as 'one seed'.
  one = [r for r in results if r['run']['seed'] == 0]
  t = ladder_report.trend(ladder_report.summarize(one, 'policy'), 'policy')[256]
  assert t['ordering'][4e6] == 'one seed' and t['rungs'][4e6]['hnet']['verdict'] == 'one seed'
  # A seed spread as large as the difference: H-Net's lead is no longer found.
  noisy = [r for r in results if r['run']['method'] != 'hnet']
  noisy += [_noisy('hnet', s, base, 1.0 + 3.0 * s, 4e6) for s in seeds]
  t = ladder_report.trend(ladder_report.summarize(noisy, 'policy'), 'policy')[256]
  assert t['rungs'][4e6]['hnet']['verdict'] == 'not found' and t['ordering'][4e6] == 'does not hold'


_RUNG_UNITS = [10.0, 12.0, 9.0, 11.0, 10.5, 11.5, 9.5, 12.5]


def _rung(*leads):
  """Seeds 0-2 at 4e6 of the policy and of each (method, lead in nats per unit), with a seed spread
  of 0.2 nats."""
  results = [_noisy('policy', s, _RUNG_UNITS, 0.0, 4e6) for s in (0, 1, 2)]
  return results + [
      _noisy(m, s, _RUNG_UNITS, d + 0.2 * (s % 2), 4e6) for m, d in leads for s in (0, 1, 2)
  ]


def test_a_rung_judges_its_methods_by_their_holm_adjusted_p():
  # Two small leads, each found alone (p 0.03), and a large one.
  results = _rung(('hnet', 0.3), ('uniform', 0.3), ('bpe', 3.0))
  slow = _noisy('hnet', 0, _RUNG_UNITS, 2.0, 4e6)  # Worse on val: not H-Net's best lr.
  slow['run']['lr'] = 4e-3
  rows = ladder_report.summarize(results + [slow], 'policy')
  best = {r['method']: r['paired'] for r in rows if r.get('paired') and r['best_lr']}
  assert set(best) == {'hnet', 'uniform', 'bpe'}
  raw = [best[m]['p'] for m in ('hnet', 'uniform', 'bpe')]
  adjusted = significance.holm(raw)
  assert [best[m]['p_holm'] for m in ('hnet', 'uniform', 'bpe')] == pytest.approx(adjusted)
  assert raw[0] < 0.05 <= adjusted[0] and best['hnet']['verdict'] == 'not found'
  assert adjusted[0] == pytest.approx(2 * raw[0])  # The two small ones: 2 p, then max(2 p, p).
  assert best['bpe']['verdict'] == 'found' and best['bpe']['family_size'] == 3
  assert best['hnet']['family'] == 'shakespeare test, 4e+06 B, L 256'
  # H-Net at its other lr stands in for H-Net's row in a family of the same size.
  other = next(r['paired'] for r in rows if r['method'] == 'hnet' and not r['best_lr'])
  assert other['family_size'] == 3
  assert other['p_holm'] == pytest.approx(significance.holm([other['p']] + raw[1:])[0])
  t = ladder_report.trend(rows, 'policy')[256]['rungs'][4e6]
  assert t['hnet']['p_holm'] == pytest.approx(adjusted[0]) and t['hnet']['verdict'] == 'not found'


def test_a_method_that_sees_the_future_is_an_oracle_outside_the_family():
  rows = ladder_report.summarize(_rung(('hnet', 0.3), ('bpe_oracle', -3.0)), 'policy')
  best = {r['method']: r['paired'] for r in rows if r.get('paired')}
  assert best['bpe_oracle']['verdict'] == ladder_report.ORACLE
  assert best['bpe_oracle']['p_holm'] is None and best['bpe_oracle']['family'] is None
  # H-Net is judged alone: the oracle's comparison does not count in its family.
  assert best['hnet']['family_size'] == 1
  assert best['hnet']['p_holm'] == pytest.approx(best['hnet']['p'])


def test_a_bpe_run_recorded_before_bpe_became_causal_reads_as_the_oracle(tmp_path):
  old = ladder.Run('bpe', 4e6, 0, 256, 8e-3, ('boundary.bpe.pretokenize=none',))
  d = tmp_path / 'runs' / old.name
  d.mkdir(parents=True)
  spec = ladder.spec_of(old, ladder.Scoring())
  del spec['version']  # As ladders wrote it before the version existed.
  (d / 'result.json').write_text(json.dumps(spec | {'unit_bytes': 2048}))
  run, _ = ladder.read_spec(str(d))
  assert run == ladder.Run(
      'bpe_oracle', 4e6, 0, 256, 8e-3, ('boundary.bpe_oracle.pretokenize=none',)
  )
  # The causal run of that name is not what the folder holds: one line naming where it belongs.
  with pytest.raises(UserError, match=f'holds a run of bpe_oracle.*to {re.escape(run.name)}'):
    ladder.status(str(tmp_path), old, ladder.Scoring())
  # A spec written today keeps 'bpe' causal.
  (d / 'result.json').write_text(
      json.dumps(ladder.spec_of(old, ladder.Scoring()) | {'unit_bytes': 2048})
  )
  assert (
      ladder.read_spec(str(d))[0] == old
      and ladder.status(str(tmp_path), old, ladder.Scoring()) == 'done'
  )


def test_a_table_reads_an_old_bpe_record_under_its_oracle_name(tmp_path):
  oracle = ladder.Run('bpe_oracle', 4e6, 0, 256, 8e-3)
  spec = ladder.spec_of(ladder.Run('bpe', 4e6, 0, 256, 8e-3), ladder.Scoring())
  del spec['version']
  result = _result('bpe', 0, [10.0, 11.0], 2.0) | spec | {'unit_bytes': 2048}
  d = tmp_path / 'runs' / oracle.name  # Where a committed record moved.
  d.mkdir(parents=True)
  (d / 'result.json').write_text(json.dumps(result))
  (r,) = ladder.load_results(str(tmp_path), [oracle])
  assert r['run']['method'] == 'bpe_oracle' and r['test'] == result['test']


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
  # The classical models of the runs' own split stand beside the table.
  with open(stopped / 'results.json') as f:
    found = json.load(f)['meta']['baselines']
  data = ladder.build_config(run).data
  assert found['test'] == pipeline.classical_bpb('stdlib', 'test', data)
  assert set(found) == {'val', 'test'} and found['test']['ppmd'] < found['test']['xz']
  assert f'Classical baselines, test: {baselines.describe(found["test"])}' in (
      (stopped / 'results.md').read_text()
  )
  # Its table written apart from its runs (--runs_in): the same rows, no run moved or trained.
  apart = tmp_path / 'apart'
  proc = subprocess.run(
      _ladder(apart, '--report', '--runs_in', str(stopped), **two),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(stopped / 'results.json') as f, open(apart / 'results.json') as g:
    assert json.load(f)['rows'] == json.load(g)['rows']
  assert not (apart / 'runs').exists()
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


def test_a_packed_run_is_its_result_json_and_reports_as_before(tmp_path, uninterrupted):
  whole = uninterrupted()
  out = tmp_path / 'study' / 'stdlib'
  shutil.copytree(whole / 'runs', out / 'runs', ignore=shutil.ignore_patterns('checkpoints'))
  run, scoring = ladder.read_spec(_run_dir(out))
  before = ladder_report.summarize(ladder.load_results(str(whole), [run]), 'policy')
  # A run scored before results carried their windows' documents: pack derives them from the split.
  path = os.path.join(_run_dir(out), 'result.json')
  with open(path) as f:
    r = json.load(f)
  want = {s: r[s].pop('unit_documents') for s in ('val', 'test')}
  assert len(want['test']) > len(want['val'])  # Another split would not fit the units.
  with open(path, 'w') as f:
    json.dump(r, f)

  assert ladder.pack(str(tmp_path / 'study')) == 1
  assert os.listdir(_run_dir(out)) == ['result.json']
  with open(path) as f:
    r = json.load(f)
  assert {s: r[s]['unit_documents'] for s in ('val', 'test')} == want
  assert ladder.read_spec(_run_dir(out)) == (run, scoring)  # From result.json alone.
  assert ladder.status(str(out), run, scoring) == 'done'
  after = ladder_report.summarize(ladder.load_results(str(out), [run]), 'policy')
  assert json.dumps(after) == json.dumps(before)  # NaN (one document: no s.e.) included.
  meta = dict(corpus='stdlib', command='', reference='policy', unit_bytes=2048, target_rate=0.2)
  ladder_report.write_outputs(str(out), after, meta, markdown=False)
  assert sorted(os.listdir(out)) == ['ladder.png', 'results.json', 'runs']


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
      (['--cores_per_job', '4', '--batch_size', '6'], 'must divide the batch of 6'),
      (['--cores_per_job', '0'], '--cores_per_job=0 must be at least 1'),
      (['--corpus', str(tmp_path / 'nosuch')], 'does not exist'),
      (['--cross', str(tmp_path / 'nosuch')], 'does not exist'),
  ]
  argvs = [['--out', str(tmp_path / str(i)), *args] for i, (args, _) in enumerate(cases)]
  for (code, err), (_, words) in zip(command_lines('tokjax.lab.ladder', argvs), cases):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error:') and words in lines[0], err


@pytest.mark.parametrize('method', ['policy', 'bpe', 'bpe_oracle', 'hnet', 'uniform'])
def test_the_proxy_config_is_the_ladders_run_of_its_rung(method):
  """configs/proxy.py promises the ladder's numbers for its rung, so it must train that run."""
  overrides = {
      'hnet': ('boundary.hnet.ratio_weight=0.3',),
      'bpe': ('boundary.bpe.pretokenize=none',),
      'bpe_oracle': ('boundary.bpe_oracle.pretokenize=none',),
  }.get(method, ())
  run = ladder.Run(method, 4e6, 0, 256, 8e-3, overrides, corpus='shakespeare')
  want = ladder.build_config(run).to_dict()
  got = config_files.load('proxy', method).to_dict()
  for c in (want, got):
    c['train'].pop('workdir')
  assert got == want


def test_greedy_scoring_rescores_a_finished_run_and_keeps_its_curve(tmp_path, uninterrupted):
  whole = uninterrupted()
  out = tmp_path / 'greedy'
  shutil.copytree(whole / 'runs', out / 'runs')
  d = _run_dir(out)
  run, scoring = ladder.read_spec(d)
  greedy = ladder.Scoring(scoring.unit_bytes, scoring.cross, greedy=True)
  assert ladder.status(str(out), run, greedy) == 'rescore'
  ladder.write_spec(d, run, greedy)
  r = ladder.work(d)
  assert ladder.status(str(out), run, greedy) == 'done'
  assert r['test']['bpb'] == _final(whole)[0]  # Scored again, not retrained.
  g = r['test_greedy']
  assert set(ladder.PER_UNIT).isdisjoint(g) and 0 <= g['whitespace_recall'] <= 1
  assert g['bytes'] == r['test']['bytes'] and g['bpb'] != r['test']['bpb']
  val = [x for x in _final(whole)[2] if x['split'] == 'val']
  assert [c['step'] for c in r['curve']] == [x['step'] for x in val]
  assert r['curve'][-1]['greedy_whitespace_recall'] == val[-1]['greedy_whitespace_recall']
  # A later pass that asks for less keeps the greedy scores, and the result says it holds them.
  ladder.write_spec(d, run, scoring)
  again = ladder.work(d)
  assert again['test_greedy']['bpb'] == g['bpb'] and again['scoring']['greedy'] is True
