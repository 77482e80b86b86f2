"""tokjax parameter paths <-> the PyTorch model's parameter names, with the layout change.

Every tokjax leaf maps by name, one rule per kind of leaf (`torch_name`); the names are those of
modeling_tokjax.py's modules. Linear kernels go from flax's [in, out] to PyTorch's [out, in]: the
attention kernels [D, H, K] (query, key, value) and [H, K, D] (out) become [H * K, D] and [D, H * K].
A tokjax leaf without a rule, or a PyTorch parameter that no tokjax leaf fills, is an error
(`UserError` naming the names), never a silent random init.
"""

import re

import numpy as np

from tokjax.errors import UserError
from tokjax.models import layers

_INDEXED = re.compile(
    r'^(block|inner_boundaries|inner_encoders|inner_decoders|inner_early_heads)_(\d+)$'
)
_ATTN = {'query': 'q_proj', 'key': 'k_proj', 'value': 'v_proj', 'out': 'o_proj'}
_MLP = {'gate': 'gate_proj', 'up': 'up_proj', 'down': 'down_proj'}
# Dense biases and the boundary modules' scalars (the policy's bias, the entropy threshold) keep
# their names.
_LEAVES = {
    'kernel': 'weight',
    'embedding': 'weight',
    'bias': 'bias',
    'scale': 'scale',
    'threshold': 'threshold',
}


def flatten(params) -> dict[tuple[str, ...], np.ndarray]:
  """{path: array} of a params tree (scanned stacks unrolled to block_0 .. block_{n-1})."""
  out = {}

  def walk(tree, path):
    if isinstance(tree, dict) or hasattr(tree, 'items'):
      for k, v in tree.items():
        walk(v, path + (str(k),))
    else:
      out[path] = np.asarray(tree, np.float32)

  walk(layers.unscan_params(dict(params)), ())
  return out


def torch_name(path: tuple[str, ...]) -> str:
  """The PyTorch parameter name of tokjax leaf `path`, or UserError when no rule covers it."""
  parts = []
  for i, p in enumerate(path[:-1]):
    m = _INDEXED.match(p)
    if m:
      parts += ['blocks' if m.group(1) == 'block' else m.group(1), m.group(2)]
    elif i and path[i - 1] == 'attn' and p in _ATTN:
      parts.append(_ATTN[p])
    elif i and path[i - 1] == 'mlp' and p in _MLP:
      parts.append(_MLP[p])
    else:
      parts.append(p)
  leaf = path[-1]
  if leaf in _LEAVES:
    parts.append(_LEAVES[leaf])
  else:
    raise UserError(
        f'tokjax parameter {"/".join(path)} has no PyTorch name; this version of the exporter '
        'cannot export it.'
    )
  return '.'.join(parts)


def to_torch(path: tuple[str, ...], x: np.ndarray) -> np.ndarray:
  """A tokjax leaf in PyTorch layout: kernels [out, in]."""
  if path[-1] != 'kernel':
    return x
  if x.ndim == 3 and len(path) >= 3 and path[-3] == 'attn':
    if path[-2] == 'out':  # [H, K, D] -> [D, H * K]
      return np.ascontiguousarray(x.reshape(-1, x.shape[-1]).T)
    return np.ascontiguousarray(x.reshape(x.shape[0], -1).T)  # [D, H, K] -> [H * K, D]
  return np.ascontiguousarray(x.T)


def from_torch(path: tuple[str, ...], x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """The inverse of `to_torch` onto the tokjax leaf's shape."""
  if path[-1] == 'kernel':
    x = x.T
  return np.array(x.reshape(shape), order='C')  # ascontiguousarray would make a scalar 1-d.


def to_torch_state(params, expected: dict[str, tuple]) -> dict[str, np.ndarray]:
  """{PyTorch name: array} of tokjax params, checked against the PyTorch model's parameters
  `expected` ({name: shape}): every leaf named, every name filled, every shape equal."""
  state = {}
  for path, x in flatten(params).items():
    name = torch_name(path)
    if name in state:
      raise UserError(f'two tokjax parameters map to {name}; the exporter cannot tell them apart.')
    state[name] = to_torch(path, x)
  check_names(set(state), set(expected), 'the tokjax checkpoint', 'the PyTorch model')
  for name, x in state.items():
    if tuple(x.shape) != tuple(expected[name]):
      raise UserError(
          f'parameter {name} has shape {tuple(x.shape)} in the checkpoint and '
          f'{tuple(expected[name])} in the PyTorch model; the config does not describe these weights.'
      )
  return state


def check_names(have: set, want: set, have_what: str, want_what: str) -> None:
  """UserError naming the parameters only one side has."""
  unused, missing = sorted(have - want), sorted(want - have)
  if unused or missing:
    parts = []
    if unused:
      parts.append(f'{len(unused)} in {have_what} unused by {want_what} ({", ".join(unused[:5])})')
    if missing:
      parts.append(
          f'{len(missing)} of {want_what} missing from {have_what} ({", ".join(missing[:5])})'
      )
    raise UserError('parameter names do not match: ' + '; '.join(parts) + '.')
