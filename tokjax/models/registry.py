"""The registry of boundary methods: one declaration per method, read by configs, models, commands.

A method is declared next to its module with `register(BoundaryMethod(...))`; the learned policy in
boundaries.py, every rival in a module of the `tokjax.models.rivals` package. `methods()` imports
boundaries.py and every module of that package once, so adding a method is one new file under
tokjax/models/rivals/ (plus its test): its settings appear as `config.boundary.NAME.*` (from
`defaults`), `--config.boundary.method=NAME` builds it, `python -m tokjax.lab.compare` and
`configs/compare.py:NAME` train it, and tests/test_rivals.py checks it. See README, "Extending tokjax".
"""

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable

from tokjax.errors import UserError


@dataclasses.dataclass(frozen=True)
class BoundaryMethod:
  """One boundary method.

  name: the value of config.boundary.method.
  build: (stage, config) -> the flax module of one stage (called as `module(h, key, mode, actions,
    tokens, early_logits)`, returning `boundaries.Boundaries`). stage: a `tokjax.stages.Stage`, which
    holds the method's own settings as that stage reads them (`stage.settings.FIELD`: config.boundary.
    NAME.FIELD, or config.stages.sK.boundary.NAME.FIELD where stage K sets it), its target_rate and
    capacity; config: the rest (model width, data).
  defaults: the fields of config.boundary.NAME with their defaults ({} = no settings).
  score_function: trained by the score-function (policy-gradient) estimator of config.estimator; a
    method without it gets no policy gradient and no rate loss from the estimator (its own rate
    control, if any, is `Boundaries.aux_loss`).
  sampling: mode 'sample' draws boundaries at random (else 'sample' and 'greedy' are the same rule).
  inner_stages: it can also draw boundaries over the chunks of a stage below (stages.sK.boundary.method):
    it reads only its input states h and, as `tokens`, the byte at each input position's end.
  lookahead: its boundary at position t depends on bytes after t (e.g. the token starts of a whole
    window's BPE tokenization). Generation refuses such a method (those bytes do not exist yet), and
    tests/test_rivals.py requires every other method's boundaries at t to be unchanged by later bytes
    and this one's to change on real text.
  description: one line for listings (--methods help, configs/compare.py, README).
  validate: optional stage -> None that raises UserError for bad settings of this method at that
    stage, naming the field by `stage.where('settings.FIELD')`.
  """

  name: str
  build: Callable[[Any, Any], Any]
  defaults: dict = dataclasses.field(default_factory=dict)
  score_function: bool = False
  sampling: bool = False
  inner_stages: bool = False
  lookahead: bool = False
  description: str = ''
  validate: Callable[[Any], None] | None = None


_METHODS: dict[str, BoundaryMethod] = {}
_DISCOVERED: list[bool] = (
    []
)  # One element once the built-in modules are imported (a flag without `global`).


def register(method: BoundaryMethod) -> BoundaryMethod:
  """Adds a method (a method already registered under that name is replaced by the new one)."""
  if method.name in ('flat', ''):
    raise ValueError(f'{method.name!r} cannot name a boundary method')
  _METHODS[method.name] = method
  return method


# The modules that declare the built-in methods, loaded by name the first time the registry is read:
# they import this module to declare their methods, so it must not import them. boundaries.py comes
# first, so that 'policy' is the first method; then every module of the rivals package.
_BUILTIN_MODULES = ('tokjax.models.boundaries',)
_RIVALS_PACKAGE = 'tokjax.models.rivals'


def _discover() -> None:
  if _DISCOVERED:
    return
  _DISCOVERED.append(True)
  for name in _BUILTIN_MODULES:
    importlib.import_module(name)
  rivals = importlib.import_module(_RIVALS_PACKAGE)
  for info in sorted(pkgutil.iter_modules(rivals.__path__), key=lambda i: i.name):
    importlib.import_module(f'{_RIVALS_PACKAGE}.{info.name}')


def methods() -> dict[str, BoundaryMethod]:
  """Every registered method by name: 'policy' first, then the rivals by module name."""
  _discover()
  return dict(_METHODS)


def get(name: str) -> BoundaryMethod:
  """The method called `name`, or a UserError listing the registered ones."""
  found = methods().get(name)
  if found is None:
    raise UserError(
        f'config.boundary.method={name!r} is not a registered boundary method; use one of '
        f'{tuple(methods())}.'
        ' A method defined in your own file is registered when that file is imported.'
    )
  return found


def unregister(name: str) -> None:
  """Removes a method added with `register` (for notebooks and tests that add one for a while)."""
  _METHODS.pop(name, None)
