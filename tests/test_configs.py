"""Every config file loads, validates, documents its command, and each ablation flips one switch."""

import glob
import importlib.util
import os

import pytest

from tokjax import config_defaults

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


@pytest.mark.parametrize('path', CONFIGS, ids=os.path.basename)
def test_config_validates_and_documents_its_command(path):
  module = _load(path)
  config_defaults.validate(module.get_config())
  name = os.path.relpath(path, REPO)
  assert f'--config {name}' in module.__doc__ or f'--config={name}' in module.__doc__, name


ABLATIONS = {
    'ablation_gamma1.py': {'estimator.gamma': 1.0},
    'ablation_no_batch_relative.py': {'estimator.batch_relative': False},
    'ablation_no_early_exit.py': {'estimator.reward': 'plain'},
    'ablation_w1.py': {'boundary.window': 1},
    'ablation_no_rate_loss.py': {'estimator.rate_loss': False, 'model.capacity': 4096},
}


@pytest.mark.parametrize('name,changes', sorted(ABLATIONS.items()))
def test_each_ablation_is_the_40m_config_with_one_switch_flipped(name, changes):
  base = _flat(config_defaults.paper_config('40m').to_dict())
  ablation = _flat(_load(os.path.join(REPO, 'configs', name)).get_config().to_dict())
  diff = {k: ablation[k] for k in base if base[k] != ablation[k] and k != 'train.workdir'}
  assert diff == changes


def test_paper_configs_spend_their_byte_budgets():
  for size, steps in (('147m', 11444), ('90m', 6484), ('40m', 5722)):
    c = config_defaults.paper_config(size)
    p = config_defaults.PAPER_SIZES[size]
    assert c.train.steps == steps
    assert c.data.batch_size * c.data.seq_len * c.train.steps <= p['bytes']
    assert c.data.batch_size * c.data.seq_len * (c.train.steps + 1) > p['bytes']
