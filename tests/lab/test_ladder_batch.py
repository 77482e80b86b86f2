"""The ladder's and the ablation's runs at a sequence length and batch of their own: the batch is part
of a run's identity without renaming the runs at the default batch, the steps spend the budget at the
run's own batch and length, and an override of those fields is refused."""

import glob
import json
import os
import shutil

from conftest import command_lines
import pytest

from tokjax.errors import UserError
from tokjax.lab import ablation, ladder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_committed_runs_read_back_at_the_default_batch_under_their_own_names():
  """Every committed ladder and ablation run is read back under its folder's name: those written
  before the batch was a field (no '-B' in the name) at the config's batch."""
  dirs = sorted(
      os.path.dirname(p)
      for p in glob.glob(
          os.path.join(REPO, 'results', '**', 'runs', '*', 'result.json'), recursive=True
      )
  )
  assert len(dirs) > 100
  for d in dirs:
    run, _ = ladder.read_spec(d)
    assert run.name == os.path.basename(d), d
    assert (run.batch_size is None) == ('-B' not in run.name), d


def test_a_batch_other_than_the_configs_names_its_runs():
  plan = lambda batch, tiny=False: ladder.plan(
      'shakespeare', [4e6], ['policy'], [0], [256], {'policy': [8e-3]}, {}, tiny, batch
  )
  assert [r.name for r in plan(None)] == ['policy-b4e+06-s0-L256-lr0.008']
  assert plan(16) == plan(None)  # The config's batch, named or not: the same run.
  assert [r.name for r in plan(4)] == ['policy-b4e+06-s0-L256-lr0.008-B4']
  assert plan(4, tiny=True) == plan(None, tiny=True)  # The tiny config's batch is 4.
  assert [r.name for r in plan(8, tiny=True)] == ['policy-b4e+06-s0-L256-lr0.008-B8-tiny']


def test_a_runs_spec_keeps_its_batch(tmp_path):
  run = ladder.Run('hnet', 4e6, 1, 2048, 8e-3, ('boundary.hnet.ratio_weight=0.3',), batch_size=4)
  ladder.write_spec(str(tmp_path), run, ladder.Scoring())
  assert ladder.read_spec(str(tmp_path))[0] == run


@pytest.mark.parametrize(
    'seq_len,batch,steps,capacity',
    [(256, None, 977, 128), (2048, 4, 488, 1024), (2048, 8, 244, 1024)],
)
def test_steps_spend_the_budget_at_the_runs_own_batch_and_length(seq_len, batch, steps, capacity):
  run = ladder.Run('policy', 4e6, 0, seq_len, 8e-3, ('train.log_every=7',), batch_size=batch)
  c = ladder.build_config(run)
  assert (c.data.seq_len, c.data.batch_size) == (seq_len, batch or 16)
  assert c.train.steps == steps == round(4e6 / (c.data.batch_size * c.data.seq_len))
  assert c.model.capacity == capacity  # Room for twice the target rate's chunks at any length.
  assert c.train.log_every == 7  # Other overrides still apply, after the schedule.


@pytest.mark.parametrize(
    'item,flag',
    [
        ('data.batch_size=4', '--batch_size'),
        ('data.seq_len=512', '--seq_len'),
        ('train.steps=10', '--budget'),
    ],
)
def test_an_override_of_the_runs_own_fields_is_refused(item, flag):
  run = ladder.Run('policy', 4e6, 0, 256, 8e-3, (item,))
  with pytest.raises(UserError, match=f'^override {item}: .* set it with .*{flag}'):
    ladder.check_overrides(run)


def test_a_run_trained_with_such_an_override_is_still_read_but_never_trained(tmp_path):
  """The main_job study's batch32 runs predate the refusal: their config reads back (reports
  regenerate from them), and training one anew is refused before it starts."""
  run = ladder.Run('policy', 2457600, 0, 256, 8e-3, ('data.batch_size=32',))
  assert run.name in os.listdir(os.path.join(REPO, 'results', 'main_job', 'runs'))
  assert ladder.build_config(run).data.batch_size == 32
  run_dir = tmp_path / run.name
  run_dir.mkdir()
  ladder.write_spec(str(run_dir), run, ladder.Scoring())
  with pytest.raises(UserError, match='^override data.batch_size=32: .* set it with --batch_size'):
    ladder.work(str(run_dir))


def test_the_ablation_plans_every_variant_at_the_given_length_and_batch():
  runs = ablation.plan(ablation.VARIANTS, [0, 1], 4e6, 8e-3, 'shakespeare', False, 2048, 4)
  assert set(runs) == set(ablation.VARIANTS)
  for name, rs in runs.items():
    assert [(r.seq_len, r.batch_size, r.seed) for r in rs] == [(2048, 4, 0), (2048, 4, 1)], name
  c = ladder.build_config(runs['w8'][0])
  assert (c.data.seq_len, c.data.batch_size, c.train.steps) == (2048, 4, 488)
  assert c.boundary.policy.window == 8 and c.boundary.policy.form == 'plain'
  # At the default length and batch, the variants that existed before the split are the committed
  # runs (the paper's sequential policy is 'w8_scaled' now).
  committed = set(os.listdir(os.path.join(REPO, 'results', 'ablation', 'runs')))
  default = ablation.plan(ablation.VARIANTS, [0, 1, 2], 4e6, 8e-3, 'shakespeare', False)
  for name, rs in default.items():
    if name not in ('w8', 'w1_scaled'):
      assert {r.name for r in rs} <= committed, name


def test_commands_refuse_the_runs_own_fields_and_report_the_length(tmp_path):
  """One line for a --set of the batch (ladder) or the length (ablation); --report of a committed
  L = 1024 run writes its integer seq_len in its row and the batch in the meta."""
  out = tmp_path / 'report'
  name = 'policy-b4e+06-s0-L1024-lr0.008'
  shutil.copytree(
      os.path.join(REPO, 'results', 'ladder', 'shakespeare', 'runs', name), out / 'runs' / name
  )
  bad = ['--out', str(tmp_path / 'refused')]
  report = '--report --nomarkdown --budgets 4e6 --methods policy --seq_lens 1024 --lrs 8e-3'.split()
  ladder_ended = command_lines(
      'tokjax.lab.ladder',
      [
          ['--set', 'data.batch_size=4', *bad],
          ['--batch_size', '0', *bad],
          [*report, '--out', str(out)],
      ],
      cwd=REPO,
  )
  ablation_ended = command_lines(
      'tokjax.lab.ablation', [['--set', 'data.seq_len=512', *bad]], cwd=REPO
  )
  refusals = [
      'set it with --batch_size',
      '--batch_size=0 must be at least 1',
      'set it with --seq_lens (ladder) or --seq_len',
  ]
  for (code, err), words in zip(ladder_ended[:2] + ablation_ended, refusals):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error:') and words in lines[0], err
  assert ladder_ended[2][0] == 0, ladder_ended[2][1]
  with open(out / 'results.json') as f:
    results = json.load(f)
  assert results['meta']['seq_lens'] == [1024] and results['meta']['batch_size'] == 16
  assert [(r['seq_len'], r['method']) for r in results['rows']] == [(1024, 'policy')]
  assert isinstance(results['rows'][0]['seq_len'], int)
