"""Tests of `python -m tokjax.export`: the folder, its PyTorch layout and strict names, loading with
transformers in a process without JAX, logits equal to tokjax's, the parity gate for every boundary
method, two stages and the flat model, and one-line refusals that write nothing."""

import functools
import inspect
import json
import os
import re
import shutil
import subprocess
import sys

import conftest
import flax.linen as nn
import jax
import numpy as np
import pytest
import safetensors
import torch

from tokjax import checkpointing, inspection, models, stages
from tokjax.errors import UserError
from tokjax.export import exporter, mapping, spec
from tokjax.models import registry
from tokjax.models.rivals import entropy
from tokjax.vocab import BOS_ID, PAD_ID

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Loads an export with transformers alone and writes its logits and boundaries (greedy, and given
# the boundaries in the .npz) next to the inputs.
LOAD_SCRIPT = r"""
import sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM
folder, data = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
arrays = np.load(data)
ids = torch.from_numpy(arrays['tokens'].astype(np.int64))
given = tuple(torch.from_numpy(arrays[k]) for k in sorted(arrays) if k.startswith('given_'))
with torch.no_grad():
  greedy = model(ids)
  with_given = model(ids, boundaries=given)
assert not [m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'tokjax'))], 'JAX imported'
np.savez(data + '.out.npz', greedy=greedy.logits.numpy(), given=with_given.logits.numpy(),
         **{f'greedy_b{s}': b.numpy() for s, b in enumerate(greedy.boundaries)})
print('no jax')
"""


@pytest.fixture(scope='module')
def exported(tiny_run, tmp_path_factory):
  """(export folder, restored checkpoint) of the shared tiny run."""
  out = str(tmp_path_factory.mktemp('export') / 'out')
  exporter.export(tiny_run, out)
  return out, inspection.load_checkpoint(tiny_run)


def _tokjax(ckpt, tokens, mode, actions=None):
  @jax.jit
  def run(params, tokens):
    out = ckpt.model.apply(
        {'params': params}, tokens, jax.random.PRNGKey(1), mode=mode, actions=actions
    )
    return out.logits, tuple(s.boundaries.actions for s in out.stages)

  logits, acts = run(ckpt.params, tokens)
  return np.asarray(logits), [np.asarray(a) for a in acts]


def test_folder_holds_every_file_with_pytorch_layout(exported):
  out, ckpt = exported
  for name in (
      'model.safetensors',
      'config.json',
      'modeling_tokjax.py',
      'configuration_tokjax.py',
      'tokenizer.json',
      'tokenizer_config.json',
      'generation_config.json',
      'README.md',
  ):
    assert os.path.isfile(os.path.join(out, name)), name
  with safetensors.safe_open(os.path.join(out, 'model.safetensors'), 'np') as f:
    assert f.metadata() == {'format': 'pt'}
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  p = ckpt.params
  # Linear kernels are [out, in]: the head's [D, V] kernel is stored as [V, D].
  np.testing.assert_array_equal(
      tensors['head.proj.weight'], np.asarray(p['head']['proj']['kernel']).T
  )
  q = np.asarray(p['encoder']['block_0']['attn']['query']['kernel'])  # [D, H, K]
  np.testing.assert_array_equal(
      tensors['encoder.blocks.0.attn.q_proj.weight'], q.reshape(q.shape[0], -1).T
  )
  np.testing.assert_array_equal(tensors['embed.weight'], np.asarray(p['embed']['embedding']))
  assert len(tensors) == len(jax.tree.leaves(p))  # Every tokjax leaf, and nothing else.
  config = json.load(open(os.path.join(out, 'config.json')))
  assert config['model_type'] == 'tokjax' and config['auto_map']['AutoModelForCausalLM']
  assert config['stages'][0]['method'] == 'policy'
  assert config['stages'][0]['capacity'] == ckpt.config.model.capacity
  assert config['bos_token_id'] == BOS_ID and config['tokjax']['step'] == ckpt.step
  card = open(os.path.join(out, 'README.md')).read()
  assert 'val bpb' in card and ckpt.config.data.corpus in card
  # Every file readable as the umask allows, the weights too (safetensors' own writer gives 0600).
  umask = os.umask(0)
  os.umask(umask)
  modes = {name: os.stat(os.path.join(out, name)).st_mode & 0o777 for name in os.listdir(out)}
  assert modes == {name: 0o666 & ~umask for name in modes}, modes
  # A hierarchical model's config.json holds no field of the flat model's.
  assert not {'num_layers', 'mlp_ratio'} & set(config), sorted(config)


def test_step_records_that_steps_own_val_bpb(exported, tiny_run, tmp_path):
  out, ckpt = exported
  logged = {
      r['step']: r['bpb']
      for r in map(json.loads, open(os.path.join(tiny_run, 'metrics.jsonl')))
      if r.get('split') == 'val'
  }
  assert set(logged) >= {3, ckpt.step} and logged[3] != logged[ckpt.step]
  early = str(tmp_path / 'step3')
  exporter.export(tiny_run, early, step=3)
  t = json.load(open(os.path.join(early, 'config.json')))['tokjax']
  assert (t['step'], t['val_bpb'], t['val_bpb_step']) == (3, logged[3], 3)
  card = open(os.path.join(early, 'README.md')).read()
  assert '- training steps: 3\n' in card and f'- val bpb: {logged[3]:.4f} (step 3)\n' in card
  # A step the run did not evaluate at: said so, not another step's number.
  run = str(tmp_path / 'run')
  shutil.copytree(tiny_run, run)
  rows = [json.loads(line) for line in open(os.path.join(run, 'metrics.jsonl'))]
  with open(os.path.join(run, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rows if (r.get('split'), r['step']) != ('val', 3))
  assert exporter.val_bpb_at(run, 3) is None and exporter.val_bpb_at(run, 6) == logged[6]
  fields = dict(t, val_bpb=None, val_bpb_step=None)
  card = exporter.model_card(
      dict(spec.hf_config(ckpt.config, levels=ckpt.levels), tokjax=fields), ckpt
  )
  assert '- val bpb: not logged at step 3\n' in card


def test_model_card_code_runs_without_a_prompt(exported, monkeypatch):
  out, _ = exported
  card = open(os.path.join(out, 'README.md')).read()
  code = card.split('```python\n')[1].split('```')[0]
  asked = []  # transformers asks on stdin before running a folder's code it was not told to trust.
  monkeypatch.setattr('builtins.input', lambda *a: asked.append(a) or 'n')
  scope = {'DIR': out}
  exec(code, scope)  # pylint: disable=exec-used
  assert not asked, asked
  assert scope['out'].logits.shape[:2] == (1, len(b'To be, or not to be') + 1)


def test_from_pretrained_without_jax_gives_tokjax_logits(exported, tmp_path):
  out, ckpt = exported
  tokens = exporter.probe(ckpt.config.data.seq_len)
  _, given = _tokjax(ckpt, tokens, 'sample')
  data = str(tmp_path / 'inputs.npz')
  np.savez(data, tokens=tokens, **{f'given_{s}': a for s, a in enumerate(given)})
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  run = subprocess.run(
      [sys.executable, '-c', LOAD_SCRIPT, out, data],
      cwd=str(tmp_path),  # Not the repository: nothing of tokjax is importable by accident.
      capture_output=True,
      text=True,
      env=env,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert 'no jax' in run.stdout
  got = np.load(data + '.out.npz')
  ref_given, _ = _tokjax(ckpt, tokens, 'given', tuple(given))
  ref_greedy, ref_acts = _tokjax(ckpt, tokens, 'greedy')
  np.testing.assert_allclose(got['given'], ref_given, atol=1e-4, rtol=0)
  np.testing.assert_allclose(got['greedy'], ref_greedy, atol=1e-4, rtol=0)
  np.testing.assert_array_equal(got['greedy_b0'], ref_acts[0])


def test_strict_names_refuse_unmapped_and_unfilled_parameters(exported):
  _, ckpt = exported
  fields = spec.hf_config(ckpt.config, levels=ckpt.levels)
  shapes = {k: tuple(v.shape) for k, v in exporter.torch_model(fields).state_dict().items()}
  params = jax.tree.map(np.asarray, ckpt.params)
  extra = dict(params, stray={'kernel': np.zeros((2, 2), np.float32)})
  with pytest.raises(UserError, match='unused by the PyTorch model.*stray.weight'):
    mapping.to_torch_state(extra, shapes)
  fewer = {k: v for k, v in params.items() if k != 'early_head'}
  with pytest.raises(UserError, match='missing from the tokjax checkpoint.*early_head'):
    mapping.to_torch_state(fewer, shapes)
  with pytest.raises(UserError, match='has no PyTorch name'):
    mapping.torch_name(('embed', 'unknown_leaf'))
  state = mapping.to_torch_state(params, shapes)
  for path, x in mapping.flatten(params).items():  # The layout change inverts exactly.
    back = mapping.from_torch(path, state[mapping.torch_name(path)], x.shape)
    assert back.shape == x.shape, path
    np.testing.assert_array_equal(back, x)


def test_from_pretrained_refuses_missing_or_unexpected_weights(exported, tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  out, _ = exported
  tensors = load_file(os.path.join(out, 'model.safetensors'))
  for name, changed in (
      ('missing', {k: v for k, v in tensors.items() if k != 'head.proj.weight'}),
      ('unexpected', dict(tensors, stray=np.zeros(2, np.float32))),
  ):
    folder = str(tmp_path / name)
    shutil.copytree(out, folder)
    save_file(changed, os.path.join(folder, 'model.safetensors'), metadata={'format': 'pt'})
    with pytest.raises(ValueError, match=f'does not fit the tokjax model.*{name}_keys'):
      AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
  # One weight of another shape: refused, never left uninitialised, even when asked to ignore it.
  folder = str(tmp_path / 'mismatched')
  shutil.copytree(out, folder)
  want = tensors['head.proj.weight'].shape
  changed = dict(tensors, **{'head.proj.weight': tensors['head.proj.weight'][:-1]})
  save_file(changed, os.path.join(folder, 'model.safetensors'), metadata={'format': 'pt'})
  got = (want[0] - 1, want[1])
  for ignore in (False, True):
    said = f'head.proj.weight has shape {got} in the checkpoint and {want} in the model'
    with pytest.raises(ValueError, match=re.escape(said)):
      AutoModelForCausalLM.from_pretrained(
          folder, trust_remote_code=True, ignore_mismatched_sizes=ignore
      )


def test_gate_refuses_a_model_whose_logits_differ(exported):
  _, ckpt = exported
  fields = spec.hf_config(ckpt.config, levels=ckpt.levels)
  model_pt = exporter.torch_model(fields, exporter.torch_state(fields, ckpt.params))
  with torch.no_grad():
    model_pt.head.proj.weight[7, 0] += 0.01
  with pytest.raises(UserError, match=r'parity check failed: .* by up to [0-9.e-]+ with given'):
    exporter.gate(ckpt.model, ckpt.params, model_pt, ckpt.config.data.seq_len)


def _bad(tmp_path, *args):
  """The exit code and stderr of `python -m tokjax.export args`."""
  run = subprocess.run(
      [sys.executable, '-m', 'tokjax.export', *args],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  return run.returncode, run.stderr.strip()


def test_bad_input_is_one_line_and_writes_nothing(tiny_run, tmp_path):
  out = str(tmp_path / 'out')
  code, err = _bad(tmp_path, f'--checkpoint={tmp_path}', f'--out={out}')
  assert code == 2 and err.startswith('error: ') and len(err.splitlines()) == 1, err
  assert 'holds no checkpoint' in err and not os.path.exists(out)
  with pytest.raises(UserError, match='has no checkpoint of step 5; it has steps'):
    exporter.export(tiny_run, out, step=5)
  os.makedirs(out)
  open(os.path.join(out, 'x'), 'w').close()
  with pytest.raises(UserError, match='exists and is not empty'):
    exporter.export(tiny_run, out)
  assert os.listdir(out) == ['x']
  # A run of a method the port cannot reproduce: its saved config names it.
  run = str(tmp_path / 'uniform_run')
  shutil.copytree(tiny_run, run)
  for step in os.listdir(os.path.join(run, 'checkpoints')):
    meta = os.path.join(run, 'checkpoints', step, 'config', 'metadata')
    saved = json.load(open(meta))
    saved['boundary']['method'] = 'uniform'
    json.dump(saved, open(meta, 'w'))
  fresh = str(tmp_path / 'fresh')
  with pytest.raises(UserError, match="config.boundary.method='uniform' cannot be exported"):
    exporter.export(run, fresh)
  assert not os.path.exists(fresh) and not [f for f in os.listdir(tmp_path) if 'partial' in f]


def test_config_json_holds_its_kinds_fields_and_earlier_exports_load(exported, tmp_path):
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  from tokjax.export import configuration_tokjax, importer  # pylint: disable=g-import-not-at-top

  c = conftest.tiny_config(str(tmp_path))
  c.model.kind, c.model.num_layers = 'flat', 2
  flat = configuration_tokjax.TokjaxConfig(
      **spec.hf_config(c, levels=stages.resolve(c))
  ).to_diff_dict()
  assert flat['num_layers'] == 2 and flat['kind'] == 'flat'
  assert not set(configuration_tokjax.KIND_FIELDS['hierarchical']) & set(flat), sorted(flat)
  # config.json as earlier versions wrote it, with the flat model's fields beside a hierarchical
  # model's: it loads, and imports, as before.
  out, ckpt = exported
  folder = str(tmp_path / 'earlier')
  shutil.copytree(out, folder)
  path = os.path.join(folder, 'config.json')
  config = json.load(open(path))
  json.dump(dict(config, num_layers=4, mlp_ratio=4), open(path, 'w'))
  model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
  assert model.config.kind == 'hierarchical' and not hasattr(model.config, 'num_layers')
  fields, _ = importer.read_export(folder)
  back = importer.training_config(fields, str(tmp_path / 'run'))
  assert back.model.to_dict() == ckpt.config.model.to_dict()


# ------------------------------------------------------------------------------ the way back


def test_import_gives_the_run_back_evaluates_equal_and_resumes(exported, tiny_run, tmp_path):
  import importlib.util  # pylint: disable=g-import-not-at-top

  import optax  # pylint: disable=g-import-not-at-top

  from tokjax import evaluate, train  # pylint: disable=g-import-not-at-top
  from tokjax.export import importer  # pylint: disable=g-import-not-at-top

  out, ckpt = exported
  run = str(tmp_path / 'run')
  importer.import_export(out, run)
  back = inspection.load_checkpoint(run)
  assert back.step == ckpt.step and back.config.model.to_dict() == ckpt.config.model.to_dict()
  jax.tree.map(np.testing.assert_array_equal, back.params, ckpt.params)
  # The same bpb as the exported run, as `python -m tokjax.evaluate` reports it.
  scores = [
      evaluate.run_evaluation(r, split='val', out=str(tmp_path / f'eval{i}'), bpe=False)['modes']
      for i, r in enumerate((tiny_run, run))
  ]
  for mode, m in scores[0].items():
    assert scores[1][mode]['bpb'] == m['bpb'], mode
  # The optimizer starts fresh (zero moments, Adam's count 0), the schedule at the exported step.
  mgr = checkpointing.manager(run, create=False)
  state, _ = checkpointing.restore(mgr, back.trainer.abstract_state)
  is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
  states = jax.tree.leaves(state.opt_state, is_leaf=is_schedule)
  assert [int(s.count) for s in states if is_schedule(s)] == [ckpt.step]
  adam = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, 'mu'))]
  adam = [s for s in adam if hasattr(s, 'mu')]
  assert adam and all(int(s.count) == 0 for s in adam)
  assert all(not np.any(np.asarray(x)) for s in adam for x in jax.tree.leaves(s.mu))
  # Resuming with the config file the import wrote trains on from the exported step.
  spec_ = importlib.util.spec_from_file_location('imported_config', os.path.join(run, 'config.py'))
  module = importlib.util.module_from_spec(spec_)
  spec_.loader.exec_module(module)
  config = module.get_config()
  assert config.train.workdir == os.path.abspath(run)
  config.train.steps = ckpt.step + 2
  config.train.eval_every = config.train.checkpoint_every = config.train.log_every = 2
  val = train.train(config, resume=True, extend_schedule=True)
  assert np.isfinite(val['bpb'])
  assert sorted(inspection.inspection_manager(run).all_steps())[-1] == ckpt.step + 2
  rows = [json.loads(line) for line in open(os.path.join(run, 'metrics.jsonl'))]
  assert [r['step'] for r in rows if r.get('split') == 'train'] == [ckpt.step + 2]


def test_import_refuses_what_is_not_an_export_and_writes_nothing(exported, tiny_run, tmp_path):
  from tokjax.export import importer  # pylint: disable=g-import-not-at-top

  out, _ = exported
  run = str(tmp_path / 'run')
  code, err = _bad(tmp_path, f'--import={tiny_run}', f'--out={run}')  # A run, not an export.
  assert code == 2 and err.startswith('error: ') and len(err.splitlines()) == 1, err
  assert 'is not a tokjax export (it has no config.json)' in err and not os.path.exists(run)
  folder = str(tmp_path / 'edited')
  shutil.copytree(out, folder)
  config = json.load(open(os.path.join(folder, 'config.json')))
  json.dump(dict(config, model_type='llama'), open(os.path.join(folder, 'config.json'), 'w'))
  with pytest.raises(UserError, match="has no model_type 'tokjax'"):
    importer.import_export(folder, run)
  json.dump(dict(config, d_model=64), open(os.path.join(folder, 'config.json'), 'w'))
  with pytest.raises(UserError, match=r"model fields \['d_model'\] are not those"):
    importer.import_export(folder, run)
  # A weight the tokjax model has no parameter for: an error, never dropped.
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top

  json.dump(config, open(os.path.join(folder, 'config.json'), 'w'))
  weights = os.path.join(folder, 'model.safetensors')
  tensors = load_file(weights)
  save_file(dict(tensors, stray=np.zeros(2, np.float32)), weights, metadata={'format': 'pt'})
  with pytest.raises(UserError, match='1 in the export unused by the tokjax model \\(stray\\)'):
    importer.import_export(folder, run)
  del tensors['head.proj.weight']
  save_file(tensors, weights, metadata={'format': 'pt'})
  with pytest.raises(UserError, match='missing from the export \\(head.proj.weight\\)'):
    importer.import_export(folder, run)
  os.makedirs(run)
  open(os.path.join(run, 'x'), 'w').close()
  with pytest.raises(UserError, match='exists and is not empty'):
    importer.import_export(out, run)
  assert os.listdir(run) == ['x'] and not [f for f in os.listdir(tmp_path) if 'partial' in f]


# ------------------------------------------------------------- every method, two stages, flat


def _initialised(config):
  """(model, params) of config at init: the gate's forward parity holds for any weights."""
  model = models.build_model(config, levels=stages.resolve(config))
  init = lambda *a: nn.unbox(model.init(*a))
  params = conftest.jit_call(init, jax.random.PRNGKey(3), *model.init_args(2, 64))['params']
  return model, params


def _gate(config, params=None, model=None):
  if model is None:
    model, params = _initialised(config)
  fields = spec.hf_config(config, levels=stages.resolve(config))
  model_pt = exporter.torch_model(fields, exporter.torch_state(fields, params))
  return exporter.gate(model, params, model_pt, int(config.data.seq_len))


# A value other than the default for every setting each exported method declares (the policy's
# window aside: the sequential policy's own test below), so that a setting the port reads wrongly, or
# not at all, moves the gate. The policy: the scaled form at w = 1.
NON_DEFAULT = {
    'policy': dict(form='scaled', scale=0.125),
    'hnet': dict(ratio_weight=0.1),
    'gumbel': dict(temperature=0.5, prior_weight=0.5),
}


def test_the_exported_methods_are_the_registrys_and_the_ports():
  """One list of exported methods: the registry's methods are each exported or refused with a
  reason, the port implements exactly the exported ones, and each one's constructor takes exactly
  the settings config.json gives it (a new setting on the JAX side fails here, naming it)."""
  from tokjax.export import modeling_tokjax  # pylint: disable=g-import-not-at-top

  assert set(spec.EXPORTABLE) == set(modeling_tokjax.BOUNDARY_METHODS)
  assert set(spec.EXPORTABLE).isdisjoint(spec.REFUSED)
  assert set(spec.EXPORTABLE) | set(spec.REFUSED) == set(registry.methods())
  for method in spec.EXPORTABLE:
    declared = set(registry.get(method).defaults) - {'window'}
    assert set(NON_DEFAULT.get(method, {})) == declared, method
    c = conftest.tiny_config('')
    c.boundary.method = method
    entry = spec.stage_settings(c, stages.get(c, 0))
    cls = modeling_tokjax.BOUNDARY_METHODS[method]
    takes = set(inspect.signature(cls.__init__).parameters) - {'self', 'd'}
    assert set(entry) - {'method'} == takes, method
    assert isinstance(modeling_tokjax.build_boundary(entry, 32), cls)
  with pytest.raises(ValueError, match=r"settings \['shiny'\], which this modeling_tokjax.py"):
    modeling_tokjax.build_boundary({**entry, 'shiny': 1}, 32)


class _TorchPunctuation(torch.nn.Module):
  """The port of tests/toy_boundary.py's 'punctuation', as docs/extending.md ("Exporting a boundary
  method") describes: the call signature of modeling_tokjax's methods, the JAX module's settings."""

  def __init__(self, d: int, capacity: int, ends: str = '.,;\n'):
    super().__init__()
    del d
    self.capacity, self.ends = capacity, torch.tensor(list(ends.encode()))

  def forward(
      self, h, mode, actions=None, tokens=None, early_logits=None, generator=None, capacity=None
  ):
    from tokjax.export import modeling_tokjax as m  # pylint: disable=g-import-not-at-top

    rule = torch.isin(tokens, self.ends).float()
    executed = m.enforce_convention(actions if mode == 'given' else rule, capacity or self.capacity)
    return m.Boundaries(executed, torch.zeros_like(executed))


def test_a_new_method_exports_once_the_port_has_it(toy_method, tmp_path, monkeypatch):
  """docs/extending.md's recipe on the README's toy method: refused in one line until the port has
  it; with its module in modeling_tokjax.BOUNDARY_METHODS and its name in spec.EXPORTABLE, the gate
  passes, its setting reaches the port, and it generates cached as tokjax does."""
  from tokjax.export import modeling_tokjax  # pylint: disable=g-import-not-at-top

  c = conftest.tiny_config(str(tmp_path))
  c.boundary.method = toy_method
  c.boundary.punctuation.bytes = ' e'  # Not the default: the port must read it.
  with pytest.raises(UserError, match="'punctuation' cannot be exported"):
    spec.check_exportable(c, levels=stages.resolve(c))
  monkeypatch.setitem(modeling_tokjax.BOUNDARY_METHODS, toy_method, _TorchPunctuation)
  monkeypatch.setattr(spec, 'EXPORTABLE', (*spec.EXPORTABLE, toy_method))
  spec.check_exportable(c, levels=stages.resolve(c))
  model, params = _initialised(c)
  found = _gate(c, params, model)
  assert found['given'] <= exporter.TOLERANCE and found['greedy_mismatch'] == 0
  fields = spec.hf_config(c, levels=stages.resolve(c))
  assert fields['stages'][0]['ends'] == ' e'
  model_pt = exporter.torch_model(fields, exporter.torch_state(fields, params))
  ref, cached, uncached, whole = _generations(model, params, model_pt, 20)
  np.testing.assert_array_equal(cached, uncached)
  np.testing.assert_array_equal(cached, ref['tokens'])
  assert 0 < whole.byte_boundaries.numpy()[:, 0, 1:].mean() < 1


@pytest.mark.parametrize('method', sorted(registry.methods()))
def test_gate_for_every_boundary_method(method, tmp_path):
  """Every exported method at a target rate and settings other than the defaults; the others
  refused in one line."""
  c = conftest.tiny_config(str(tmp_path))
  c.boundary.method, c.boundary.target_rate = method, 0.3
  if method in NON_DEFAULT:
    c.boundary[method].update(NON_DEFAULT[method])
  if method not in spec.EXPORTABLE:
    with pytest.raises(UserError, match=f"config.boundary.method='{method}' cannot be exported"):
      spec.check_exportable(c, levels=stages.resolve(c))
    return
  spec.check_exportable(c, levels=stages.resolve(c))
  found = _gate(c)
  assert found['given'] <= exporter.TOLERANCE and found['greedy_mismatch'] == 0


@pytest.mark.parametrize('form', ['auto', 'plain'])
def test_gate_for_the_sequential_policy(form, tmp_path):
  """The paper's sequential policy (auto: scaled at w > 1) and the plain form at w > 1."""
  c = conftest.tiny_config(str(tmp_path))
  c.boundary.policy.window, c.boundary.policy.form = 4, form
  found = _gate(c)
  assert found['given'] <= exporter.TOLERANCE and found['greedy_mismatch'] == 0


def test_gate_for_two_stages_trained(tiny_two_stage_run):
  workdir, _ = tiny_two_stage_run
  ckpt = inspection.load_checkpoint(workdir)
  found = _gate(ckpt.config, ckpt.params, ckpt.model)
  assert found['given'] <= exporter.TOLERANCE and found['greedy_mismatch'] == 0
  assert len(spec.hf_config(ckpt.config, levels=ckpt.levels)['stages']) == 2


def test_gate_for_the_flat_model(tmp_path):
  c = conftest.tiny_config(str(tmp_path))
  c.model.kind, c.model.num_layers = 'flat', 2
  found = _gate(c)
  assert found['given'] <= exporter.TOLERANCE


# ------------------------------------------------------------------------------ lm-eval's hf model

LOGLIKELIHOOD_TASKS = ['tokjax_mc', 'tokjax_lastword']


@functools.cache
def _task_manager():
  """One index of lm-eval's tasks and the offline ones for every evaluation (indexing takes
  seconds)."""
  import lm_eval  # pylint: disable=g-import-not-at-top

  return lm_eval.tasks.TaskManager(include_path=os.path.join(REPO, 'tests', 'lm_eval_tasks'))


def _responses(model, tasks, batch_size=4):
  """{(task, doc id): [each request's log-likelihood or generated text]} of
  lm_eval.simple_evaluate on the offline tasks."""
  import lm_eval  # pylint: disable=g-import-not-at-top

  os.environ.setdefault('DISABLE_MULTIPROC', '1')
  res = lm_eval.simple_evaluate(
      model=model,
      tasks=tasks,
      task_manager=_task_manager(),
      log_samples=True,
      batch_size=batch_size,
      bootstrap_iters=0,
      device='cpu',
  )
  first = lambda r: r[0][0] if isinstance(r[0], (list, tuple)) else r[0]
  return {
      (task, s['doc_id']): [first(r) for r in s['resps']]
      for task, samples in res['samples'].items()
      for s in samples
  }


def test_lm_eval_hf_model_on_the_export_equals_tokjax_lm_eval(exported, tiny_run):
  from lm_eval.models.huggingface import HFLM  # pylint: disable=g-import-not-at-top

  from tokjax.lm_eval import model as lm_model  # pylint: disable=g-import-not-at-top

  out, _ = exported
  # Rolling windows with no overlap are those of the `hf` model (one byte of context each).
  tasks = LOGLIKELIHOOD_TASKS + ['tokjax_rolling', 'tokjax_generate']
  ours = _responses(lm_model.TokjaxLM(checkpoint=tiny_run, batch_size=4, overlap=0), tasks)
  # lm-eval's `hf` model (`--model hf --model_args pretrained=DIR,trust_remote_code=True`).
  hf_lm = lambda **kw: HFLM(
      pretrained=out,
      trust_remote_code=True,
      dtype='float32',
      softmax_dtype='float64',
      device='cpu',
      **kw,
  )
  hf = _responses(hf_lm(batch_size=4), LOGLIKELIHOOD_TASKS)
  # A rolling text without BOS from the tokenizer: the `hf` model puts its own before it.
  hf.update(_responses(hf_lm(batch_size=4, add_bos_token=False), ['tokjax_rolling']))
  # One row at a time: the `hf` model pads a batch of prompts on the left.
  hf.update(_responses(hf_lm(batch_size=1), ['tokjax_generate'], batch_size=1))
  assert set(hf) == set(ours) and len(ours) > 8
  for key, values in ours.items():
    if key[0] == 'tokjax_generate':
      assert hf[key] == values, key
    else:
      np.testing.assert_allclose(hf[key], values, atol=1e-4, rtol=0, err_msg=str(key))
  generated = [v[0] for k, v in ours.items() if k[0] == 'tokjax_generate']
  assert len(generated) == 4 and any(generated), generated
  # Four prompts of different lengths in one batch: the `hf` model pads them on the left, which the
  # export refuses rather than read the padding as text.
  with pytest.raises(ValueError, match='right padding only'):
    _responses(hf_lm(batch_size=4), ['tokjax_generate'], batch_size=4)


def test_lm_eval_hf_model_scores_a_long_rolling_document_as_tokjax(exported, tiny_run):
  from lm_eval.api.instance import Instance  # pylint: disable=g-import-not-at-top
  from lm_eval.models.huggingface import HFLM  # pylint: disable=g-import-not-at-top

  from tokjax.lm_eval import model as lm_model  # pylint: disable=g-import-not-at-top

  out, _ = exported
  text = (exporter.PROBE_TEXT * 5).decode()
  num_bytes = len(text.encode())
  assert num_bytes >= 700
  request = [Instance('loglikelihood_rolling', {}, (text,), 0)]
  ours = lm_model.TokjaxLM(checkpoint=tiny_run, batch_size=4, overlap=0)
  hf = HFLM(
      pretrained=out,
      trust_remote_code=True,
      dtype='float32',
      softmax_dtype='float64',
      device='cpu',
      batch_size=4,
      add_bos_token=False,
  )
  # docs/export.md's tolerance: float32 rounding of each byte's log-probability adds up over a text.
  np.testing.assert_allclose(
      hf.loglikelihood_rolling(request),
      ours.loglikelihood_rolling(request),
      atol=max(1e-4, 1e-6 * num_bytes),
      rtol=0,
  )


# ------------------------------------------------------------------------- generation with a cache


def _generations(model, params, model_pt, num_bytes):
  """(tokjax's greedy generation {'tokens', 'actions'}, PyTorch's cached tokens, its uncached
  tokens, its boundaries over the generated text) after two prompts."""
  from tokjax import decoding  # pylint: disable=g-import-not-at-top

  prompt = np.asarray(
      [[BOS_ID, *b'def main(x):\n  return'], [BOS_ID, *b'The cat sat on a mat.']], np.int32
  )
  gen = decoding.generation_fn(model)
  ref = gen(
      model,
      params,
      jax.numpy.asarray(prompt),
      jax.random.PRNGKey(0),
      num_bytes,
      mode='greedy',
      temperature=0.0,
  )
  ids = torch.from_numpy(prompt.astype(np.int64))
  kw = dict(max_new_tokens=num_bytes, min_new_tokens=num_bytes, do_sample=False)
  kw.update(suppress_tokens=[256, BOS_ID])  # Bytes only, as tokjax samples (the export's default).
  with torch.no_grad():
    cached = model_pt.generate(ids, use_cache=True, **kw)
    uncached = model_pt.generate(ids, use_cache=False, **kw)
    # The cached forward's logits over the whole text, the prompt in one pass and the rest byte by
    # byte, are the uncached forward's.
    whole = model_pt(cached, generation=True)
    first = model_pt(cached[:, : prompt.shape[1]], use_cache=True)
    rest = model_pt(cached[:, prompt.shape[1] :], cache=first.cache)
    np.testing.assert_allclose(
        torch.cat([first.logits, rest.logits], 1).numpy(), whole.logits.numpy(), atol=1e-4, rtol=0
    )
  return {k: np.asarray(v) for k, v in ref.items()}, cached.numpy(), uncached.numpy(), whole


def _lively(params):
  """params whose policies close chunks about half the time (at init they close almost none), so
  that generation runs through every decision path."""
  out = dict(params)
  for k, v in params.items():
    if k == 'boundary' or k.startswith('inner_boundaries'):
      out[k] = {**v, 'bias': v['bias'] * 0, 'proj': {'kernel': v['proj']['kernel'] * 100}}
  return out


@pytest.mark.parametrize('num_stages', [1, 2])
def test_generate_cached_equals_uncached_and_tokjax(num_stages, tmp_path):
  if num_stages == 1:
    c = conftest.tiny_config(str(tmp_path))
  else:  # The inner stage's policy sequential: its decisions read the ones before them.
    c = conftest.tiny_two_stage_config(str(tmp_path))
    c.stages.s1.boundary.policy.window = 3
  model, initial = _initialised(c)
  params = _lively(initial)
  fields = spec.hf_config(c, levels=stages.resolve(c))
  model_pt = exporter.torch_model(fields, exporter.torch_state(fields, params))
  ref, cached, uncached, whole = _generations(model, params, model_pt, 40)
  np.testing.assert_array_equal(cached, uncached)
  np.testing.assert_array_equal(cached, ref['tokens'])
  # Boundaries decided on the fly are those of one forward over the final text, and vary.
  on_bytes = whole.byte_boundaries.numpy()
  tokjax_actions = ref['actions'] if num_stages == 1 else ref['actions'][:, :, : cached.shape[1]]
  np.testing.assert_array_equal(on_bytes[:, 0] if num_stages == 1 else on_bytes, tokjax_actions)
  for level in range(num_stages):
    assert 0 < on_bytes[:, level, 1:].mean() < 1, (level, on_bytes[:, level].mean())
  # A row far longer than training's (64 bytes), at the initial policy (rate about 0.2): its chunk
  # buffers grow with it, so it reads as with room for a chunk at every byte, as tokjax's forward
  # does (tests/test_models.py).
  at_init = exporter.torch_model(fields, exporter.torch_state(fields, initial))
  row = torch.randint(32, 127, (1, 1500), generator=torch.Generator().manual_seed(0))
  draw = lambda: dict(generator=torch.Generator().manual_seed(1))
  with torch.no_grad():
    grown = at_init(row, do_sample=True, **draw())
    unbounded = at_init._hierarchical(row, None, 'sample', capacity=1500, **draw())
  assert float(grown.boundaries[0].sum()) > c.model.capacity
  np.testing.assert_array_equal(grown.boundaries[0].numpy(), unbounded.boundaries[0].numpy())
  np.testing.assert_allclose(grown.logits.numpy(), unbounded.logits.numpy(), atol=1e-4, rtol=0)
  # A batch of prompts of two lengths padded on the left, as transformers pads for generation: a
  # PAD before a row's bytes would be read as text, so every path refuses it.
  padded = torch.tensor([[PAD_ID, PAD_ID, BOS_ID, *b'abc'], [BOS_ID, *b'abcde']])
  for use_cache in (True, False):
    with pytest.raises(ValueError, match='right padding only'):
      model_pt.generate(
          padded, attention_mask=(padded != PAD_ID).long(), use_cache=use_cache, max_new_tokens=2
      )


def test_the_cached_forward_without_gradients_hands_back_the_callers_logits(tmp_path):
  """Without gradients (generate's case) the cached forward runs in inference mode; its logits are
  the caller's to change in place. With gradients it stays differentiable, at the same logits."""
  c = conftest.tiny_config(str(tmp_path))
  _, params = _initialised(c)
  fields = spec.hf_config(c, levels=stages.resolve(c))
  model_pt = exporter.torch_model(fields, exporter.torch_state(fields, params))
  ids = torch.tensor([[BOS_ID, *b'the cat sat']])
  with torch.no_grad():
    whole = model_pt(ids, generation=True).logits
    first = model_pt(ids[:, :-1], use_cache=True)
    assert first.cache.inference
    first.logits[..., PAD_ID] = -float('inf')  # An inference tensor would refuse this.
    last = model_pt(ids[:, -1:], cache=first.cache).logits
  np.testing.assert_allclose(last.numpy(), whole[:, -1:].numpy(), atol=1e-5, rtol=0)
  tracked = model_pt(ids, use_cache=True)
  assert not tracked.cache.inference
  tracked.logits.sum().backward()
  assert float(model_pt.encoder.blocks[0].attn.q_proj.weight.grad.abs().sum()) > 0
  np.testing.assert_allclose(tracked.logits.detach().numpy(), whole.numpy(), atol=1e-5, rtol=0)


def _spread(model, params):
  """params whose boundary methods other than the policy close chunks at about every other position
  with greedy boundaries (at init gumbel and entropy close none and H-Net few): H-Net's query a
  random map, gumbel's logit centred and spread, entropy's threshold at the median entropy of a
  text."""
  out = dict(params)
  rng = np.random.default_rng(0)
  for name, v in params.items():
    if 'q' in v:
      out[name] = {**v, 'q': {'kernel': rng.normal(size=v['q']['kernel'].shape).astype(np.float32)}}
    elif 'mlp_out' in v:
      out[name] = {
          **v,
          'mlp_out': {'kernel': v['mlp_out']['kernel'] * 100, 'bias': 0 * v['mlp_out']['bias']},
      }
    elif 'threshold' in v:
      text = np.asarray(
          [[BOS_ID, *b'The cat sat on a mat. def main(x):\n  return x + 1']], np.int32
      )
      found = conftest.jit_call(model.apply, {'params': params}, text, jax.random.PRNGKey(0))
      ent = entropy.next_byte_entropy(found.stages[0].early_logits)
      out[name] = {'threshold': np.median(ent) / entropy.THRESHOLD_SCALE}
  return out


@pytest.mark.parametrize(
    'methods', [('hnet', 'gumbel'), ('whitespace', 'hnet'), ('entropy', 'stride'), ('flat',)]
)
def test_every_exported_method_generates_cached_as_uncached_and_as_tokjax(methods, tmp_path):
  """The export's cached generation from every method it exports (each at stage 0 or 1 of a
  two-stage model, stage 1's settings its own) and from the flat model: the bytes of its uncached
  generation and of tokjax's, its boundaries those of one forward over the final text and of
  tokjax's, at every level varied; and the gate passes with the per-stage settings."""
  if methods == ('flat',):
    c = conftest.tiny_config(str(tmp_path))
    c.model.kind, c.model.num_layers = 'flat', 2
  else:
    c = conftest.tiny_two_stage_config(str(tmp_path))
    c.boundary.method, c.stages.s1.boundary.method = methods
    if methods[1] in NON_DEFAULT:
      c.stages.s1.boundary[methods[1]].update(NON_DEFAULT[methods[1]])
  model, initial = _initialised(c)
  params = _spread(model, initial)
  fields = spec.hf_config(c, levels=stages.resolve(c))
  if methods[-1] in NON_DEFAULT:  # Stage 1's own settings reach the port.
    assert {**fields['stages'][1], **NON_DEFAULT[methods[1]]} == fields['stages'][1]
  found = _gate(c, params, model)
  assert found['given'] <= exporter.TOLERANCE and found['boundary_probs'] <= exporter.TOLERANCE
  model_pt = exporter.torch_model(fields, exporter.torch_state(fields, params))
  ref, cached, uncached, whole = _generations(model, params, model_pt, 24)
  np.testing.assert_array_equal(cached, uncached)
  np.testing.assert_array_equal(cached, ref['tokens'])
  if model.num_stages:
    on_bytes = whole.byte_boundaries.numpy()
    np.testing.assert_array_equal(on_bytes, ref['actions'][:, :, : cached.shape[1]])
    for level in range(2):
      assert 0 < on_bytes[:, level, 1:].mean() < 1, (level, on_bytes[:, level].mean())


def test_generation_benchmark_runs(tmp_path):
  """`python -m tokjax.lab.benchmarks.generation` at a tiny size: its two-stage config builds, every
  path it times generates, --chunk_rate moves the policy's greedy decisions to about that rate in
  tokjax and the export alike (untrained, they close almost no chunk), and --port loads a port."""
  from tokjax.export import modeling_tokjax  # pylint: disable=g-import-not-at-top
  from tokjax.lab.benchmarks import generation  # pylint: disable=g-import-not-at-top

  c = generation.two_stage(conftest.tiny_config(str(tmp_path)))
  found = generation.measure(
      c,
      num_bytes=24,
      batch=1,
      prompt_bytes=3,
      repeats=1,
      chunk_rate=0.5,
      port=modeling_tokjax.__file__,
  )
  speeds = {'tokjax', 'tokjax_uncached', 'pytorch', 'pytorch_uncached'}
  assert set(found) == speeds | {'chunk_rate', 'pytorch_chunk_rate'}
  assert all(found[k] > 0 for k in speeds), found
  assert abs(found['chunk_rate'] - 0.5) < 0.15, found
  assert found['pytorch_chunk_rate'] == found['chunk_rate'], found
  with pytest.raises(UserError, match='--port .*: no such Python file'):
    generation.load_port(str(tmp_path / 'modeling_tokjax.py'))
