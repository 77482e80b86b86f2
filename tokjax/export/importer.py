"""An export folder back into a tokjax run (see `tokjax.export`).

  python -m tokjax.export --import DIR --out RUN

`import_export(folder, out)` reads the training config from config.json's `tokjax` section (laid onto
this version's fields, as every saved config is read), maps every weight of model.safetensors back to
its tokjax parameter (`mapping`, inverted) and writes RUN as `python -m tokjax.train` would have left
it at the exported step: an orbax checkpoint with the train state, the data iterator's position and
the config, and config.py (the config as a config file, for --config), so `python -m tokjax.evaluate --checkpoint RUN` and a resumed `python -m tokjax.train`
read it. The export holds no optimizer state: the moments start at zero (Adam's own step count at 0,
so its bias correction is that of a fresh run), while the learning-rate schedule goes on from the
exported step. The run is written beside RUN and renamed into place when complete.
"""

import json
import os
import shutil

import numpy as np

from tokjax.errors import UserError
from tokjax.export import mapping, spec


def _not_export(folder: str, why: str) -> UserError:
  return UserError(
      f'{folder} is not a tokjax export ({why}); pass a folder written by '
      '`python -m tokjax.export --checkpoint RUN --out DIR`.'
  )


def read_export(folder: str) -> tuple[dict, str]:
  """(config.json as a dict, the path of model.safetensors) of an export folder, or UserError."""
  if not os.path.isdir(folder):
    raise _not_export(folder, 'no such folder')
  path = os.path.join(folder, 'config.json')
  if not os.path.isfile(path):
    raise _not_export(folder, 'it has no config.json')
  try:
    with open(path) as f:
      fields = json.load(f)
  except (OSError, ValueError) as e:
    raise _not_export(folder, f'its config.json does not read as JSON: {e}') from None
  if not isinstance(fields, dict) or fields.get('model_type') != 'tokjax':
    raise _not_export(folder, "its config.json has no model_type 'tokjax'")
  provenance = fields.get('tokjax')
  if not isinstance(provenance, dict) or not isinstance(provenance.get('config'), dict):
    raise _not_export(folder, "its config.json has no 'tokjax' section with the training config")
  if not isinstance(provenance.get('step'), int):
    raise _not_export(folder, "its config.json's 'tokjax' section has no step")
  weights = os.path.join(folder, 'model.safetensors')
  if not os.path.isfile(weights):
    raise _not_export(folder, 'it has no model.safetensors')
  return fields, weights


def training_config(fields: dict, out: str):
  """The training config of config.json's `tokjax` section in this version's fields, writing to
  `out`; UserError when the model fields of config.json are not those the config describes (an
  edited folder)."""
  from tokjax import checkpointing  # pylint: disable=g-import-not-at-top
  from tokjax.config import saved as config_saved  # pylint: disable=g-import-not-at-top
  from tokjax.config import validation  # pylint: disable=g-import-not-at-top

  config = config_saved.upgrade(checkpointing.drop_foreign_sections(fields['tokjax']['config']))
  config.train.workdir = os.path.abspath(out)
  levels = validation.validate(config)
  spec.check_exportable(config, levels=levels)
  described = json.loads(json.dumps(spec.hf_config(config, levels=levels)))
  differ = sorted(k for k, v in described.items() if fields.get(k) != v)
  if differ:
    raise UserError(
        f"config.json's model fields {differ} are not those its tokjax.config describes in this "
        'version of tokjax (the folder was edited, or written by another version): export the run '
        'again with this version.'
    )
  return config


def tokjax_params(abstract_params, tensors: dict):
  """The params tree of abstract_params' structure (scanned or not) filled from {PyTorch name:
  array}: every tokjax leaf filled, every tensor used, every shape equal, or UserError."""
  import jax  # pylint: disable=g-import-not-at-top

  from tokjax.models import layers  # pylint: disable=g-import-not-at-top

  zeros = {'params': _zeros(abstract_params)}
  unrolled = layers.unscan_params(zeros)['params']
  leaves = mapping.flatten(unrolled)
  names = {mapping.torch_name(path): path for path in leaves}
  mapping.check_names(set(tensors), set(names), 'the export', 'the tokjax model')
  filled = {}
  for name, path in names.items():
    want = leaves[path].shape
    x = tensors[name]
    layout = mapping.to_torch(path, leaves[path]).shape
    if tuple(x.shape) != tuple(layout):
      raise UserError(
          f'parameter {name} has shape {tuple(x.shape)} in the export and the tokjax model needs '
          f'{tuple(layout)}; the config does not describe these weights.'
      )
    filled[path] = mapping.from_torch(path, np.asarray(x, np.float32), want)
  tree = _unflatten(filled)
  tree = layers.scan_params(tree) if _is_scanned(abstract_params, unrolled) else tree
  shapes = lambda t: jax.tree.map(lambda x: tuple(x.shape), t)
  if shapes(tree) != shapes(abstract_params):  # A bug of the importer, not of the folder.
    raise UserError('the imported parameters do not fit the tokjax model; please report it.')
  return tree


def _zeros(tree):
  if isinstance(tree, dict) or hasattr(tree, 'items'):
    return {k: _zeros(v) for k, v in tree.items()}
  return np.zeros(tree.shape, np.float32)


def _is_scanned(abstract_params, unrolled) -> bool:
  import jax  # pylint: disable=g-import-not-at-top

  # jax annotates structure() with an alias of PyTreeDef that mypy cannot resolve as a class.
  model_structure: object = jax.tree.structure(_zeros(abstract_params))
  return model_structure != jax.tree.structure(unrolled)


def _unflatten(leaves: dict) -> dict:
  tree: dict = {}
  for path, x in leaves.items():
    node = tree
    for p in path[:-1]:
      node = node.setdefault(p, {})
    node[path[-1]] = x
  return tree


def fresh_state(trainer, params, step: int):
  """The train state at `step` with params: optimizer moments at zero and Adam's count at 0 (a fresh
  optimizer's bias correction), the learning-rate schedule's count at `step` (the rate goes on where
  the exported run left it)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  state = trainer.init(jax.random.PRNGKey(0))
  params = jax.tree.map(
      lambda x, a: jax.device_put(jnp.asarray(x, a.dtype), a.sharding),
      params,
      trainer.abstract_state.params,
  )
  is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
  opt_state = jax.tree.map(
      lambda s: s._replace(count=jnp.full_like(s.count, step)) if is_schedule(s) else s,
      state.opt_state,
      is_leaf=is_schedule,
  )
  return state.replace(step=jnp.full_like(state.step, step), params=params, opt_state=opt_state)


def config_file(config) -> str:
  """A config file (`--config RUN/config.py`) that gives `config` back: the resumed run's config
  must build the state the checkpoint holds, and the exported run's own file may be elsewhere."""
  text = json.dumps(config.to_dict(), default=list, indent=1)
  return f'''"""The training config of a run imported from an export folder (python -m tokjax.export
--import), for `python -m tokjax.train --config THIS_FILE --resume`."""

import json

from tokjax.config import saved

CONFIG = json.loads({text!r})


def get_config():
  return saved.upgrade(CONFIG)
'''


def import_export(folder: str, out: str) -> dict:
  """Writes the run `out` of export folder `folder` (see the module docstring); returns {'step',
  'config'}."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  from tokjax import checkpointing, inspection  # pylint: disable=g-import-not-at-top
  from tokjax import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from tokjax.data import pipeline  # pylint: disable=g-import-not-at-top
  from tokjax.export import exporter  # pylint: disable=g-import-not-at-top

  exporter.check_out(out)
  fields, weights = read_export(folder)
  step = int(fields['tokjax']['step'])
  config = training_config(fields, out)
  try:
    tensors = load_file(weights)
  except Exception as e:  # pylint: disable=broad-except
    # safetensors raises its own error types for truncated or foreign files.
    raise _not_export(folder, f'its model.safetensors does not load: {e}') from None
  trainer = trainer_lib.Trainer(config, inspection.inspection_mesh(config))
  params = tokjax_params(trainer.abstract_state.params, tensors)
  state = fresh_state(trainer, params, step)
  data = pipeline.build_data(config)  # The corpus must be here: a resumed run reads it.
  position = data.train_iter.get_state()
  if 'next_index' in position:  # The batches the run would have read next.
    data.train_iter.set_state(dict(position, next_index=step))
  out = os.path.abspath(out)
  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f'.{os.path.basename(out)}.partial-{os.getpid()}')
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    mgr = checkpointing.manager(tmp, config.train.keep_checkpoints)
    checkpointing.save(mgr, step, state, data.train_iter, config)
    mgr.close()
    with open(os.path.join(tmp, 'config.py'), 'w') as f:
      f.write(config_file(config))
    if os.path.isdir(out):
      os.rmdir(out)  # Empty (check_out).
    os.replace(tmp, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return {'step': step, 'config': config}
