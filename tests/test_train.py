"""The training loop: learning, exact resumption, compilation, config overrides and bad input."""

import json
import os
import shutil
import subprocess
import sys

from conftest import command_lines, tiny_config, tiny_run_config
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import checkpointing, inspection, losses, sharding, stages, train
from tokjax import trainer as trainer_lib
from tokjax.data import pipeline
from tokjax.errors import UserError
from tokjax.metric_writers import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train_rows(workdir):
  return {
      r['step']: r
      for r in read_metrics(os.path.join(workdir, 'metrics.jsonl'))
      if r['split'] == 'train'
  }


def test_loss_falls_on_a_small_real_slice(flat_run):
  rows = _train_rows(flat_run)
  first = np.mean([rows[s]['loss'] for s in (1, 2, 3)])
  last = np.mean([rows[s]['loss'] for s in (38, 39, 40)])
  assert last < first - 1.0, (first, last)  # ln(258) = 5.55 nats at the start.


def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(tiny_run, tmp_path):
  """The shared 6-step run (checkpoints at 3 and 6), copied; drop step 6, resume from 3: steps 4-6
  give the same losses bit for bit, which needs the params, optimizer state, data position and step
  keys all restored."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(tiny_run, workdir)
  uninterrupted = _train_rows(workdir)
  mgr = checkpointing.manager(workdir)
  mgr.delete(6)
  assert mgr.latest_step() == 3
  metrics = os.path.join(workdir, 'metrics.jsonl')
  kept = [r for r in read_metrics(metrics) if r['step'] <= 3]
  with open(metrics, 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in kept)
  train.train(tiny_run_config(workdir), resume=True)
  resumed = _train_rows(workdir)
  for step in (4, 5, 6):
    assert resumed[step]['loss'] == uninterrupted[step]['loss'], step
    assert resumed[step]['rate'] == uninterrupted[step]['rate'], step


def test_train_step_compiles_once_whatever_the_boundaries(tmp_path):
  c = tiny_config(str(tmp_path))
  mesh = sharding.make_mesh(c.mesh)
  data = pipeline.build_data(c)
  trainer = trainer_lib.Trainer(c, mesh)
  state = trainer.init(jax.random.PRNGKey(0))
  counts = []
  for _ in range(3):
    state, metrics = trainer.train_step(
        state, sharding.global_batch(next(data.train_iter), mesh), jax.random.PRNGKey(1)
    )
    counts.append(float(metrics['rate']))
  assert len(set(counts)) > 1  # The boundaries (and so the chunk counts) differed between steps.
  assert trainer._train_step._cache_size() == 1  # pylint: disable=protected-access


def test_nan_loss_stops_with_a_message_and_keeps_the_checkpoint_valid(tmp_path, monkeypatch):
  """A loss that turns NaN at step 4 never reaches the parameters or a checkpoint; the run stops
  with one message and resumes from the last good checkpoint."""
  real_objective = losses.objective

  def poisoned(config, model, mode='sample', *, levels):
    f = real_objective(config, model, mode, levels=levels)

    def g(params, batch, key, step):
      loss, aux = f(params, batch, key, step)
      return jnp.where(step >= 3, jnp.nan, loss), aux

    return g

  monkeypatch.setattr(losses, 'objective', poisoned)
  c = tiny_config(str(tmp_path))
  c.train.log_every, c.train.checkpoint_every = 2, 2
  with pytest.raises(UserError, match='NaN.*checkpoint step 2 is intact.*--resume'):
    train.train(c)
  status = train.read_status(str(tmp_path))  # The error that ended it, not 'running'.
  assert (status['state'], status['step'], status['checkpoint_step']) == ('failed', 4, 2)
  mgr = checkpointing.manager(str(tmp_path))
  assert mgr.latest_step() == 2
  trainer = trainer_lib.Trainer(c, sharding.make_mesh(c.mesh))
  state, _ = checkpointing.restore(mgr, trainer.abstract_state)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))
  assert int(state.nonfinite) == 0


@pytest.mark.parametrize(
    'field,value,message',
    [
        ('data.corpus', '/no/such/corpus', 'does not exist'),
        ('data.seq_len', 1, 'seq_len=1 is too short'),
        ('model.kind', 'mlp', "model.kind='mlp' is not valid"),
        ('boundary.target_rate', 1.5, 'target_rate=1.5 must be in'),
        ('train.workdir', '/etc/passwd/run', 'cannot write to workdir'),
        ('optim.policy_lr_factor', 0.0, 'policy_lr_factor=0.0 must be positive'),
    ],
)
def test_bad_config_values_raise_one_clear_user_error(tmp_path, field, value, message):
  c = tiny_config(str(tmp_path / 'run'))
  section, name = field.split('.')
  c[section][name] = value
  with pytest.raises(UserError, match=message):
    train.train(c)


def test_policy_lr_factor_scales_the_boundary_updates_only():
  params = {
      'boundary': {'proj': {'kernel': jnp.ones((3, 1)), 'bias': jnp.ones((1,))}},
      'inner_boundaries_0': {'proj': {'kernel': jnp.ones((3, 1))}},
      'encoder': {'w': jnp.ones((3, 3))},
  }
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  c = tiny_config('unused')

  def updates(factor):
    c.optim.policy_lr_factor = factor
    tx = trainer_lib.make_optimizer(c)
    return tx.update(grads, tx.init(params), params)[0]

  one, quarter = updates(1.0), updates(0.25)
  for name in params:
    ratio = jax.tree.map(lambda a, b: np.asarray(b / a), one[name], quarter[name])
    want = 1.0 if name == 'encoder' else 0.25
    for r in jax.tree.leaves(ratio):
      np.testing.assert_allclose(r, want, rtol=1e-6, err_msg=name)
  # At 1.0 the optimizer state is the two-transform chain every existing checkpoint holds.
  c.optim.policy_lr_factor = 1.0
  assert len(trainer_lib.make_optimizer(c).init(params)) == 2


def test_empty_corpus_and_folder_without_files_are_reported(tmp_path):
  (tmp_path / 'empty.txt').write_bytes(b'')
  (tmp_path / 'nothing').mkdir()
  for corpus, message in ((tmp_path / 'empty.txt', 'empty'), (tmp_path / 'nothing', 'no readable')):
    c = tiny_config(str(tmp_path / 'run'))
    c.data.corpus = str(corpus)
    with pytest.raises(UserError, match=message):
      train.train(c)


def _cli(*args, cwd=REPO):
  return subprocess.run(
      [sys.executable, '-m', 'tokjax.train', *args],
      cwd=cwd,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )


def test_command_line_overrides_reach_the_config(tmp_path):
  workdir = str(tmp_path / 'run')
  proc = _cli(
      '--config=configs/default.py',
      f'--config.train.workdir={workdir}',
      '--config.model.d_model=24',
      '--config.model.num_heads=2',
      '--config.data.seq_len=32',
      '--config.data.batch_size=2',
      '--config.data.max_bytes=100000',
      '--config.train.steps=2',
      '--config.eval.max_batches=1',
      '--config.eval.batch_size=2',
      '--config.model.capacity=16',
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  config, _, step = inspection.load_config(workdir)
  assert (config.model.d_model, config.data.seq_len, step) == (24, 32, 2)
  assert 'learned segmentation of held-out text' in proc.stdout


# (flags, words of the one error line); each case trains into its own workdir.
BAD_INPUT = [
    (('--config.model.bogus=3',), 'unknown config key --config.model.bogus'),
    (('--config.data.corpus=/no/such/corpus',), "corpus path '/no/such/corpus' does not exist"),
    (('--config.model.d_model=abc',), 'd_model=abc'),
    (
        ('--config.train.keep_checkpoints=0',),
        'keep_checkpoints=0 must be a whole number of at least 1',
    ),
    (('--config.train.keep_checkpoints=-1',), 'keep_checkpoints=-1 must be a whole number'),
    (('--config.train.workdir=',), 'config.train.workdir is empty'),
    (('--overwrite', '--resume'), '--overwrite deletes the run that --resume would continue'),
    (
        ('--config.boundary.window=-1',),
        'config.boundary.window moved to config.boundary.policy.window (commit 3911346); pass '
        '--config.boundary.policy.window=-1',
    ),
    (('--config.estimator.kind=x',), 'config.estimator.kind was removed'),
    (
        ('--config.train.profile_steps=(5,2)',),
        'config.train.profile_steps=(5, 2) must be two step numbers (N, M) with 0 <= N <= M',
    ),
    (('--config.train.profile_steps=(-1,2)',), 'profile_steps=(-1, 2) must be two step numbers'),
    (('--config.seed=-1',), 'config.seed=-1 must be a whole number of at least 0'),
    (('--config.optim.warmup_steps=-3',), 'config.optim.warmup_steps=-3 must be a whole number'),
    (('--config.optim.lr=nan',), 'config.optim.lr=nan must be a finite number'),
]
# Refused before the workdir is made: nothing is touched.
UNTOUCHED = (
    'keep_checkpoints',
    'workdir=',
    '--overwrite',
    'boundary.window',
    'estimator.kind',
    'profile_steps',
    'seed',
    'warmup_steps',
    'optim.lr',
)


def test_cli_reports_bad_input_on_one_line_without_traceback(tmp_path):
  argvs = [
      ['--config=configs/default.py', f'--config.train.workdir={tmp_path}/run{i}', *args]
      for i, (args, _) in enumerate(BAD_INPUT)
  ]
  ended = command_lines('tokjax.train', argvs, cwd=REPO)
  for i, ((code, err), (args, message)) in enumerate(zip(ended, BAD_INPUT)):
    assert code == 2, (args, err[-2000:])
    assert 'Traceback' not in err, (args, err[-2000:])
    lines = [l for l in err.splitlines() if l.startswith('error:')]
    assert len(lines) == 1 and message in lines[0], (args, err[-2000:])
    if any(word in a for a in args for word in UNTOUCHED):
      assert not os.path.exists(f'{tmp_path}/run{i}'), args


def test_existing_run_needs_resume_or_a_new_workdir(tmp_path):
  workdir = str(tmp_path / 'run')
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.write('{}\n')
  with pytest.raises(UserError, match='--resume'):
    train.train(tiny_config(workdir))
  shutil.rmtree(workdir)


def test_progress_rows_carry_model_flops_and_profile_steps_are_traced(tmp_path):
  """Model TFLOP/s is the analytic step cost at the logged step's realised rate, per second; MFU is
  reported against the device peak; config.train.profile_steps writes a jax.profiler trace."""
  from tokjax import flops  # pylint: disable=g-import-not-at-top

  c = tiny_config(str(tmp_path / 'run'))
  c.train.steps, c.train.log_every, c.train.eval_every, c.train.checkpoint_every = 3, 3, 3, 3
  c.train.profile_steps = (2, 3)
  train.train(c)
  row = next(
      r for r in read_metrics(str(tmp_path / 'run' / 'metrics.jsonl')) if r['split'] == 'train'
  )
  per_byte = flops.step_flops(c, row['rate'], levels=stages.resolve(c)) / (
      c.data.batch_size * c.data.seq_len
  )
  assert row['model_tflops'] * 1e12 == pytest.approx(per_byte * row['bytes_per_s'], rel=1e-6)
  assert 0 < row['mfu'] < 1
  traces = list((tmp_path / 'run' / 'profile').rglob('*.xplane.pb'))
  assert traces, 'no profiler trace written for profile_steps=(2, 3)'
