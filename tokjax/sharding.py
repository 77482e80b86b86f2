"""The device mesh and how parameters, optimizer state and batches are laid out on it.

Mesh axes: `data` (pure data parallelism), `fsdp` (batch split too, and parameters / optimizer state
sharded), `tensor` (heads and MLP width of the layers). Modules name their parameter axes logically
(`embed`, `heads`, `mlp`, ...); `config.mesh.rules` maps logical names to mesh axes. On one CPU device
the mesh is 1x1x1 and everything is replicated, so the same code path runs everywhere.
"""

import contextlib

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from tokjax.errors import UserError

AXES = ('data', 'fsdp', 'tensor')


def make_mesh(mesh_config, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh; one size may be -1 to take the remaining devices.

  Axes are Auto so that `with_sharding_constraint` and linen's logical constraints work inside jit.
  """
  devices = np.asarray(jax.devices() if devices is None else devices)
  shape = [mesh_config[a] for a in AXES]
  if shape.count(-1) > 1:
    raise UserError('config.mesh: at most one of data/fsdp/tensor may be -1.')
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if devices.size % known:
      raise UserError(f'config.mesh: {devices.size} devices cannot be split into data/fsdp/tensor '
                      f'{shape}; choose sizes whose product divides the device count.')
    shape[shape.index(-1)] = devices.size // known
  if int(np.prod(shape)) != devices.size:
    raise UserError(f'config.mesh: data*fsdp*tensor = {int(np.prod(shape))} but there are '
                    f'{devices.size} devices; make the product equal the device count (or use -1).')
  return Mesh(devices.reshape(shape), AXES, axis_types=(AxisType.Auto,) * len(AXES))


def rules(mesh_config):
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in mesh_config.rules)


@contextlib.contextmanager
def use(mesh: Mesh, mesh_config):
  """Context in which to trace and run sharded code: the mesh and the logical-axis rules."""
  with mesh, nn.logical_axis_rules(rules(mesh_config)):
    yield


def tree_shardings(boxed_abstract_tree, mesh: Mesh, mesh_config):
  """NamedShardings for a tree whose leaves may be `nn.LogicallyPartitioned` boxes (others replicate).

  The result has the structure of the *unboxed* tree.
  """
  specs = nn.get_partition_spec(boxed_abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules(mesh_config))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches [B, L] are split over rows along data and fsdp together."""
  return NamedSharding(mesh, P(('data', 'fsdp'), None))


def global_batch(local_batch, mesh: Mesh):
  """Builds global arrays from this process's rows (all rows when there is one process)."""
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.device_put(local_batch, sharding)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, x), local_batch)
