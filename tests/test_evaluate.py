"""Tests of tokjax.evaluate: the trainer's val bpb reproduced, per-document bookkeeping, greedy
determinism, the written report, and clear errors for broken checkpoint folders."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from tokjax import checkpointing, evaluate, inspection
from tokjax.data import baselines, pipeline
from tokjax.errors import UserError


@pytest.fixture(scope='module')
def ckpt(tiny_run):
  return inspection.load_checkpoint(tiny_run)


def _last_val(run):
  rows = [json.loads(l) for l in open(os.path.join(run, 'metrics.jsonl'))]
  return [r for r in rows if r['split'] == 'val'][-1]


def test_reproduces_trainer_val_bpb(tiny_run, ckpt):
  val = _last_val(tiny_run)
  docs = evaluate.load_split(ckpt.config, None, 'val')['val']
  res = ckpt.evaluator.run(
      ckpt.params,
      docs,
      inspection.eval_key(ckpt.config),
      max_batches=ckpt.config.eval.max_batches,
  )
  for mode, prefix in (('sample', ''), ('greedy', 'greedy_')):
    for k in ('bpb', 'bpb_se', 'rate', 'whitespace_recall', 'whitespace_precision'):
      assert res[mode][k] == pytest.approx(val[prefix + k], abs=1e-6, nan_ok=True), (mode, k)
  # Another key draws other sampled boundaries, so the match above is not a coincidence of the key.
  other = ckpt.evaluator.run(
      ckpt.params,
      docs,
      jax.random.PRNGKey(123),
      modes=('sample',),
      max_batches=ckpt.config.eval.max_batches,
  )
  assert other['sample']['bpb'] != pytest.approx(val['bpb'], abs=1e-5)


def test_per_document_figures_are_consistent(ckpt):
  docs = evaluate.load_split(ckpt.config, None, 'test')['test']
  res = ckpt.evaluator.run(ckpt.params, docs, jax.random.PRNGKey(0), modes=('greedy',))['greedy']
  assert res['documents'] == len(docs)
  assert res['bytes'] == sum(map(len, docs))  # Every byte of the split is scored exactly once.
  assert res['bpb_se'] > 0 and np.isfinite(res['bpb'])
  assert 0.0 <= res['rate'] <= 1.0


def test_greedy_boundaries_are_deterministic(ckpt):
  docs = evaluate.load_split(ckpt.config, None, 'val')['val']
  run = lambda seed, mode: ckpt.evaluator.run(
      ckpt.params, docs, jax.random.PRNGKey(seed), modes=(mode,), max_batches=2
  )[mode]
  a, b = run(0, 'greedy'), run(1, 'greedy')
  assert json.dumps(a) == json.dumps(b)  # json: NaN standard errors compare equal.
  s0, s1 = run(0, 'sample'), run(1, 'sample')
  assert s0['chunk_hist'] != s1['chunk_hist'] or s0['bpb'] != s1['bpb']


def test_evaluating_a_run_resolves_its_stages_once(tiny_run, tmp_path, resolutions):
  """`python -m tokjax.evaluate`: the run opened (its config validated, its Trainer built), then
  evaluated in both boundary modes, on the one resolution of its saved config."""
  evaluate.run_evaluation(tiny_run, split='val', out=str(tmp_path / 'e'), max_batches=1, bpe=False)
  assert len(resolutions) == 1


def test_report_files(tiny_run, ckpt, tmp_path):
  out = str(tmp_path / 'rep')
  report = evaluate.run_evaluation(tiny_run, split='test', out=out, max_batches=2)
  saved = json.load(open(out + '.json'))
  assert saved['modes'].keys() == {'sample', 'greedy'}
  for m in saved['modes'].values():
    for ref in ('whitespace', 'bpe'):
      assert all(0.0 <= m[f'{ref}_{k}'] <= 1.0 for k in ('precision', 'recall', 'f1'))
  assert 0.05 < saved['bpe']['rate'] < 1.0
  md = open(out + '.md').read()
  assert f"{report['modes']['sample']['bpb']:.4f}" in md and 'BPE reference' in md
  assert 's.e. (ratio estimator over documents)' in md
  # The classical baselines of the same split, as the trainer's data gives them.
  ref = saved['reference_bpb']
  assert ref == baselines.reference(pipeline.load_splits(ckpt.config.data), 'test')
  assert f"ppmd-{ref['ppmd_order']} {ref['ppmd']:.3f} | {ref['ngram_order']}-gram" in md


def _copy(run, tmp_path, name):
  """A copy of the run with only its last checkpoint (older ones would be the fallback); -> (run
  folder, that checkpoint's folder)."""
  dst = str(tmp_path / name)
  shutil.copytree(run, dst)
  mgr = checkpointing.manager(dst)
  *older, last = sorted(mgr.all_steps())
  for step in older:
    mgr.delete(step)
  return dst, os.path.join(dst, 'checkpoints', str(last))


def test_bad_checkpoint_folders(tiny_run, tmp_path):
  with pytest.raises(UserError, match='does not exist'):
    inspection.load_checkpoint(str(tmp_path / 'missing'))
  (tmp_path / 'empty').mkdir()
  with pytest.raises(UserError, match='holds no checkpoint'):
    inspection.load_checkpoint(str(tmp_path / 'empty'))
  run, step_dir = _copy(tiny_run, tmp_path, 'nocommit')
  os.remove(os.path.join(step_dir, 'commit_success.txt'))
  with pytest.raises(UserError, match='step 6 .* unusable.*commit_success'):
    inspection.load_checkpoint(run)
  run, step_dir = _copy(tiny_run, tmp_path, 'nostate')
  shutil.rmtree(os.path.join(step_dir, 'state'))
  with pytest.raises(UserError, match='step 6 .* unusable.*"state"'):
    inspection.load_checkpoint(run)


def test_checkpoint_from_another_config(tiny_run, tmp_path):
  run, step_dir = _copy(tiny_run, tmp_path, 'other')
  meta = os.path.join(step_dir, 'config', 'metadata')
  cfg = json.load(open(meta))
  cfg['model']['d_model'] = 64
  json.dump(cfg, open(meta, 'w'))
  with pytest.raises(UserError, match='does not fit its saved config|other parameter shapes'):
    inspection.load_checkpoint(run)


def test_checkpoint_from_a_larger_mesh_loads_on_this_machine(tiny_run, tmp_path, ckpt, capsys):
  """A run saved with a 2x2x2 mesh (as on 8 accelerators) is inspected here on all devices along the
  data axis, with the same parameters, instead of failing on the mesh size."""
  run, step_dir = _copy(tiny_run, tmp_path, 'pod')
  meta = os.path.join(step_dir, 'config', 'metadata')
  cfg = json.load(open(meta))
  cfg['mesh'].update(data=2, fsdp=2, tensor=2)
  json.dump(cfg, open(meta, 'w'))
  moved = inspection.load_checkpoint(run)
  assert 'does not fit' in capsys.readouterr().out
  assert (moved.config.mesh.data, moved.config.mesh.fsdp, moved.config.mesh.tensor) == (-1, 1, 1)
  assert moved.trainer.mesh.devices.size == jax.device_count()
  for a, b in zip(jax.tree.leaves(moved.params), jax.tree.leaves(ckpt.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
