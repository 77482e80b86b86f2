"""Checkpoint validation: each item of a real checkpoint corrupted in turn is reported in one line
naming the step and the item, and training and inspection fall back to the previous complete step;
--step demands a step; resuming without a checkpoint or after the end says what happens."""

import gc
import glob
import json
import os
import shutil
import sys

from conftest import tiny_config, tiny_run_config
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import checkpointing, inspection, losses, resuming, stages, train
from tokjax.config import files as config_files
from tokjax.errors import UserError
from tokjax.metric_writers import read_metrics


@pytest.fixture(scope='module')
def two_step_run(tiny_run):
  """The session's finished 6-step run, with complete checkpoints at steps 3 and 6 (read only)."""
  assert sorted(checkpointing.manager(tiny_run).all_steps()) == [3, 6]
  return tiny_run


def _truncate_arrays(step_dir):
  files = [f for f in glob.glob(os.path.join(step_dir, 'state', '**', 'd', '*'), recursive=True)]
  assert files
  for f in files:
    with open(f, 'r+b') as h:
      h.truncate(os.path.getsize(f) // 2)


def _empty_data(step_dir):
  (path,) = glob.glob(os.path.join(step_dir, 'data', '*.json'))
  open(path, 'w').close()


CORRUPTIONS = {
    'truncated array file': (_truncate_arrays, '"state" item fails to load'),
    'missing _METADATA': (
        lambda d: os.remove(os.path.join(d, 'state', '_METADATA')),
        'lacks state/_METADATA',
    ),
    'missing config entry': (
        lambda d: os.remove(os.path.join(d, 'config', 'metadata')),
        'lacks config/metadata',
    ),
    'emptied data-iterator file': (_empty_data, 'empty or missing data-iterator file'),
}


def _corrupt(run, tmp_path, name):
  dst = str(tmp_path / name.replace(' ', '_'))
  shutil.copytree(run, dst)
  CORRUPTIONS[name][0](os.path.join(dst, 'checkpoints', '6'))
  return dst


def _warnings(out):
  return [l for l in out.splitlines() if l.startswith('warning: checkpoint step')]


@pytest.mark.parametrize('name', list(CORRUPTIONS))
def test_resume_falls_back_to_the_previous_step_and_says_why(two_step_run, tmp_path, capsys, name):
  run = _corrupt(two_step_run, tmp_path, name)
  val = train.train(tiny_run_config(run), resume=True)
  out = capsys.readouterr().out
  (line,) = _warnings(out)
  assert 'step 6' in line and CORRUPTIONS[name][1] in line and 'using step 3' in line, line
  assert 'resumed from step 3' in out and np.isfinite(val['bpb'])
  rows = [(r['split'], r['step']) for r in read_metrics(os.path.join(run, 'metrics.jsonl'))]
  assert len(rows) == len(set(rows)) and ('train', 6) in rows
  assert checkpointing.manager(run).latest_step() == 6  # Rewritten, complete.


@pytest.mark.parametrize(
    'name', ['truncated array file', 'missing _METADATA', 'missing config entry']
)
def test_inspection_falls_back_and_step_flag_demands_the_step(two_step_run, tmp_path, capsys, name):
  run = _corrupt(two_step_run, tmp_path, name)
  ckpt = inspection.load_checkpoint(run)
  (line,) = _warnings(capsys.readouterr().out)
  assert ckpt.step == 3 and 'step 6' in line and CORRUPTIONS[name][1] in line
  with pytest.raises(UserError, match=f'step 6 .*unusable.*{CORRUPTIONS[name][1]}.*drop --step'):
    inspection.load_checkpoint(run, step=6)
  assert inspection.load_checkpoint(run, step=3).step == 3
  with pytest.raises(UserError, match='no checkpoint of step 4'):
    inspection.load_checkpoint(run, step=4)


def _widen_saved_model(step_dir):
  path = os.path.join(step_dir, 'config', 'metadata')
  with open(path) as f:
    saved = json.load(f)
  saved['model']['d_model'] *= 2
  with open(path, 'w') as f:
    json.dump(saved, f)


def test_a_step_of_another_run_falls_back_in_one_line(two_step_run, tmp_path, capsys, monkeypatch):
  run = str(tmp_path / 'mixed')
  shutil.copytree(two_step_run, run)
  _widen_saved_model(os.path.join(run, 'checkpoints', '6'))
  gc.collect()  # What earlier tests in this process left to collect reports before the hook.
  reported = []  # What Python would print as 'Exception ignored in ...' (pytest holds its hook).
  monkeypatch.setattr(sys, 'unraisablehook', lambda arg: reported.append(arg.exc_value))
  assert inspection.load_checkpoint(run).step == 3
  gc.collect()  # Orbax's other reads of the failed restore report when collected.
  (line,) = _warnings(capsys.readouterr().out)
  assert 'does not fit its saved config' in line and 'using step 3' in line, line
  assert not reported, reported


def test_resume_with_step_continues_from_that_step(two_step_run, tmp_path, capsys):
  run = str(tmp_path / 'run')
  shutil.copytree(two_step_run, run)
  c = tiny_run_config(run)
  before = {
      r['step']: r['loss'] for r in read_metrics(os.path.join(run, 'metrics.jsonl')) if 'loss' in r
  }
  train.train(c, resume=True, step=3)
  out = capsys.readouterr().out
  assert 'resumed from step 3' in out and 'discarding checkpoint steps [6]' in out
  rows = read_metrics(os.path.join(run, 'metrics.jsonl'))
  after = {r['step']: r['loss'] for r in rows if 'loss' in r}
  assert after == before  # Steps 4-6 again, bit for bit, each logged once.
  assert [(r['split'], r['step']) for r in rows] == sorted(
      {(r['split'], r['step']) for r in rows}, key=lambda k: (k[1], k[0] == 'val')
  )


def test_resume_without_checkpoint_and_after_the_end(two_step_run, tmp_path, capsys):
  fresh = str(tmp_path / 'fresh')
  c = tiny_config(fresh)
  c.train.steps = c.train.checkpoint_every = 3
  train.train(c, resume=True)
  out = capsys.readouterr().out
  assert 'no checkpoint in' in out and '--resume starts a fresh run' in out
  # Metrics but no checkpoint: refuse, unless told to overwrite.
  shutil.rmtree(os.path.join(fresh, 'checkpoints'))
  with pytest.raises(UserError, match='metrics but no checkpoint.*--overwrite'):
    train.train(c, resume=True)
  train.train(c, overwrite=True)
  assert [r['step'] for r in read_metrics(os.path.join(fresh, 'metrics.jsonl'))] == [3, 3]
  capsys.readouterr()
  # A finished run: say so, exit normally, no NaN.
  finished = str(tmp_path / 'finished')
  shutil.copytree(two_step_run, finished)
  done = train.train(tiny_run_config(finished), resume=True)
  out = capsys.readouterr().out
  assert 'already finished' in out and 'nan' not in out.lower() and np.isfinite(done['bpb'])


def test_nonfinite_before_any_checkpoint_does_not_advise_resume(tmp_path, monkeypatch):
  real_objective = losses.objective

  def poisoned(config, model, mode='sample', *, levels):
    f = real_objective(config, model, mode, levels=levels)

    def g(params, batch, key, step):
      loss, aux = f(params, batch, key, step)
      return jnp.where(step >= 1, jnp.nan, loss), aux

    return g

  monkeypatch.setattr(losses, 'objective', poisoned)
  c = tiny_config(str(tmp_path))
  c.train.log_every = 2
  with pytest.raises(UserError) as e:
    train.train(c)
  msg = str(e.value)
  assert 'NaN' in msg and 'no checkpoint was saved yet' in msg
  assert 'None' not in msg and '--resume' not in msg


def test_a_resume_notes_stage_fields_only_where_the_resolved_stages_change():
  saved = config_files.load('two_stage', 'learned,tiny')
  # A stage section that sets what it would inherit: the same stages, so nothing to note.
  explicit = saved.copy_and_resolve_references()
  explicit.stages.s1.estimator.gamma = saved.estimator.gamma
  explicit.stages.s1.model.byte_window = saved.model.byte_window
  changes = lambda now: resuming.config_changes(saved, now, levels=stages.resolve(now))
  assert changes(explicit) == []
  changed = explicit.copy_and_resolve_references()
  changed.stages.s1.estimator.gamma = 0.5
  assert changes(changed) == [
      'config.stages.s1.estimator.gamma: None saved, 0.5 now',
      f'config.stages.s1.model.byte_window: None saved, {saved.model.byte_window} now',
  ]
