"""Config files (configs/*.py): their named variants, and loading one by name.

A config file may hold named variants (big_vision style): `get_config(arg)` receives the text after
':' in `--config configs/x.py:NAME`, and its `VARIANTS` dict names them (`parse_variant`). `load`
gives what `--config configs/NAME.py:ARG` gives tokjax.train. configs/ is not a package, so `load`
reads the file by path: call it when a config is needed, never at import time.
"""

import importlib.util
import os

import ml_collections

from tokjax.errors import UserError


def parse_variant(arg, variants, default: str, known=('tiny',)) -> tuple[str, set[str]]:
  """'NAME' or 'NAME,tiny' (the text after ':' in --config FILE:ARG) -> (NAME, {'tiny'}).

  variants: the names the file offers; default: the name when arg is None or empty; known: the
  options the file offers after the name.
  """
  name, *options = (arg or default).split(',')
  if name not in variants:
    raise UserError(f'unknown config variant {name!r}; use one of {",".join(variants)}.')
  unknown = set(options) - set(known)
  if unknown:
    raise UserError(
        f'unknown config option(s) {sorted(unknown)} after {name!r}; use some of {",".join(known)}.'
    )
  return name, set(options)


# The repository's configs/, two folders above this file's package.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS_DIR = os.path.join(REPO, 'configs')


def set_fields(config, fields: dict) -> None:
  """Sets each dotted path of `fields` ({'stages.s1.estimator.lambda_rl': 0.0}) in config, in place;
  a path that names no field raises KeyError (a typo would otherwise add a field nothing reads)."""
  for path, value in fields.items():
    *parents, leaf = path.split('.')
    node = config
    for p in parents:
      node = node[p]
    if leaf not in node:
      raise KeyError(path)
    node[leaf] = value


def load_module(name: str):
  """The module of configs/NAME.py (loaded by path: configs/ is not a package)."""
  path = os.path.join(CONFIGS_DIR, name + '.py')
  spec = importlib.util.spec_from_file_location(f'tokjax_configs_{name}', path)
  # A path ending in .py always gets a spec with a source loader (None is for unknown suffixes).
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """get_config(arg) of configs/NAME.py: what `--config configs/NAME.py:ARG` gives tokjax.train."""
  module = load_module(name)
  return module.get_config() if arg is None else module.get_config(arg)
