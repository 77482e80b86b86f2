"""Orbax checkpoints of a run: the sharded train state, the grain iterator position and the config.

A checkpoint step directory holds `state` (restorable onto any mesh: pass an abstract state whose
leaves carry the target shardings), `data` (the train iterator's state, so a resumed run sees exactly
the batches an uninterrupted run would) and `config` (JSON, so tools can rebuild the model).
Orbax writes each step to a temporary folder and renames it when complete, so an interrupted save
never leaves a half-written step that `latest_step` would pick.
"""

import os

import grain
import ml_collections
import orbax.checkpoint as ocp

from tokjax.errors import UserError


def manager(workdir: str, keep: int = 2, create: bool = True) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, 'checkpoints')),
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create),
  )


def save(mgr, step: int, state, data_iterator, config) -> None:
  items = dict(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config.to_dict()))
  if data_iterator is not None:
    items['data'] = grain.checkpoint.CheckpointSave(data_iterator)
  mgr.save(step, args=ocp.args.Composite(**items))
  mgr.wait_until_finished()


def restore(mgr, abstract_state, data_iterator=None, step=None):
  """Restores (state, step) from `step` (default: latest); advances data_iterator in place."""
  step = mgr.latest_step() if step is None else step
  if step is None:
    raise UserError(f'no checkpoint in {mgr.directory}; train first or drop --resume.')
  items = dict(state=ocp.args.StandardRestore(abstract_state))
  if data_iterator is not None:
    items['data'] = grain.checkpoint.CheckpointRestore(data_iterator)
  restored = mgr.restore(step, args=ocp.args.Composite(**items))
  return restored.state, step


def load_config(checkpoint_dir: str) -> ml_collections.ConfigDict:
  """The config saved with the latest checkpoint under a run folder (or its checkpoints/ folder)."""
  root = checkpoint_dir
  if os.path.isdir(os.path.join(root, 'checkpoints')):
    root = os.path.join(root, 'checkpoints')
  if not os.path.isdir(root):
    raise UserError(
        f'checkpoint folder {checkpoint_dir} does not exist; pass the run folder '
        '(config.train.workdir) of a training run.'
    )
  mgr = ocp.CheckpointManager(
      os.path.abspath(root), options=ocp.CheckpointManagerOptions(read_only=True)
  )
  step = mgr.latest_step()
  if step is None:
    raise UserError(
        f'{checkpoint_dir} holds no complete checkpoint (empty or partly written); '
        'point at a run folder with a finished save.'
    )
  cfg = mgr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config
  return ml_collections.ConfigDict(cfg), mgr, step
