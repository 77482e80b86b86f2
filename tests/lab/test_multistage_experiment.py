"""The multistage command end to end at tiny size (one row per run, equal training FLOPs, per-level
statistics), its two-level rendering, and the paper-scale two-stage configs' FLOPs budgets."""

import json
import math

import numpy as np
import pytest

from tokjax import flops, significance
from tokjax import stages as tokjax_stages
from tokjax.config import files as config_files
from tokjax.config import validation as config_validation
from tokjax.lab import multistage


def _corpus(tmp_path):
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  line = b'the king and queen of a far land went to see thy noble lord,\nwith all her men. '
  for i in range(40):
    (corpus / f'doc{i}.txt').write_bytes((line * 30)[i * 7 :] + b'\n')
  return corpus


def test_multistage_trains_runs_at_equal_flops_and_reports_each_level(tmp_path):
  # One run of each depth (the other two-stage variants train in tests/test_two_stage_variants.py).
  runs = ['one_stage', 'learned']
  out = tmp_path / 'out'
  results = multistage.multistage(
      str(_corpus(tmp_path)),
      20,
      str(out),
      runs=tuple(runs),
      tiny=True,
      eval_cap=(2, 256),
      command='test',
      unit_bytes=64,
  )
  assert set(runs) < set(multistage.RUNS)
  assert [r['run'] for r in results] == runs
  readme = (out / 'README.md').read_text()
  table = readme.split('## Paired differences')[0]
  rows = [line for line in table.splitlines() if line.startswith('| ') and '---' not in line][1:]
  assert [r.split('|')[1].strip() for r in rows] == runs
  data = json.loads((out / 'results.json').read_text())
  by = {r['run']: r for r in data['runs']}
  assert by['one_stage']['steps'] == 20
  # Whole steps: each total is within half a step (under 3% here) of the one-stage run's.
  base = by['one_stage']['planned_flops']
  for r in data['runs']:
    assert abs(r['planned_flops'] / base - 1) < 0.03, r['run']
    cfg = multistage.run_config(r['run'], 'unused', tiny=True)
    rates = multistage.target_rates(cfg)
    assert r['planned_flops'] == pytest.approx(
        flops.step_flops(cfg, rates, levels=tokjax_stages.resolve(cfg)) * r['steps']
    )
    assert math.isfinite(r['test']['bpb']) and 0 < r['test']['bpb'] < 10, r['run']
    assert math.isfinite(r['test']['bpb_se'])
    stages = len(tokjax_stages.resolve(cfg))
    assert len(r['levels']) == stages
    drawn = r['passage']['levels']
    assert {m: len(v) for m, v in drawn.items()} == {'greedy': stages, 'sample': stages}
    for m in r['levels']:
      assert 0 < m['rate'] <= 1 and m['bytes_per_chunk'] >= 1
      for k in ('whitespace', 'line', 'phrase'):
        assert 0 <= m[f'{k}_precision'] <= 1 and 0 <= m[f'{k}_recall'] <= 1
    # Level 0 is drawn as the bits-per-byte's evaluation drew it (same batches and keys).
    assert r['levels'][0]['rate'] == pytest.approx(r['test']['rate'])
    # A level-1 chunk ends where a level-0 chunk ends: never more ends above than below.
    if stages == 2:
      assert r['levels'][1]['boundaries'] <= r['levels'][0]['boundaries']
  assert '## Boundaries per level' in readme and '| learned | 1 |' in readme
  assert all(f'### {run} (' in readme for run in runs)
  # Paired to the one-stage run on the same bytes: per window the difference of the pooled bpb,
  # its clustered error the per-document one.
  paired = {p['split']: p for p in data['paired'] if p['run'] == 'learned'}
  assert set(paired) == {'val', 'test'} and {p['unit'] for p in paired.values()} == {'64 B'}
  for split, p in paired.items():
    a, b = by['learned'][split], by['one_stage'][split]
    assert p['diff'] == pytest.approx(a['bpb'] - b['bpb'], abs=1e-9)
    assert p['clusters'] == a['documents'] < p['units']
    per_doc = lambda x, d=a['unit_documents']: np.bincount(d, weights=x)
    by_doc = significance.paired_difference(
        per_doc(a['unit_ce']), per_doc(b['unit_ce']), per_doc(a['unit_bytes'])
    )
    assert p['clustered_se'] == pytest.approx(by_doc['se'], rel=1e-9)
    alone = significance.judge(p['diff'], p['clustered_se'], p['clusters'])
    family = [q for q in data['paired'] if q['split'] == split]
    assert p['family'] == f'{split} vs one_stage' and p['family_size'] == len(family)
    assert p['p_holm'] == significance.holm([q['p'] for q in family])[family.index(p)]
    assert p['verdict'] == (alone['verdict'] if p['p_holm'] < 0.05 else 'not found')
  assert '## Paired differences to the one-stage run' in readme and '| clustered s.e. |' in readme


def test_seq_len_grows_every_chunk_buffer_with_the_sequence():
  base = multistage.run_config('learned', 'unused', tiny=True)
  longer = multistage.run_config('learned', 'unused', tiny=True, seq_len=4 * base.data.seq_len)
  assert longer.data.seq_len == 4 * base.data.seq_len
  assert longer.model.capacity == 4 * base.model.capacity
  assert longer.stages.s1.model.capacity == 4 * base.stages.s1.model.capacity
  config_validation.validate(longer)


@pytest.mark.parametrize('size', ['147m', '40m'])
def test_paper_two_stage_configs_match_the_one_stage_flops_per_byte(size):
  one = config_files.load(f'paper_{size}_fineweb')
  two = config_files.load(f'paper_two_stage_{size}')
  config_validation.validate(two)
  assert len(tokjax_stages.resolve(two)) == 2
  ratio = flops.flops_per_byte(
      two, multistage.target_rates(two), levels=tokjax_stages.resolve(two)
  ) / flops.flops_per_byte(one, multistage.target_rates(one), levels=tokjax_stages.resolve(one))
  assert abs(ratio - 1) < 0.03, ratio


def test_every_run_trains_on_the_two_stage_configs_sequences_unless_told():
  configs = multistage.run_configs(['learned', 'hnet'], 'unused')
  two_stage = config_files.load('two_stage')
  for c in configs.values():
    assert (c.data.seq_len, c.data.batch_size) == (
        two_stage.data.seq_len,
        two_stage.data.batch_size,
    )
  one_stage, default = configs[multistage.BASE], config_files.load('compare', 'policy')
  assert one_stage.model.capacity == default.model.capacity * (
      two_stage.data.seq_len // default.data.seq_len
  )
  told = multistage.run_configs(['learned'], 'unused', batch=2, seq_len=512)
  assert {(c.data.seq_len, c.data.batch_size) for c in told.values()} == {(512, 2)}
