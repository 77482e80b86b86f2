"""The comparison command end to end on a tiny budget: one table row per method, sane numbers, and the
flat model's depth matched to the hierarchical parameter count."""

import json
import math
import os

import ml_collections
import pytest

from tokjax import checkpointing, significance
from tokjax.config import defaults as config_defaults
from tokjax.config import validation as config_validation
from tokjax.errors import UserError
from tokjax.lab import common, compare
from tokjax.models import registry


def test_ratio_and_se_matches_the_pooled_ratio():
  import numpy as np  # pylint: disable=g-import-not-at-top

  ce, n = np.array([10.0, 30.0, 20.0]), np.array([10.0, 20.0, 30.0])
  bpb, se = significance.ratio_and_se(ce, n)
  assert bpb == pytest.approx(60.0 / 60.0 / math.log(2))
  assert se > 0
  # Identical per-document rates have no spread.
  assert significance.ratio_and_se(np.array([1.0, 2.0]), np.array([1.0, 2.0]))[1] == pytest.approx(
      0.0
  )


def _corpus(tmp_path):
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  words = b'the king and queen of a far land went to see thy noble lord with all her men, '
  for i in range(40):
    (corpus / f'doc{i}.txt').write_bytes((words * 40)[i * 7 :] + b'\n')
  return corpus


def test_a_config_built_while_a_user_method_was_registered_reads_without_it(toy_method):
  """Configs built while the toy is imported carry config.boundary.punctuation; a checkpoint of such
  a config must still restore in a process that never imported it (evaluate, segment, resume)."""
  saved = config_defaults.base_config().to_dict()
  assert toy_method in saved['boundary']
  registry.unregister(toy_method)
  with pytest.raises(UserError, match='boundary.punctuation is not a field'):
    config_validation.validate(ml_collections.ConfigDict(saved))
  read = checkpointing.drop_foreign_sections(saved)
  config_validation.validate(ml_collections.ConfigDict(read))
  assert (
      toy_method not in read['boundary']
      and read['boundary']['policy'] == saved['boundary']['policy']
  )
  # A config that trains the unregistered method keeps its section and says what is missing.
  saved['boundary']['method'] = toy_method
  kept = checkpointing.drop_foreign_sections(saved)
  assert kept['boundary'][toy_method] == {'bytes': '.,;\n'}
  with pytest.raises(UserError, match='registered when that file is imported'):
    config_validation.validate(ml_collections.ConfigDict(kept))


# The table, curves and segmentations are method-agnostic, and every registered method's model is
# checked by tests/test_rivals.py; these cover each kind of row: the score function, a fixed rule (the
# one that tests/toy_boundary.py adds in one file, found by name) and the flat model matched in
# parameters.
SOME_METHODS = ['policy', 'punctuation', 'flat']


def test_compare_runs_methods_end_to_end(tmp_path, toy_method):
  assert toy_method in common.method_names()
  corpus = _corpus(tmp_path)
  out = tmp_path / 'out'
  results = compare.compare(
      str(corpus),
      2 * 4 * 64,
      str(out),
      SOME_METHODS,
      tiny=True,
      eval_cap=(2, 512),
      evals=1,
      command='test',
  )
  assert set(SOME_METHODS) <= set(common.method_names())
  assert [r['method'] for r in results] == SOME_METHODS
  table = (out / 'results.md').read_text()
  first = table.split('## Paired')[0]
  rows = [line for line in first.splitlines() if line.startswith('| ') and '---' not in line][1:]
  assert [r.split('|')[1].strip() for r in rows] == SOME_METHODS
  data = json.loads((out / 'results.json').read_text())
  for r in data['methods']:
    assert math.isfinite(r['test']['bpb']) and 0 < r['test']['bpb'] < 10, r['method']
    assert r['test']['documents'] == 2
  by = {r['method']: r for r in data['methods']}
  # Paired to the policy on the same windows (one per 512-byte document here), clustered by document.
  paired = {(p['method'], p['split']): p for p in data['paired']}
  assert set(paired) == {(m, s) for m in SOME_METHODS[1:] for s in ('val', 'test')}
  for (m, split), p in paired.items():
    assert p['diff'] == pytest.approx(by[m][split]['bpb'] - by['policy'][split]['bpb'], abs=1e-9)
    assert p['units'] == p['clusters'] == 2
    assert p['clustered_se'] == pytest.approx(p['se'], rel=1e-9)
    alone = significance.judge(p['diff'], p['clustered_se'], 2)
    family = [q for q in data['paired'] if q['split'] == split]
    assert p['family'] == f'{split} vs policy' and p['family_size'] == len(SOME_METHODS) - 1
    assert p['p'] == alone['p']
    assert p['p_holm'] == significance.holm([q['p'] for q in family])[family.index(p)]
    assert p['verdict'] == (alone['verdict'] if p['p_holm'] < 0.05 else 'not found')
  assert '## Paired differences to policy' in table and '| clustered s.e. |' in table
  # The added rule, given its config section, trains without a policy gradient and hits its
  # definition on the held-out passage: every chunk but the last (closed by the forced final
  # boundary) ends on a punctuation byte, one comma per 78 bytes of this corpus.
  train = lambda m: [
      x
      for x in map(json.loads, (out / m / 'metrics.jsonl').read_text().splitlines())
      if x['split'] == 'train'
  ]
  assert [x['step'] for x in train(toy_method)] == [1, 2]
  assert 'policy_loss' not in train(toy_method)[0] and 'policy_loss' in train('policy')[0]
  chunks = by[toy_method]['passage']['rendered'].split('|')[:-1]
  assert all(c[-1] in '.,;\n' for c in chunks[:-1]), chunks
  assert by[toy_method]['test']['rate'] < 0.1
  hier = data['meta']['hierarchical_params']
  flat = by['flat']['params']
  layers = data['meta']['flat_layers']
  cfg = common.compare_config('flat', str(corpus), True)
  for other in (layers - 1, layers + 1):
    if other >= 1:
      cfg.model.num_layers = other
      assert abs(common.param_count(cfg) - hier) >= abs(flat - hier)
  for name in ('curves.png', 'heatmap.png', 'segmentations.md'):
    assert os.path.getsize(out / name) > 0
  seg = (out / 'segmentations.md').read_text()
  assert all(f'## {m}' in seg for m in SOME_METHODS if m != 'flat')


def test_readme_extending_example_is_the_tested_toy_method():
  """README's "Adding a boundary method" shows tests/toy_boundary.py, which the test above trains."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, 'README.md')) as f:
    readme = f.read()
  example = (
      readme[readme.index('## Adding a boundary method') :].split('```python\n')[1].split('```')[0]
  )
  with open(os.path.join(root, 'tests', 'toy_boundary.py')) as f:
    toy = f.read()
  assert example.strip() == toy[toy.index('import flax') :].strip()
