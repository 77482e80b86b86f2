"""Every config file loads, validates, documents its command, and each ablation flips one switch."""

import glob
import importlib.util
import os
import re

import pytest

from tokjax.config import defaults as config_defaults
from tokjax.config import files as config_files
from tokjax.config import presets
from tokjax.config import validation as config_validation
from tokjax.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(REPO, 'configs', '*.py')))


def _load(path):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _flat(d, prefix=''):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f'{prefix}{k}.'))
    else:
      out[prefix + k] = v
  return out


def _variants():
  """(path, variant) for every config file and each of its named variants (None: no variants)."""
  out = []
  for path in CONFIGS:
    variants = getattr(_load(path), 'VARIANTS', None)
    out += [(path, v) for v in variants] if variants else [(path, None)]
  return out


@pytest.mark.parametrize(
    'path,variant', _variants(), ids=lambda x: os.path.basename(x) if '/' in str(x) else str(x)
)
def test_config_validates_and_documents_its_command(path, variant):
  module = _load(path)
  config = module.get_config() if variant is None else module.get_config(variant)
  config_validation.validate(config)
  name = os.path.relpath(path, REPO)
  assert f'--config {name}' in module.__doc__ or f'--config={name}' in module.__doc__, name


def test_compare_variants_are_the_registry_and_flat():
  from tokjax.models import registry  # pylint: disable=g-import-not-at-top

  assert list(config_files.load_module('compare').VARIANTS) == [*registry.methods(), 'flat']
  for name in registry.methods():
    assert config_files.load('compare', name).boundary.method == name
  assert config_files.load('compare', 'flat').model.kind == 'flat'
  with pytest.raises(UserError, match='unknown config variant'):
    config_files.load('compare', 'nope')
  tiny = config_files.load('compare', 'hnet,tiny')
  assert tiny.model.d_model == 32 and tiny.boundary.method == 'hnet'


def test_train_command_runs_a_named_variant(tmp_path):
  """`--config FILE:VARIANT` (ml_collections passes the text after ':' to get_config) trains it."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  cmd = [
      sys.executable,
      '-m',
      'tokjax.train',
      '--config',
      'configs/compare.py:stride,tiny',
      '--config.train.steps=2',
      '--config.train.log_every=1',
      '--config.train.eval_every=2',
      '--config.train.checkpoint_every=2',
      '--config.data.max_bytes=200000',
      f'--config.train.workdir={tmp_path / "run"}',
  ]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  saved = (tmp_path / 'run' / 'metrics.jsonl').read_text()
  assert '"rate"' in saved


ABLATIONS = {
    'ablation_gamma1.py': {'estimator.gamma': 1.0},
    'ablation_no_batch_relative.py': {'estimator.baseline': 'none'},
    'ablation_no_early_exit.py': {'estimator.reward': 'plain'},
    # The full method's scaled logit kept: the window alone changes.
    'ablation_w1.py': {'boundary.policy.window': 1, 'boundary.policy.form': 'scaled'},
    'ablation_no_rate_loss.py': {'estimator.rate_loss': False, 'model.capacity': 4096},
}


def _named_fields(doc: str, fields) -> set:
  """The config fields a docstring sets: 'a.b = v' or '--config.a.b=v'."""
  names = re.findall(r'\b((?:config\.)?[a-z_]+(?:\.[a-z_0-9]+)+)\s*=', doc)
  return {n.removeprefix('config.') for n in names} & set(fields)


def test_every_ablation_config_is_listed():
  found = {os.path.basename(p) for p in CONFIGS if os.path.basename(p).startswith('ablation_')}
  assert found == set(ABLATIONS)


@pytest.mark.parametrize('name,changes', sorted(ABLATIONS.items()))
def test_each_ablation_differs_from_the_config_it_ablates_in_the_fields_it_names(name, changes):
  """Against configs/paper_40m_fineweb.py itself, corpus included (the preset reads another copy of
  FineWeb), in exactly the fields the docstring names."""
  base = _flat(_load(os.path.join(REPO, 'configs', 'paper_40m_fineweb.py')).get_config().to_dict())
  module = _load(os.path.join(REPO, 'configs', name))
  ablation = _flat(module.get_config().to_dict())
  assert set(ablation) == set(base)
  diff = {k: ablation[k] for k in base if base[k] != ablation[k] and k != 'train.workdir'}
  assert diff == changes
  assert _named_fields(module.__doc__, base) == set(changes)


def test_paper_configs_spend_their_byte_budgets():
  for size, steps in (('147m', 11444), ('90m', 6484), ('40m', 5722)):
    c = presets.paper_config(size)
    p = presets.PAPER_SIZES[size]
    assert c.train.steps == steps
    assert c.data.batch_size * c.data.seq_len * c.train.steps <= p['bytes']
    assert c.data.batch_size * c.data.seq_len * (c.train.steps + 1) > p['bytes']


def _base(**changes):
  c = config_defaults.base_config()
  for dotted, value in changes.items():
    section, key = dotted.rsplit('.', 1)
    target = c
    for part in section.split('.'):
      target = target[part]
    target[key] = value
  return c


@pytest.mark.parametrize(
    'field,value',
    [
        ('optim.lr', float('nan')),
        ('optim.lr', float('inf')),
        ('estimator.gamma', float('nan')),
        ('boundary.gumbel.temperature', float('-inf')),
        ('optim.b2', float('nan')),
    ],
)
def test_non_finite_numbers_anywhere_are_rejected(field, value):
  with pytest.raises(UserError, match=f'^config.{field}={value!r} must be a finite number'):
    config_validation.validate(_base(**{field: value}))


def test_a_non_finite_entry_of_a_tuple_is_one_line_naming_its_index():
  c = _base(**{'mesh.rules': (('batch', 'data'), ('embed', float('nan')))})
  with pytest.raises(UserError, match=r'^config.mesh.rules\[1\]\[1\]=nan must be a finite number'):
    config_validation.validate(c)


def test_a_non_finite_stage_setting_is_one_line_naming_its_section():
  c = _base(**{'model.stages': 2})
  c.stages.s1.estimator.gamma = float('nan')
  with pytest.raises(UserError, match=r'^config.stages.s1.estimator.gamma=nan must be a finite'):
    config_validation.validate(c)


def test_non_finite_flag_is_one_error_line_before_compiling(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'tokjax.train',
          '--config',
          'configs/default.py',
          '--config.optim.lr=nan',
          f'--config.train.workdir={tmp_path / "run"}',
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert out.returncode != 0
  assert 'error: config.optim.lr=nan must be a finite number' in out.stderr + out.stdout
  assert not (tmp_path / 'run' / 'checkpoints').exists()


@pytest.mark.parametrize(
    'changes,message',
    [
        ({'estimator.rate_loss': False}, 'rate_loss=False needs config.model.capacity >= '),
        ({'boundary.method': 'hnet', 'estimator.baseline': 'rloo'}, "baseline='rloo' needs"),
        ({'model.kind': 'flat', 'estimator.baseline': 'value'}, "baseline='value' needs"),
        ({'boundary.method': 'uniform', 'estimator.off_policy_steps': 5}, 'off_policy_steps=5'),
        ({'boundary.method': 'nope'}, 'not a registered boundary method'),
        ({'estimator.baseline': 'ppo'}, "baseline='ppo' is not valid"),
        ({'estimator.baseline': 'rloo', 'estimator.rloo.k': 1}, 'rloo.k=1 must be'),
        ({'boundary.gumbel.temperature': 0.0, 'boundary.method': 'gumbel'}, 'temperature=0.0'),
        ({'boundary.policy.window': 0}, 'policy.window=0'),
        ({'boundary.window': 8}, 'config.boundary.window is not a field; config.boundary has'),
        ({'estimator.typo': 1}, 'config.estimator.typo is not a field'),
    ],
)
def test_invalid_combinations_are_one_clear_error(changes, message):
  with pytest.raises(UserError, match=message.replace('(', r'\(').replace('[', r'\[')):
    config_validation.validate(_base(**changes))


def test_no_rate_loss_with_a_full_buffer_is_valid():
  c = _base(**{'estimator.rate_loss': False})
  c.model.capacity = c.data.seq_len
  config_validation.validate(c)
  # Methods without the score function have no rate loss to switch off: nothing to check.
  config_validation.validate(_base(**{'estimator.rate_loss': False, 'boundary.method': 'stride'}))


def test_no_rate_loss_needs_room_at_every_level():
  c = _base(**{'estimator.rate_loss': False, 'model.stages': 2})
  c.model.capacity = c.data.seq_len
  # Stage 1 inherits the same buffer: room for a boundary at each of stage 0's chunks.
  config_validation.validate(c)
  c.stages.s1.model.capacity = c.data.seq_len // 2
  with pytest.raises(UserError) as e:
    config_validation.validate(c)
  assert str(e.value).startswith(
      'config.estimator.rate_loss=False needs config.stages.s1.model.capacity >= '
      f'config.model.capacity (here {c.data.seq_len // 2} < {c.data.seq_len})'
  )
  assert str(e.value).endswith(f'--config.stages.s1.model.capacity={c.data.seq_len}.')
  # A stage of a method without the score function has no rate loss to switch off.
  c.stages.s1.boundary.method = 'stride'
  config_validation.validate(c)


def _repo(*parts):
  return os.path.join(REPO, *parts)


@pytest.mark.parametrize('path', CONFIGS)
def test_config_docstring_fits_on_one_screen(path):
  # The command, what it trains, its cost and what to expect; the narrative lives in its study.
  doc = _load(path).__doc__ or ''
  assert doc.strip(), f'{path} has no docstring'
  assert len(doc.strip().splitlines()) <= 15, f'{path}: {len(doc.strip().splitlines())} lines'


def test_readme_is_a_front_page_whose_links_exist():
  import re  # pylint: disable=g-import-not-at-top

  text = open(_repo('README.md')).read()
  assert len(text.splitlines()) <= 250
  # The blocks that are re-measured and replaced whole.
  for marker in ('quickstart-output', 'headline'):
    assert text.index(f'<!-- {marker} -->') < text.index(f'<!-- /{marker} -->'), marker
  docs = sorted(glob.glob(_repo('docs', '*.md'))) + [_repo('README.md')]
  for doc in docs + CONFIGS:
    body = open(doc).read() if doc.endswith('.md') else _load(doc).__doc__
    for link in re.findall(r'\]\(([^)#]+)', body):
      if not link.startswith('http'):
        assert os.path.exists(os.path.join(os.path.dirname(doc), link)), (doc, link)
    paths = r'\b((?:docs|results|configs|launch|tests)/[\w./-]+\.(?:md|py|json|png))'
    for path in re.findall(paths, body):
      assert os.path.exists(_repo(path)), (doc, path)
