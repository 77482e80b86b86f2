"""`stages.resolve`: one frozen Stage per level, config.stages.sK over the top-level sections, reached
from the command line, and the layer stacks' one settings object."""

import dataclasses
import os

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import pytest

from tokjax import models, stages
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
  assert second.estimator.gamma == c.estimator.gamma and second.estimator.rloo.k == 4
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
  model = models.build_model(c)
  assert model.inner_stack_settings(model.inner_stages[0], 2).num_layers == 2
  assert model.stack_settings('decoder').num_layers == 1


def test_a_methods_own_settings_can_differ_per_stage():
  c = _from_command_line('--config.stages.s1.boundary.policy.window=4')
  config_validation.validate(c)
  first, second = stages.resolve(c)
  assert (first.settings.window, second.settings.window) == (1, 4)
  assert second.where('settings.window') == 'config.stages.s1.boundary.policy.window'
  model = models.build_model(c)
  assert (model.boundary.window, model.inner_stages[0].boundary.window) == (1, 4)
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
  assert [st.capacity for st in stages.resolve(c)] == [32, 16, 4]
  assert models.build_model(c).capacities() == (32, 16, 4)


def test_a_stack_takes_one_settings_object():
  settings = layers.StackSettings(num_layers=2, num_heads=2, mlp_hidden=16, window=4)
  x = jnp.ones((1, 8, 8))
  positions = jnp.arange(8)[None]
  params = nn.unbox(layers.Stack(settings).init(jax.random.PRNGKey(0), x, positions)['params'])
  assert sorted(params) == ['block_0', 'block_1']
  assert params['block_0']['mlp']['gate']['kernel'].shape == (8, 16)
