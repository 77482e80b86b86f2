"""The comparison command end to end on a tiny budget: one table row per method, sane numbers, and the
flat model's depth matched to the hierarchical parameter count."""

import json
import math
import os

import pytest

from tokjax import evaluation
from tokjax.experiments import compare


def test_ratio_and_se_matches_the_pooled_ratio():
  import numpy as np  # pylint: disable=g-import-not-at-top

  ce, n = np.array([10.0, 30.0, 20.0]), np.array([10.0, 20.0, 30.0])
  bpb, se = evaluation.ratio_and_se(ce, n)
  assert bpb == pytest.approx(60.0 / 60.0 / math.log(2))
  assert se > 0
  # Identical per-document rates have no spread.
  assert evaluation.ratio_and_se(np.array([1.0, 2.0]), np.array([1.0, 2.0]))[1] == pytest.approx(
      0.0
  )


def test_compare_runs_every_method_end_to_end(tmp_path, monkeypatch):
  monkeypatch.setenv(
      'TOKJAX_DATA_DIR', str(tmp_path / 'cache')
  )  # The BPE tokenizer is cached there.
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  words = b'the king and queen of a far land went to see thy noble lord with all her men, '
  for i in range(40):
    (corpus / f'doc{i}.txt').write_bytes((words * 40)[i * 7 :] + b'\n')
  out = tmp_path / 'out'
  results = compare.compare(
      str(corpus),
      2 * 4 * 64,
      str(out),
      list(compare.METHODS),
      tiny=True,
      eval_cap=(2, 512),
      evals=1,
      command='test',
  )
  assert [r['method'] for r in results] == list(compare.METHODS)
  table = (out / 'results.md').read_text()
  rows = [line for line in table.splitlines() if line.startswith('| ') and '---' not in line][1:]
  assert [r.split('|')[1].strip() for r in rows] == list(compare.METHODS)
  data = json.loads((out / 'results.json').read_text())
  for r in data['methods']:
    assert math.isfinite(r['test']['bpb']) and 0 < r['test']['bpb'] < 10, r['method']
    assert r['test']['documents'] == 2
  by = {r['method']: r for r in data['methods']}
  # Fixed rules hit their definitions: stride 1/5 of the bytes (forced ends aside), uniform exact count.
  assert abs(by['stride']['test']['rate'] - 0.2) < 0.05
  assert abs(by['uniform']['test']['rate'] - round(0.2 * 64) / 64) < 0.02
  hier = data['meta']['hierarchical_params']
  flat = by['flat']['params']
  layers = data['meta']['flat_layers']
  cfg = compare.method_config('flat', str(corpus), True)
  for other in (layers - 1, layers + 1):
    if other >= 1:
      cfg.model.num_layers = other
      assert abs(compare.param_count(cfg) - hier) >= abs(flat - hier)
  for name in ('curves.png', 'heatmap.png', 'segmentations.md'):
    assert os.path.getsize(out / name) > 0
  seg = (out / 'segmentations.md').read_text()
  assert all(f'## {m}' in seg for m in compare.METHODS if m != 'flat')
