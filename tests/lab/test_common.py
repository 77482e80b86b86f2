"""The lab's shared runner: a stopped run resumes exactly from its checkpoint; a stopped run of
another config starts again; every lab run checkpoints on the way, not only at its end."""

import json
import os
import shutil

from conftest import tiny_run_config
import jax
import numpy as np

from tokjax import inspection
from tokjax.lab import common


def _params(workdir, step):
  return jax.device_get(inspection.load_checkpoint(workdir, step).params)


def test_a_stopped_run_resumes_from_its_checkpoint_and_ends_where_an_unstopped_one_does(
    tiny_run, tmp_path
):
  out = tmp_path / 'out'
  # The fixture run stopped after its step-3 checkpoint: step 6 and result.json are missing.
  shutil.copytree(tiny_run, out / 'stopped')
  shutil.rmtree(out / 'stopped' / 'checkpoints' / '6')
  result = common.train_or_load('stopped', tiny_run_config('unused'), str(out))
  assert result['resumed']
  assert json.loads((out / 'stopped' / 'result.json').read_text())['resumed']
  assert 'resumed from step 3' in (out / 'stopped' / 'train.log').read_text()
  assert common.finished_step(str(out / 'stopped')) == 6
  jax.tree.map(
      np.testing.assert_array_equal, _params(str(out / 'stopped'), 6), _params(tiny_run, 6)
  )
  # A finished run is read back, not trained again.
  assert common.train_or_load('stopped', tiny_run_config('unused'), str(out)) == result


def test_a_stopped_run_of_another_config_starts_again(tiny_run, tmp_path):
  out = tmp_path / 'out'
  shutil.copytree(tiny_run, out / 'other')
  shutil.rmtree(out / 'other' / 'checkpoints' / '6')
  config = tiny_run_config('unused')
  config.optim.lr *= 2
  result = common.train_or_load('other', config, str(out))
  assert not result['resumed']
  log = (out / 'other' / 'train.log').read_text()
  assert 'resum' not in log.lower() and os.path.exists(out / 'other' / 'checkpoints' / '6')


def test_every_lab_run_checkpoints_on_the_way():
  for steps in (7, common.CHECKPOINT_EVERY, 5 * common.CHECKPOINT_EVERY + 3):
    c = tiny_run_config('unused')
    common.schedule(c, steps, evals=2)
    assert c.train.steps == steps and c.train.eval_every == steps // 2
    # At most CHECKPOINT_EVERY steps are lost to a kill; a short run checkpoints at its end.
    assert c.train.checkpoint_every == min(steps, common.CHECKPOINT_EVERY)
