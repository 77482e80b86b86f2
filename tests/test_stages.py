"""`stages.resolve`: one frozen Stage per level, config.stages.sK over the top-level sections, reached
from the command line, and the layer stacks' one settings object."""

import ast
import dataclasses
import os
import pathlib

from absl import flags
from conftest import tiny_two_stage_config
import flax.linen as nn
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import pytest

from tokjax import compile_check, models, sharding, stages
from tokjax import trainer as trainer_lib
from tokjax.config import defaults as config_defaults
from tokjax.config import files as config_files
from tokjax.config import validation as config_validation
from tokjax.errors import UserError
from tokjax.models import layers

TWO_STAGE = os.path.join(config_files.CONFIGS_DIR, 'two_stage.py')


def _from_command_line(*overrides):
  """What `python -m tokjax.train --config configs/two_stage.py:learned,tiny OVERRIDES` reads."""
  argv = ['train', f'--config={TWO_STAGE}:learned,tiny', *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, flag_values=values, sys_argv=argv)
  values(argv)
  return values.config


def test_resolve_gives_every_level_bytes_included_with_the_top_level_inherited():
  c = config_files.load('two_stage', 'learned,tiny')
  first, second = stages.resolve(c)
  assert (first.level, second.level) == (0, 1)
  # Stage 0 is the top level's.
  assert (first.method, first.target_rate, first.capacity) == (
      c.boundary.method,
      c.boundary.target_rate,
      c.model.capacity,
  )
  assert (first.window, first.encoder_layers) == (c.model.byte_window, c.model.encoder_layers)
  assert first.estimator.gamma == c.estimator.gamma and first.estimator.target_rate == 0.2
  # Stage 1 sets its rate and buffer; the rest is inherited.
  assert (second.target_rate, second.capacity) == (0.33, c.stages.s1.model.capacity)
  assert second.estimator.target_rate == 0.33
  assert second.window == c.model.byte_window and second.decoder_layers == c.model.decoder_layers
  assert second.settings == first.settings == dict(c.boundary.policy)
  assert second.estimator.gamma == c.estimator.gamma and second.estimator.baselines['rloo'].k == 4
  assert second.where('capacity') == 'config.stages.s1.model.capacity'
  assert second.where('window') == 'config.model.byte_window'
  assert second.where('estimator.gamma') == 'config.estimator.gamma'
  with pytest.raises(dataclasses.FrozenInstanceError):
    second.capacity = 3  # pytype: disable=not-writable


def test_a_second_stage_from_the_command_line_alone_copies_the_first():
  c = config_defaults.base_config()
  c.model.stages = 2
  config_validation.validate(c)
  first, second = stages.resolve(c)
  assert dataclasses.replace(second, level=0, sources=first.sources) == first


def test_a_per_stage_override_on_the_command_line_reaches_that_stage_alone():
  c = _from_command_line(
      '--config.stages.s1.estimator.gamma=0.9',
      '--config.stages.s1.boundary.target_rate=0.4',
      '--config.stages.s1.model.decoder_layers=2',
  )
  config_validation.validate(c)
  first, second = stages.resolve(c)
  assert (second.estimator.gamma, second.target_rate, second.decoder_layers) == (0.9, 0.4, 2)
  assert (first.estimator.gamma, first.target_rate, first.decoder_layers) == (0.99, 0.2, 1)
  assert second.where('estimator.gamma') == 'config.stages.s1.estimator.gamma'
  # The model reads it: stage 1's decoder has two blocks, stage 0's byte decoder one.
  model = models.build_model(c, levels=(first, second))
  assert model.stack_settings('decoder', 1).num_layers == 2
  assert model.stack_settings('decoder').num_layers == 1


def test_a_methods_own_settings_can_differ_per_stage():
  c = _from_command_line('--config.stages.s1.boundary.policy.window=4')
  config_validation.validate(c)
  first, second = stages.resolve(c)
  assert (first.settings.window, second.settings.window) == (1, 4)
  assert second.where('settings.window') == 'config.stages.s1.boundary.policy.window'
  model = models.build_model(c, levels=(first, second))
  assert tuple(lv.boundary.window for lv in model.levels) == (1, 4)
  # Each stage's policy has the parameters of its own window.
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), *models.init_args(c, 2, 64))
  shapes = lambda name: jax.tree.map(lambda x: x.shape, nn.unbox(params['params'][name]))
  assert shapes('boundary') != shapes('inner_boundaries_0')


def test_a_bad_override_from_the_command_line_is_one_line_naming_it():
  c = _from_command_line('--config.stages.s1.model.capacity=1')
  with pytest.raises(UserError) as e:
    config_validation.validate(c)
  assert str(e.value).startswith('config.stages.s1.model.capacity=1 must be an integer >= 2')
  assert '\n' not in str(e.value)
  with pytest.raises(Exception, match='capacity'):  # A string where an int goes: flags refuse it.
    _from_command_line('--config.stages.s1.model.capacity=many')


def test_a_third_stage_is_one_more_section():
  c = config_files.load('two_stage', 'learned,tiny')
  c.model.stages = 3
  c.stages.s2 = config_defaults.stage_section()
  c.stages.s2.model.capacity = 4
  config_validation.validate(c)
  levels = stages.resolve(c)
  assert [st.capacity for st in levels] == [32, 16, 4]
  assert models.build_model(c, levels=levels).capacities() == (32, 16, 4)


def test_a_stack_takes_one_settings_object():
  settings = layers.StackSettings(num_layers=2, num_heads=2, mlp_hidden=16, window=4)
  x = jnp.ones((1, 8, 8))
  positions = jnp.arange(8)[None]
  params = nn.unbox(layers.Stack(settings).init(jax.random.PRNGKey(0), x, positions)['params'])
  assert sorted(params) == ['block_0', 'block_1']
  assert params['block_0']['mlp']['gate']['kernel'].shape == (8, 16)


# Names that hold a config in the library (a run's is `X.config`).
_CONFIG_NAMES = ('config', 'cfg', 'c', 'saved')


def _stage_reads(source: str):
  """(line, expression) of each read of a per-stage field (`stages.PER_STAGE`) from a config, not
  from its resolved stages: CONFIG.SECTION.FIELD, or NAME.FIELD where NAME = CONFIG.SECTION."""
  fields = set(stages.PER_STAGE.values())
  sections = {s for s, _ in fields}

  def is_config(node):
    return (isinstance(node, ast.Name) and node.id in _CONFIG_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr == 'config'
    )

  tree = ast.parse(source)
  aliases = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign):
      for target in node.targets:
        pairs = [(target, node.value)]
        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
          pairs = list(zip(target.elts, node.value.elts))
        for name, value in pairs:
          if (
              isinstance(name, ast.Name)
              and isinstance(value, ast.Attribute)
              and value.attr in sections
              and is_config(value.value)
          ):
            aliases.add((name.id, value.attr))
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
      continue
    inner = node.value
    if isinstance(inner, ast.Attribute) and (inner.attr, node.attr) in fields:
      if is_config(inner.value):
        yield node.lineno, ast.unparse(node)
    if isinstance(inner, ast.Name) and any(
        (inner.id, s) in aliases and (s, node.attr) in fields for s in sections
    ):
      yield node.lineno, ast.unparse(node)


def test_no_library_module_reads_a_stage_setting_from_the_config():
  # The check itself finds both forms.
  snippet = 'm, seq = config.model, 1\nx = m.byte_window + ckpt.config.boundary.target_rate\n'
  assert [e for _, e in _stage_reads(snippet)] == [
      'm.byte_window',
      'ckpt.config.boundary.target_rate',
  ]
  assert not list(_stage_reads('x = stages.get(config, 0).window + st.estimator.gamma\n'))
  package = pathlib.Path(stages.__file__).parent
  found = [
      f'{path.relative_to(package.parent)}:{line}: {expression}'
      for path in sorted(package.rglob('*.py'))
      # The resolver, and the config package that declares, migrates and validates the fields.
      if path.name != 'stages.py' and 'config' not in path.relative_to(package).parts[:-1]
      # The lab builds configs (and may read what it sets); the library reads resolved stages.
      and 'lab' not in path.relative_to(package).parts
      for line, expression in _stage_reads(path.read_text())
  ]
  assert not found, found


# The most positional parameters (self and cls not counted) a library function may take; settings
# after the leading arguments go after a bare `*`.
_MAX_POSITIONAL = 6

# Signatures whose positional parameters a framework or a shared convention fixes, by (module path
# under tokjax/, function name).
_POSITIONAL_EXEMPT = {
    # transformers instantiates configurations by its own conventions (from_dict, save/load).
    ('export/configuration_tokjax.py', '__init__'): 'the transformers PretrainedConfig __init__',
    # torch calls module(...) with the arguments given; transformers passes forward's by its names
    # and positions (generate, the pipelines).
    ('export/modeling_tokjax.py', 'forward'): 'torch nn.Module / transformers forward',
    # Every boundary method shares __call__(h, key, mode, actions, tokens, early_logits, ...); the
    # models call it with h and key positionally.
    ('models/boundaries.py', '__call__'): "the boundary methods' shared call convention",
}


def _long_positional_signatures(source: str):
  """(line, name, count) of each function taking more than _MAX_POSITIONAL positional parameters."""
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      names = [a.arg for a in node.args.posonlyargs + node.args.args]
      if names[:1] in (['self'], ['cls']):
        names = names[1:]
      if len(names) > _MAX_POSITIONAL:
        yield node.lineno, node.name, len(names)


def test_no_library_function_takes_more_than_six_positional_parameters():
  # The check itself counts positional parameters only, self aside.
  snippet = (
      'def f(a, b, c, d, e, f, g): pass\n'
      'def g(a, b, c, d, e, f, *, g, h): pass\n'
      'class C:\n  def m(self, a, b, c, d, e, f): pass\n'
  )
  assert list(_long_positional_signatures(snippet)) == [(1, 'f', 7)]
  package = pathlib.Path(stages.__file__).parent
  found = []
  for path in sorted(package.rglob('*.py')):
    rel = path.relative_to(package)
    if 'lab' in rel.parts:  # The lab's scripts are not the library.
      continue
    for line, name, count in _long_positional_signatures(path.read_text()):
      if (rel.as_posix(), name) not in _POSITIONAL_EXEMPT:
        found.append(f'tokjax/{rel.as_posix()}:{line}: {name} takes {count} positional parameters')
  assert not found, found


# The entry points where a config's stages are resolved, each once; every other library module takes
# the levels they pass down (`levels=`, or one `stages.Stage`).
_DOORS = {
    'config/validation.py': 'validate checks the levels it resolves and returns them to its caller',
    'trainer.py': 'a Trainer whose caller passes no levels (a test, a lab script) resolves its own',
    'sample.py': "refuses a look-ahead method from the run's saved config before it opens the run",
    'export/exporter.py': 'refuses an unexportable method likewise, before it opens the run',
    'resuming.py': "a resumed run's saved config, compared with the levels of the resuming one",
}


def _resolutions(source: str):
  """(line, callee) of each call of `stages.resolve` or `stages.get`, however tokjax.stages is
  imported."""
  tree = ast.parse(source)
  modules, functions = {'tokjax.stages'}, set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module == 'tokjax':
      modules |= {a.asname or a.name for a in node.names if a.name == 'stages'}
    elif isinstance(node, ast.ImportFrom) and node.module == 'tokjax.stages':
      functions |= {a.asname or a.name for a in node.names if a.name in ('resolve', 'get')}
    elif isinstance(node, ast.Import):
      modules |= {a.asname for a in node.names if a.name == 'tokjax.stages' and a.asname}
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    f = node.func
    called = isinstance(f, ast.Attribute) and f.attr in ('resolve', 'get')
    if (called and ast.unparse(f.value) in modules) or (
        isinstance(f, ast.Name) and f.id in functions
    ):
      yield node.lineno, ast.unparse(f)


def test_only_the_entry_points_resolve_the_stages():
  # The check itself finds every form of the call, and no other `get`.
  snippet = (
      'from tokjax import stages as s\nfrom tokjax.stages import get\nimport tokjax.stages\n'
      'a = s.resolve(c)\nb = get(c, 0)\nd = tokjax.stages.get(c, 1)\ne = config.get("x")\n'
  )
  assert [e for _, e in _resolutions(snippet)] == ['s.resolve', 'get', 'tokjax.stages.get']
  package = pathlib.Path(stages.__file__).parent
  found = []
  for path in sorted(package.rglob('*.py')):
    rel = path.relative_to(package)
    # The resolver itself, and the lab's scripts, which are entry points of their own.
    if rel.as_posix() in _DOORS or path.name == 'stages.py' or 'lab' in rel.parts:
      continue
    found += [f'tokjax/{rel.as_posix()}:{n}: {e}' for n, e in _resolutions(path.read_text())]
  assert not found, found
  # Each door still resolves (the table names no module that has stopped).
  assert all(list(_resolutions((package / door).read_text())) for door in _DOORS)


def test_the_trainer_resolves_the_stages_once_for_its_model_and_steps(resolutions):
  c = tiny_two_stage_config('unused')
  mesh = sharding.make_mesh(c.mesh)
  batch, key = compile_check.abstract_inputs(c, mesh)

  def build_and_trace(**levels):
    trainer = trainer_lib.Trainer(c, mesh, **levels)
    # Tracing runs every Python line of the train and eval steps (the objectives included).
    trainer.lower_train_step(trainer.abstract_state, batch, key)
    for mode in trainer.model.boundary_modes:
      trainer.lower_eval_step(trainer.abstract_state.params, batch, key, mode)

  build_and_trace()
  assert len(resolutions) == 1
  # As `python -m tokjax.train` does: validation resolves, and the Trainer takes its levels.
  resolutions.clear()
  build_and_trace(levels=config_validation.validate(c))
  assert len(resolutions) == 1
