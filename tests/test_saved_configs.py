"""Runs saved by earlier versions of tokjax load in this one, by every command that reads a run.

tests/fixtures/saved_configs/COMMIT/config.json is the "config" item of a checkpoint that tokjax
saved at COMMIT (see the README there): afa8a91 comes before the renames of `MIGRATIONS`, 3f7ede2 and
f25e687 before optim.policy_lr_factor, 2e64157 before config.stages became one section per stage. Their weights are not kept: a state
saved at any of them has the tree and shapes of today's, so each test writes the saved config into a
copy of the session's `tiny_run` (the same model fields) and reads that run as a user would; the
results must equal those of `tiny_run` itself, whose config today's code wrote.
"""

import json
import os
import shutil

from conftest import tiny_config, tiny_run_config
import jax
import ml_collections
import numpy as np
import pytest

from tokjax import checkpointing, evaluate, inspection, sample, segment, stages, train
from tokjax.config import saved as config_saved
from tokjax.config import validation as config_validation
from tokjax.errors import UserError
from tokjax.lab import common
from tokjax.lm_eval import model as lm_model

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures', 'saved_configs')
# Oldest first: before the renames of `MIGRATIONS`, twice before optim.policy_lr_factor, recent.
COMMITS = ['afa8a91', '3f7ede2', 'f25e687', '2e64157']
TEXT = b'def main():\n    print("Hello world!")\n\nclass Box:\n    pass\n'


def saved_config(commit: str) -> dict:
  with open(os.path.join(FIXTURES, commit, 'config.json')) as f:
    return json.load(f)


def trained_config(workdir: str):
  """What the fixtures were trained with: their commit's `tiny_config`, for 2 steps."""
  c = tiny_config(workdir)
  c.train.steps, c.train.log_every, c.train.eval_every, c.train.checkpoint_every = 2, 1, 2, 2
  c.eval.max_batches = 1
  return c


def with_config(run: str, folder: str, config: dict) -> str:
  """A copy of run whose every checkpoint step holds `config` as its saved config."""
  shutil.copytree(run, folder)
  for step in checkpointing.manager(folder).all_steps():
    with open(os.path.join(folder, 'checkpoints', str(step), 'config', 'metadata'), 'w') as f:
      json.dump(config, f)
  return folder


@pytest.fixture(scope='module')
def old_runs(tiny_run, tmp_path_factory):
  """{commit: a copy of tiny_run saved with that commit's config} (read only)."""
  root = tmp_path_factory.mktemp('old_runs')
  return {c: with_config(tiny_run, str(root / c), saved_config(c)) for c in COMMITS}


def test_the_fixtures_predate_the_fields_and_names_they_test():
  assert sorted(d for d in os.listdir(FIXTURES) if not d.endswith('.md')) == sorted(COMMITS)
  old = saved_config('afa8a91')
  assert {'window', 'scale', 'bpe_tokenizer'} <= set(old['boundary'])
  assert {'kind', 'batch_relative', 'rloo_k', 'gae_lambda'} <= set(old['estimator'])
  for commit in COMMITS[:3]:
    assert 'policy_lr_factor' not in saved_config(commit)['optim']
  assert 'policy_lr_factor' in saved_config(COMMITS[3])['optim']


@pytest.mark.parametrize('commit', COMMITS)
def test_a_saved_config_reads_as_todays_with_new_fields_at_their_defaults(commit):
  saved = saved_config(commit)
  upgraded = config_saved.upgrade(saved)
  assert upgraded.to_dict() == trained_config(saved['train']['workdir']).to_dict()
  assert upgraded.boundary.policy.window == 1 and upgraded.optim.policy_lr_factor == 1.0
  # The shared target rate stays one value: setting one field sets the other.
  upgraded.boundary.target_rate = 0.3
  assert upgraded.estimator.target_rate == 0.3


def test_renamed_fields_move_and_keep_their_values():
  old = saved_config('afa8a91')
  old['boundary'].update(window=8, scale=0.25, ratio_weight=0.05, bpe_tokenizer='tok.json')
  old['estimator'].update(batch_relative=False, rloo_k=3, gae_lambda=0.5, value_weight=0.2)
  c = config_saved.upgrade(old)
  assert (c.boundary.policy.window, c.boundary.policy.scale) == (8, 0.25)
  # That version's tokenizer cut the whole window's token starts: the oracle's setting now.
  assert (c.boundary.hnet.ratio_weight, c.boundary.bpe_oracle.tokenizer) == (0.05, 'tok.json')
  assert c.boundary.bpe.tokenizer == ''
  assert c.estimator.baseline == 'none' and c.estimator.rloo.k == 3
  assert (c.estimator.value.gae_lambda, c.estimator.value.weight) == (0.5, 0.2)
  assert 'kind' not in c.estimator and 'window' not in c.boundary
  # batch_relative switched only the batch baseline off.
  old['estimator'].update(baseline='rloo')
  assert config_saved.upgrade(old).estimator.baseline == 'rloo'


def test_a_two_stage_config_saved_as_tuples_reads_as_stage_sections():
  """Before tokjax/stages.py, config.stages held one tuple per field (2e64157's, empty for one
  stage); a two-stage run saved then reads each tuple's entry as its stage's own field."""
  old = saved_config('2e64157')
  assert old['stages']['method'] == [] and 'target_rate' in old['stages']
  old['model']['stages'] = 2
  old['stages'].update(
      method=['hnet'],
      target_rate=[0.33],
      capacity=[16],
      encoder_layers=[1],
      decoder_layers=[2],
      window=[8],
      gamma=[0.5],
  )
  c = config_saved.upgrade(old)
  assert set(c.stages) == {'s1'} and c.stages.s1.model.byte_window == 8
  config_validation.validate(c)
  first, second = stages.resolve(c)
  assert (second.method, second.target_rate, second.capacity) == ('hnet', 0.33, 16)
  assert (second.encoder_layers, second.decoder_layers, second.window) == (1, 2, 8)
  assert (second.estimator.gamma, first.estimator.gamma) == (0.5, 0.99)
  # An estimator tuple left empty was config.estimator's value at every stage, and still is.
  assert second.estimator.lambda_rl == c.estimator.lambda_rl
  assert second.where('estimator.lambda_rl') == 'config.estimator.lambda_rl'
  # A third stage's entries get a section of their own; a config saved with sections reads back.
  old['model']['stages'] = 3
  old['stages'] = {k: v * 2 for k, v in old['stages'].items()}
  three = config_saved.upgrade(old)
  assert three.stages.s2.boundary.method == 'hnet' and three.stages.s2.model.capacity == 16
  assert config_saved.upgrade(three.to_dict()).to_dict() == three.to_dict()


def _evaluation(run, out):
  report = evaluate.run_evaluation(run, split='val', out=out, max_batches=1, bpe=False)
  return {mode: (m['bpb'], m['rate'], m['doc_bpb']) for mode, m in report['modes'].items()}


@pytest.fixture(scope='module')
def evaluated(tiny_run, tmp_path_factory):
  return _evaluation(tiny_run, str(tmp_path_factory.mktemp('evaluated') / 'eval'))


@pytest.mark.parametrize('commit', COMMITS)
def test_evaluate_reads_an_old_run(commit, old_runs, evaluated, tmp_path, capsys):
  got = _evaluation(old_runs[commit], str(tmp_path / 'eval'))
  assert got == evaluated and 'warning' not in capsys.readouterr().out


def _segmentation(run, folder):
  file = os.path.join(folder, 'text.py')
  with open(file, 'wb') as f:
    f.write(TEXT)
  return segment.segment_file(run, file, out=os.path.join(folder, 'seg'), png_bytes=64)[
      'offsets_by_level'
  ]


@pytest.fixture(scope='module')
def segmented(tiny_run, tmp_path_factory):
  return _segmentation(tiny_run, str(tmp_path_factory.mktemp('segmented')))


@pytest.mark.parametrize('commit', COMMITS)
def test_segment_reads_an_old_run(commit, old_runs, segmented, tmp_path):
  got = _segmentation(old_runs[commit], str(tmp_path))
  assert got == segmented and got[0]


def _generation_and_rescoring(run):
  """What `python -m tokjax.sample` and the ladder's rescoring (tokjax/lab/ladder.py `work`) do
  with a run folder."""
  ckpt = inspection.load_checkpoint(run)
  settings = {'mode': 'greedy', 'temperature': 1.0, 'top_k': 0, 'cached': True}
  text = sample.run_generation(
      ckpt.model, ckpt.params, b'def f(x):', 12, jax.random.PRNGKey(0), **settings
  )['text']
  scores = common.evaluate_documents(ckpt, [TEXT, TEXT[5:]], jax.random.PRNGKey(1))
  return text, scores['bpb'], scores['rate']


@pytest.fixture(scope='module')
def generated_and_rescored(tiny_run):
  return _generation_and_rescoring(tiny_run)


@pytest.mark.parametrize('commit', COMMITS)
def test_sample_and_the_ladders_rescoring_read_an_old_run(commit, old_runs, generated_and_rescored):
  assert _generation_and_rescoring(old_runs[commit]) == generated_and_rescored


def _lm_eval_scores(run):
  lm = lm_model.TokjaxLM(checkpoint=run, batch_size=2)
  return [s.logprob for s in lm.scorer.score([TEXT, TEXT], [0, 12])]


@pytest.fixture(scope='module')
def lm_eval_scored(tiny_run):
  return _lm_eval_scores(tiny_run)


@pytest.mark.parametrize('commit', COMMITS)
def test_lm_eval_loads_an_old_run(commit, old_runs, lm_eval_scored):
  np.testing.assert_array_equal(_lm_eval_scores(old_runs[commit]), lm_eval_scored)


@pytest.mark.parametrize('commit', COMMITS)
def test_resume_reads_an_old_run_without_reporting_new_fields(commit, old_runs, tmp_path, capsys):
  run = shutil.copytree(old_runs[commit], str(tmp_path / 'run'))
  done = train.train(trained_config(run), resume=True)  # Step 6 is past the saved 2 steps.
  out = capsys.readouterr().out
  assert 'already finished' in out and np.isfinite(done['bpb']), out
  assert 'changed config' not in out and 'warning' not in out, out


def test_an_old_run_trains_on_with_an_extended_schedule(old_runs, tmp_path, capsys):
  run = shutil.copytree(old_runs['3f7ede2'], str(tmp_path / 'run'))
  config = trained_config(run)
  config.train.steps = 7
  with pytest.raises(UserError, match='config.train.steps=2 and this resume asks for 7'):
    train.train(config, resume=True)
  capsys.readouterr()
  train.train(config, resume=True, extend_schedule=True)
  out = capsys.readouterr().out
  assert 'resumed from step 6' in out and 'at step 7 instead of step 2' in out, out
  assert 'changed config' not in out
  saved, _, step = inspection.load_config(run)
  assert step == 7 and saved.train.steps == 7 and saved.optim.policy_lr_factor == 1.0


def test_an_old_run_with_another_width_names_that_field_alone(old_runs, tmp_path):
  run = shutil.copytree(old_runs['3f7ede2'], str(tmp_path / 'run'))
  config = tiny_run_config(run)
  config.model.d_model, config.optim.lr = 64, 1e-3
  with pytest.raises(UserError) as e:
    train.train(config, resume=True)
  msg = str(e.value)
  assert 'config.model.d_model=32 (64 now)' in msg and '--config.model.d_model=32' in msg, msg
  assert 'optim.lr' not in msg and '\n' not in msg, msg


def test_a_field_this_version_does_not_know_is_one_line(old_runs, tmp_path, capsys):
  saved = saved_config(COMMITS[-1])
  saved['optim']['future_factor'] = 2.0
  run = with_config(old_runs[COMMITS[-1]], str(tmp_path / 'run'), saved)
  with pytest.raises(UserError) as e:
    inspection.load_checkpoint(run)
  msg = str(e.value)
  assert 'config.optim.future_factor is not a field of this version' in msg and '\n' not in msg
  assert 'train again' not in msg and 'warning' not in capsys.readouterr().out  # No fallback.


def test_a_saved_config_this_version_cannot_build_is_one_line(old_runs, tmp_path, capsys):
  saved = saved_config(COMMITS[-1])
  saved['boundary']['method'] = 'not_registered'
  saved['boundary']['not_registered'] = {'bytes': '.'}
  run = with_config(old_runs[COMMITS[-1]], str(tmp_path / 'run'), saved)
  with pytest.raises(UserError) as e:
    inspection.load_checkpoint(run)
  msg = str(e.value)
  assert 'does not build a model in this version' in msg and 'not_registered' in msg, msg
  assert '\n' not in msg and 'train again' not in msg
  assert 'warning' not in capsys.readouterr().out


def test_a_missing_field_reads_as_one_clean_line():
  with pytest.raises(KeyError) as e:
    ml_collections.ConfigDict({'min_lr_factor': 0.0})['policy_lr_factor']  # pylint: disable=expression-not-assigned
  assert '\\' in str(e.value)  # Its str is the repr of a two-line message, escapes and all.
  assert inspection._reason(e.value) == "no field 'policy_lr_factor'"  # pylint: disable=protected-access
