"""The device mesh and how parameters, optimizer state and batches are laid out on it.

Mesh axes: `data` (pure data parallelism), `fsdp` (batch split too, and parameters / optimizer state
sharded), `tensor` (heads and MLP width of the layers). Modules name their parameter axes logically
(`embed`, `heads`, `mlp`, ...); `config.mesh.rules` maps logical names to mesh axes. On one CPU device
the mesh is 1x1x1 and everything is replicated, so the same code path runs everywhere.

Batches are split by rows over `data` and `fsdp` together. With several processes (hosts), each
process reads its own rows of every training batch (`global_batch`), while eval batches are built
identically on every process and each process contributes the rows its devices hold
(`global_batch_from_global`).
"""

import contextlib
from typing import cast

from absl import logging
import flax.linen as nn
import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from tokjax.errors import UserError

AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) sizes for `num_devices`, with a -1 entry resolved to the remaining devices."""
  shape = [int(mesh_config[a]) for a in AXES]
  if shape.count(-1) > 1:
    raise UserError('config.mesh: at most one of data/fsdp/tensor may be -1.')
  if any(s == 0 or s < -1 for s in shape):
    raise UserError(f'config.mesh: sizes {dict(zip(AXES, shape))} must be positive (or one -1).')
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if num_devices % known:
      raise UserError(
          f'config.mesh: {num_devices} devices cannot be split into data/fsdp/tensor '
          f'{shape}; choose sizes whose product divides the device count.'
      )
    shape[shape.index(-1)] = num_devices // known
  if int(np.prod(shape)) != num_devices:
    raise UserError(
        f'config.mesh: data*fsdp*tensor = {int(np.prod(shape))} but there are '
        f'{num_devices} devices; make the product equal the device count (or use -1).'
    )
  return cast(tuple[int, int, int], tuple(shape))  # One size per name in AXES.


def make_mesh(mesh_config, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh; one size may be -1 to take the remaining devices.

  Axes are Auto so that `with_sharding_constraint` and linen's logical constraints work inside jit.
  With all devices (devices=None) the order comes from `jax.make_mesh`, which places the innermost
  axes (tensor, then fsdp) on the fastest links of a TPU slice or GPU node.
  """
  all_devices = devices is None
  devices = np.asarray(jax.devices() if all_devices else devices)
  shape = mesh_shape(mesh_config, devices.size)
  axis_types = (AxisType.Auto,) * len(AXES)
  if all_devices:
    return jax.make_mesh(shape, AXES, axis_types=axis_types)
  return Mesh(devices.reshape(shape), AXES, axis_types=axis_types)


def rules(mesh_config):
  return tuple(
      (name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in mesh_config.rules
  )


@contextlib.contextmanager
def use(mesh: Mesh, mesh_config):
  """Context in which to trace and run sharded code: the mesh and the logical-axis rules.

  `jax.set_mesh` (not the deprecated `with mesh:`) also sets the abstract mesh that linen's logical
  constraints read, so `nn.with_logical_constraint` takes effect inside jit.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules(mesh_config)):
    yield


def _axis_size(mesh: Mesh, entry) -> int:
  if entry is None:
    return 1
  names = entry if isinstance(entry, tuple) else (entry,)
  return int(np.prod([mesh.shape[n] for n in names]))


def fit_spec(spec: P, shape, mesh: Mesh) -> P:
  """`spec` with every dimension that its mesh axes do not divide evenly replicated instead.

  Small odd-sized dimensions (the 258-entry byte vocabulary under tensor=4, a 1-wide policy
  projection) then simply replicate, rather than failing to compile.
  """
  entries = list(spec) + [None] * (len(shape) - len(spec))
  return P(*[e if dim % _axis_size(mesh, e) == 0 else None for e, dim in zip(entries, shape)])


def tree_shardings(boxed_abstract_tree, mesh: Mesh, mesh_config):
  """NamedShardings for a tree whose leaves may be `nn.LogicallyPartitioned` boxes (others replicate).

  The result has the structure of the *unboxed* tree. A dimension that its mesh axes do not divide
  is replicated (logged once per call), so any mesh shape that fits the device count works.
  """
  specs = nn.get_partition_spec(boxed_abstract_tree)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, rules(mesh_config))
  # The boxes' values, not nn.unbox: under a set mesh unboxing applies the logical constraint, which
  # has no meaning for abstract shapes.
  boxed = lambda x: isinstance(x, nn.meta.AxisMetadata)
  shapes = jax.tree.map(lambda x: x.value if boxed(x) else x, boxed_abstract_tree, is_leaf=boxed)
  replicated = []

  def fit(path, sharding, leaf):
    spec = fit_spec(sharding.spec, leaf.shape, mesh)
    if spec != sharding.spec:
      replicated.append(f'{jax.tree_util.keystr(path)} {tuple(leaf.shape)} {sharding.spec}')
    return NamedSharding(mesh, spec)

  out = jax.tree_util.tree_map_with_path(fit, shardings, shapes)
  if replicated:
    logging.warning(
        'sharding: %d array dimension(s) not divisible by their mesh axes are replicated '
        'instead, e.g. %s',
        len(replicated),
        replicated[0],
    )
  return out


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches [B, L] are split over rows along data and fsdp together."""
  return NamedSharding(mesh, P(BATCH_AXES, None))


def _check_rows(global_rows: int, mesh: Mesh) -> None:
  shards = _axis_size(mesh, BATCH_AXES)
  if global_rows % shards:
    raise UserError(
        f'the batch has {global_rows} rows, which the mesh cannot split into data*fsdp = '
        f'{shards} equal shards; make config.data.batch_size and config.eval.batch_size '
        f'multiples of {shards} (or change config.mesh).'
    )


def global_batch(local_batch, mesh: Mesh):
  """Global arrays from this process's rows (all rows when there is one process).

  local_batch: dict of [B / process_count, ...] numpy arrays, the rows this process read (the grain
  train iterator gives process p the contiguous block p of each batch). The global batch is their
  concatenation in process order: the rows one process would have read, in the same order.
  """
  sharding = batch_sharding(mesh)
  rows = next(iter(jax.tree.leaves(local_batch))).shape[0]
  _check_rows(rows * jax.process_count(), mesh)
  if jax.process_count() == 1:
    return jax.device_put(local_batch, sharding)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), local_batch)


def global_batch_from_global(batch, mesh: Mesh):
  """Global arrays from a batch that every process holds in full (eval batches).

  batch: dict of [B, ...] numpy arrays, identical on every process. Each process places only the rows
  its own devices hold, so the result is the same global batch on one host or many.
  """
  sharding = batch_sharding(mesh)
  _check_rows(next(iter(jax.tree.leaves(batch))).shape[0], mesh)
  if jax.process_count() == 1:
    return jax.device_put(batch, sharding)
  return jax.tree.map(
      lambda x: jax.make_array_from_callback(x.shape, sharding, lambda index: x[index]), batch
  )
