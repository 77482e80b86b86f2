"""The ablation study's table: each variant's means over the seeds it shares with the full method,
its paired difference to it, and the seeds whose greedy boundaries found the words."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tokjax import models, significance, stages
from tokjax.errors import UserError
from tokjax.lab import ablation, ladder
from tokjax.models import boundaries as bd


def _run(seed, unit_ce, overrides=(), last_greedy=0.95, documents=(0, 0, 1, 1)):
  nbytes = [100] * len(unit_ce)
  bpb = sum(unit_ce) / sum(nbytes) / math.log(2)
  split = {
      'bpb': bpb,
      'unit_ce': list(unit_ce),
      'unit_bytes': nbytes,
      'unit_documents': list(documents),
      'unit_clusters': list(documents),
      'rate': 0.2 + 0.01 * seed,
      'whitespace_recall': 0.5 + 0.1 * seed,
  }
  return {
      'run': dict(
          method='policy',
          budget=4e6,
          seed=seed,
          seq_len=256,
          lr=8e-3,
          overrides=overrides,
          corpus='shakespeare',
      ),
      'test': split,
      'test_greedy': {'bpb': bpb, 'rate': 0.21, 'whitespace_recall': 0.9 + 0.01 * seed},
      'curve': [
          {'step': 10, 'greedy_whitespace_recall': 0.1, 'whitespace_recall': 0.2},
          {'step': 20, 'greedy_whitespace_recall': last_greedy, 'whitespace_recall': 0.8},
      ],
  }


def test_rows_pair_each_variant_with_the_full_method_over_shared_seeds():
  base = [10.0, 12.0, 9.0, 11.0]
  full = [_run(s, [x + 0.1 * s for x in base]) for s in (0, 1, 2)]
  shift = lambda s: 1.0 + 0.2 * s  # nats per window: gamma1 is worse by a seed-dependent amount
  gamma1 = [
      _run(s, [x + 0.1 * s + shift(s) for x in base], ('estimator.gamma=1.0',), last_greedy=0.5)
      for s in (0, 1, 2, 7)  # Seed 7 has no full run: it is left out of every column.
  ]
  rows = {r['variant']: r for r in ablation.summarize({'full': full, 'gamma1': gamma1})}
  g = rows['gamma1']
  assert g['seeds'] == [0, 1, 2] and set(g['per_seed']) == {0, 1, 2}
  assert g['test_bpb'] == pytest.approx(np.mean([r['test']['bpb'] for r in gamma1[:3]]))
  assert g['rate'] == pytest.approx(0.21) and g['whitespace_recall'] == pytest.approx(0.6)
  assert g['greedy_whitespace_recall'] == pytest.approx(0.91)
  p = g['paired']
  per_seed = [sum(shift(s) for _ in base) / 400 / math.log(2) for s in (0, 1, 2)]
  assert p['diff'] == pytest.approx(np.mean(per_seed))
  assert p['seed_se'] == pytest.approx(np.std(per_seed, ddof=1) / math.sqrt(3))
  assert p['verdict'] == 'found'  # 2.2 nats/window against a seed spread of 0.2.
  assert g['words_found'] == 0 and rows['full']['words_found'] == 3
  assert 'paired' not in rows['full']
  assert [c['step'] for c in g['curve']] == [10, 20]
  assert g['curve'][-1]['greedy_whitespace_recall'] == pytest.approx(0.5)


def test_a_difference_inside_the_seed_spread_is_not_found():
  base = [10.0, 12.0, 9.0, 11.0]
  full = [_run(s, base) for s in (0, 1, 2)]
  noisy = [_run(s, [x + d for x in base]) for s, d in ((0, -1.0), (1, 1.5), (2, 0.1))]
  rows = {r['variant']: r for r in ablation.summarize({'full': full, 'w8': noisy})}
  assert rows['w8']['paired']['verdict'] == 'not found'


def test_the_variants_of_a_table_are_one_family_judged_by_their_holm_adjusted_p():
  base = [10.0, 12.0, 9.0, 11.0]
  full = [_run(s, base) for s in (0, 1, 2)]
  # Two leads found alone (a seed spread of 0.2 nats), a large one, and one with no spread at all.
  variants = {
      name: [_run(s, [x + d + 0.2 * (s % 2) for x in base]) for s in (0, 1, 2)]
      for name, d in (('gamma1', 0.3), ('w8', 0.3), ('no_rate_loss', 3.0))
  }
  rows = ablation.summarize({'full': full} | variants)
  paired = {r['variant']: r['paired'] for r in rows if 'paired' in r}
  raw = [paired[v]['p'] for v in variants]
  assert [paired[v]['p_holm'] for v in variants] == pytest.approx(significance.holm(raw))
  assert raw[0] < 0.05 <= paired['gamma1']['p_holm'] and paired['gamma1']['verdict'] == 'not found'
  assert paired['no_rate_loss']['verdict'] == 'found'
  assert {p['family'] for p in paired.values()} == {'shakespeare test, 4e+06 B, L 256'}
  assert {p['family_size'] for p in paired.values()} == {3}
  table = '\n'.join(
      ablation.markdown(rows, {'budget': 4e6, 'corpus': 'x', 'lr': 8e-3, 'reference': 'full'})
  )
  assert '| p | p (Holm) | verdict |' in table and 'Holm-adjusted' in table
  gamma1 = next(line for line in table.splitlines() if line.startswith('| gamma1 '))
  assert f'| {significance.format_p(paired["gamma1"]["p_holm"])} | not found |' in gamma1


def test_variants_default_to_the_papers_table_and_take_new_ones():
  assert list(ablation.parse_variants([])) == list(ablation.VARIANTS)
  v = ablation.parse_variants(['gamma1', 'lr:optim.lr=2e-3', 'lr:optim.warmup_steps=100'])
  assert v == {
      'full': (),
      'gamma1': ('estimator.gamma=1.0',),
      'lr': ('optim.lr=2e-3', 'optim.warmup_steps=100'),
  }
  with pytest.raises(UserError, match="unknown variant 'gama1'"):
    ablation.parse_variants(['gama1'])
  with pytest.raises(UserError, match='NAME:FIELD=VALUE'):
    ablation.parse_variants(['x:optim.lr'])


def _flat(d, prefix=''):
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f'{prefix}{k}.') if isinstance(v, dict) else {prefix + k: v})
  return out


@pytest.mark.parametrize('variant', sorted(ablation.VARIANTS))
def test_each_variant_differs_from_the_full_method_in_exactly_the_fields_it_names(variant):
  """The built configs (ladder.build_config, what the runs train) against 'full''s, field by field."""
  runs = ablation.plan(ablation.VARIANTS, [0], 4e6, 8e-3, 'shakespeare', tiny=False)
  built = lambda name: _flat(ladder.build_config(runs[name][0]).to_dict())
  full, mine = built(ablation.REFERENCE), built(variant)
  assert set(mine) == set(full)
  diff = {k: mine[k] for k in full if mine[k] != full[k]}
  named = dict(item.split('=', 1) for item in ablation.VARIANTS[variant])
  assert set(diff) == set(named)
  assert {k: str(v).lower() for k, v in diff.items()} == {k: v.lower() for k, v in named.items()}


def test_the_window_variants_measure_the_window_and_the_logit_apart():
  """'w8' changes the window only and 'w1_scaled' the logit's form only (the policy module they
  build), and 'w8_scaled' both: the paper's sequential policy, mapped to the paper's full row."""
  runs = ablation.plan(ablation.VARIANTS, [0], 4e6, 8e-3, 'shakespeare', tiny=False)
  configs = {name: ladder.build_config(rs[0]) for name, rs in runs.items()}
  policy = {
      name: models.build_model(c, levels=stages.resolve(c)).levels[0].boundary
      for name, c in configs.items()
  }
  form = lambda p: (p.window, bd.is_scaled(p.form, p.window))
  assert form(policy['full']) == (1, False)
  assert form(policy['w8']) == (8, False)
  assert form(policy['w1_scaled']) == (1, True)
  assert form(policy['w8_scaled']) == (8, True)
  assert ablation.PAPER_ROW == {'full': 'w1', 'w8_scaled': 'full'}


def test_a_report_reads_another_folders_runs_and_writes_its_table_apart(tmp_path):
  """--runs_in: the ablation of a ladder's runs (the long-context study keeps both in one runs/)
  writes its results.json to --out and nothing into the folder it reads."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  runs_in = os.path.join(repo, 'results', 'ablation')
  before = sorted(os.listdir(runs_in))
  out = tmp_path / 'table'
  args = ['--variants', 'gamma1', '--seeds', '0,1', '--report', '--runs_in', runs_in]
  proc = subprocess.run(
      [sys.executable, '-m', 'tokjax.lab.ablation', *args, '--out', str(out)],
      capture_output=True,
      text=True,
      cwd=repo,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = {r['variant']: r for r in json.load(open(out / 'results.json'))['rows']}
  assert set(rows) == {'full', 'gamma1'} and rows['gamma1']['seeds'] == [0, 1]
  assert sorted(os.listdir(runs_in)) == before
