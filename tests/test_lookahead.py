"""Boundary methods that read later bytes (registry `lookahead`): runs of the whole-window BPE saved
as 'bpe' before it became causal load as 'bpe_oracle', and generation refuses such a method."""

import json
import os
import subprocess
import sys

import pytest
from test_saved_configs import saved_config, with_config

from tokjax import decoding, stages
from tokjax.config import defaults as config_defaults
from tokjax.config import saved as config_saved
from tokjax.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _old_bpe_config() -> dict:
  """A config that tokjax saved before the causal 'bpe', of a run of the whole-window BPE."""
  old = saved_config('2e64157')
  old['boundary']['method'] = 'bpe'
  old['boundary']['bpe'] = {'tokenizer': 'tok.json', 'pretokenize': 'none'}
  return old


def test_an_old_saved_bpe_run_reads_as_the_oracle_with_its_settings():
  c = config_saved.upgrade(_old_bpe_config())
  assert c.boundary.method == 'bpe_oracle'
  assert dict(c.boundary.bpe_oracle) == {'tokenizer': 'tok.json', 'pretokenize': 'none'}
  assert dict(c.boundary.bpe) == dict(config_defaults.base_config().boundary.bpe)
  # A stage section of that time (every field None, as config.stages.sK saved them) moves too.
  old = _old_bpe_config()
  old['stages'] = {'s1': {'boundary': {'method': None, 'bpe': {'tokenizer': 'inner.json'}}}}
  old['model']['stages'] = 2
  assert config_saved.upgrade(old).stages.s1.boundary.bpe_oracle.tokenizer == 'inner.json'


def test_a_bpe_run_saved_today_stays_causal():
  today = config_defaults.base_config()
  today.boundary.method = 'bpe'
  today.boundary.bpe.update(tokenizer='tok.json', context=16)
  c = config_saved.upgrade(json.loads(json.dumps(today.to_dict())))
  assert c.to_dict() == today.to_dict()


def test_check_causal_refuses_only_lookahead_methods():
  c = config_defaults.base_config()
  for method in ('policy', 'bpe', 'whitespace'):
    c.boundary.method = method
    decoding.check_causal(c, levels=stages.resolve(c))
  c.boundary.method = 'bpe_oracle'
  with pytest.raises(UserError, match='lookahead=True') as e:
    decoding.check_causal(c, levels=stages.resolve(c))
  assert '\n' not in str(e.value) and "config.boundary.method='bpe_oracle'" in str(e.value)


def test_sampling_an_old_bpe_run_is_refused_in_one_line(tiny_run, tmp_path):
  """`python -m tokjax.sample` on a run saved as 'bpe' before it became causal: one error line saying
  why, before any tokenizer or weights are read (the run's weights are the policy's)."""
  run = with_config(tiny_run, str(tmp_path / 'run'), _old_bpe_config())
  proc = subprocess.run(
      [sys.executable, '-m', 'tokjax.sample', f'--checkpoint={run}', '--prompt=the '],
      cwd=REPO,
      capture_output=True,
      timeout=300,
      check=False,
  )
  err = proc.stderr.decode(errors='replace')
  assert proc.returncode == 2 and 'Traceback' not in err, err[-3000:]
  (line,) = [l for l in err.splitlines() if l.startswith('error:')]
  assert "'bpe_oracle'" in line and 'bytes after t' in line


def test_lm_eval_generation_refuses_a_lookahead_method(tiny_run):
  """lm-eval's generate_until on a model whose saved config names bpe_oracle (the policy run's
  checkpoint with the old bpe run's config, upgraded as loading upgrades it): the one line, before
  any byte is generated."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  from tokjax.lm_eval import model as lm_model  # pylint: disable=g-import-not-at-top

  lm = lm_model.TokjaxLM(checkpoint=tiny_run, batch_size=2)
  assert lm.generate_until([]) == []  # A causal method generates.
  old = config_saved.upgrade(_old_bpe_config())
  lm.ckpt = dataclasses.replace(lm.ckpt, config=old)
  lm.ckpt.trainer.levels = stages.resolve(old)  # As opening that run would resolve them.
  with pytest.raises(UserError, match='bytes after t'):
    lm.generate_until([])
