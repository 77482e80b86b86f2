"""Shared pytest fixtures, and a persistent XLA compilation cache for the suite.

Most of the suite's time is XLA compiling the same tiny train and eval steps in many tests (and in
the subprocesses some tests start); a file cache shared by them all, subprocesses included through
the environment, compiles each once. It keeps every program, however quick to compile: a run's
hundreds of small ones (data, metrics, checkpoint restore) recur in every subprocess. It changes no
result.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

os.environ.setdefault(
    'JAX_COMPILATION_CACHE_DIR', os.path.join(tempfile.gettempdir(), 'tokjax-test-xla-cache')
)
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
# The suite's programs are tiny: LLVM's optimisation of the machine code XLA emits for them took
# about 40% of their compile time and saves nothing when they run. XLA's own passes (fusion,
# sharding, buffer assignment), which decide what is computed, run unchanged; subprocesses inherit
# the flags (those that set XLA_FLAGS add theirs to `XLA_FAST_COMPILE`).
XLA_FAST_COMPILE = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'
os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_FAST_COMPILE}".strip()


def _static(x) -> bool:
  return (
      x is None
      or isinstance(x, (str, int, float))
      or (isinstance(x, tuple) and all(_static(y) for y in x))
  )


def jit_call(fn, *args, **kwargs):
  """fn(*args, **kwargs) compiled as one XLA program; arguments that are not arrays (modes, counts,
  `method=`) are static. Run eagerly, a model's init or apply compiles each of its hundreds of
  operations as a program of its own, which took most of the time of the tests that did so."""
  import jax  # pylint: disable=g-import-not-at-top  (after the cache settings above)

  static = tuple(i for i, a in enumerate(args) if _static(a))
  fixed = {k: v for k, v in kwargs.items() if _static(v)}
  traced = {k: v for k, v in kwargs.items() if k not in fixed}
  return jax.jit(lambda *a, **kw: fn(*a, **kw, **fixed), static_argnums=static)(*args, **traced)


def hierarchical_model(boundary, d_model: int, capacity: int, window: int, **options):
  """A one-level HierarchicalByteLM over the 258 byte ids with one block per stack and two heads."""
  from tokjax.models import hierarchical  # pylint: disable=g-import-not-at-top

  level = hierarchical.Level(boundary, capacity, encoder_layers=1, decoder_layers=1, window=window)
  return hierarchical.HierarchicalByteLM(
      vocab_size=258, d_model=d_model, num_heads=2, main_layers=1, levels=(level,), **options
  )


def tiny_config(workdir: str):
  """A hierarchical model small enough to train a few steps in seconds on the stdlib corpus."""
  from tokjax.config import defaults as config_defaults

  c = config_defaults.base_config()
  c.model.d_model, c.model.capacity = 32, 32
  c.data.corpus = 'stdlib'  # The tests were written against the code corpus.
  c.data.seq_len, c.data.batch_size, c.data.max_bytes = 64, 4, 200_000
  c.data.val_fraction = c.data.test_fraction = 0.1  # Several documents per split.
  c.eval.batch_size, c.eval.max_batches = 4, 3
  c.train.steps, c.train.log_every, c.train.eval_every, c.train.checkpoint_every = 6, 3, 3, 6
  c.train.workdir = workdir
  return c


def _shared_run(tmp_path_factory, name, train_into) -> str:
  """The folder `train_into(folder)` filled, trained once for the whole session.

  pytest-xdist runs a session fixture once in each worker; the workers share the parent of their
  temporary folders, so the first to arrive trains there under a file lock and the others read its
  run. The file `trained_by` names the process that trained it.
  """
  import fcntl  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = root.parent
  folder = os.path.join(root, name)
  with open(os.path.join(root, f'{name}.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(os.path.join(folder, 'trained_by')):
      shutil.rmtree(folder, ignore_errors=True)  # What a worker that failed half-way left.
      os.makedirs(folder)
      train_into(folder)
      with open(os.path.join(folder, 'trained_by'), 'w') as f:
        f.write(str(os.getpid()))
  return folder


def trained_by(folder: str) -> int:
  """The process id that trained a shared fixture run (`_shared_run`)."""
  with open(os.path.join(folder, 'trained_by')) as f:
    return int(f.read())


def tiny_run_config(workdir: str):
  """`tiny_config` logging every step and saving at steps 3 and 6: what `tiny_run` trains."""
  c = tiny_config(workdir)
  c.train.log_every, c.train.checkpoint_every = 1, 3
  return c


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
  """Run folder of a finished 6-step training run of `tiny_run_config` (checkpoints at steps 3 and 6,
  metrics.jsonl). Read it; a test that changes it works on a copy."""
  from tokjax import train  # pylint: disable=g-import-not-at-top

  return _shared_run(tmp_path_factory, 'tiny_run', lambda d: train.train(tiny_run_config(d)))


@pytest.fixture
def resolutions(monkeypatch):
  """The configs that `stages.resolve` resolves while the test runs, one entry per call (through
  `stages.get` too): the real function, wrapped to count."""
  from tokjax import stages  # pylint: disable=g-import-not-at-top

  calls = []
  real = stages.resolve

  def counting(config):
    calls.append(config)
    return real(config)

  monkeypatch.setattr(stages, 'resolve', counting)
  return calls


@pytest.fixture
def toy_method():
  """tests/toy_boundary.py's 'punctuation' registered for one test only, so that configs built by
  other tests in this process (the session's tiny run among them) do not carry its section."""
  import importlib  # pylint: disable=g-import-not-at-top

  from tokjax.models import registry  # pylint: disable=g-import-not-at-top

  # Imported here, not at the top: test_rivals.py parametrizes over the registry at collection time.
  sys.modules.pop('toy_boundary', None)
  importlib.import_module('toy_boundary')  # Importing the file registers its method.
  yield 'punctuation'
  registry.unregister('punctuation')


def flat_run_config(workdir: str):
  """`tiny_config` with the flat model, 40 steps of batch 8 logged at every step: what `flat_run`
  trains."""
  c = tiny_config(workdir)
  c.model.kind = 'flat'
  c.data.batch_size, c.train.steps, c.train.log_every = 8, 40, 1
  c.train.eval_every = c.train.checkpoint_every = 40
  return c


@pytest.fixture(scope='session')
def flat_run(tmp_path_factory):
  """Run folder of a finished 40-step run of `flat_run_config` (one checkpoint, at step 40)."""
  from tokjax import train  # pylint: disable=g-import-not-at-top

  return _shared_run(tmp_path_factory, 'flat_run', lambda d: train.train(flat_run_config(d)))


def tiny_two_stage_config(workdir: str):
  """configs/two_stage.py's learned/learned variant at its tiny size, on `tiny_config`'s data."""
  from tokjax.config import files as config_files

  c = config_files.load('two_stage', 'learned,tiny')
  c.data.corpus, c.data.max_bytes = 'stdlib', 200_000
  c.data.val_fraction = c.data.test_fraction = 0.1
  c.eval.max_batches = 2
  c.train.steps, c.train.log_every, c.train.eval_every, c.train.checkpoint_every = 4, 1, 4, 2
  c.train.workdir = workdir
  return c


@pytest.fixture(scope='session')
def tiny_two_stage_run(tmp_path_factory):
  """(run folder, console output) of a finished 4-step run of `tiny_two_stage_config` (checkpoints at
  steps 2 and 4). Read it; a test that changes it works on a copy."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top

  from tokjax import train  # pylint: disable=g-import-not-at-top

  def train_into(workdir):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      train.train(tiny_two_stage_config(workdir))
    with open(os.path.join(workdir, 'console.txt'), 'w') as f:
      f.write(out.getvalue())

  workdir = _shared_run(tmp_path_factory, 'tiny_two_stage_run', train_into)
  with open(os.path.join(workdir, 'console.txt')) as f:
    return workdir, f.read()


def tiny_flags(workdir: str, **overrides) -> list[str]:
  """`tiny_config` as command-line flags of `python -m tokjax.train` (subprocess tests);
  configs/compare.py:policy is `config_defaults.base_config()`, so the same overrides give the same
  config. overrides:
  {'train__steps': 12} sets --config.train.steps=12."""
  values = {
      'data.corpus': 'stdlib',
      'model.d_model': 32,
      'model.capacity': 32,
      'data.seq_len': 64,
      'data.batch_size': 4,
      'data.max_bytes': 200_000,
      'data.val_fraction': 0.1,
      'data.test_fraction': 0.1,
      'eval.batch_size': 4,
      'eval.max_batches': 3,
      'train.steps': 6,
      'train.log_every': 3,
      'train.eval_every': 3,
      'train.checkpoint_every': 6,
      'train.workdir': workdir,
  }
  values.update({k.replace('__', '.'): v for k, v in overrides.items()})
  return ['--config=configs/compare.py:policy'] + [f'--config.{k}={v}' for k, v in values.items()]


# `python -m MODULE ARGS` for each ARGS through the command's own entry point, cli.run(main), in one
# process: the command lines differ only past start-up, which is mostly importing jax.
_COMMAND_LINES = """
import contextlib, importlib, io, json, sys
for name in json.loads(sys.argv[3]):  # Packages made unimportable, as if not installed.
  sys.modules[name] = None
from absl import flags
from tokjax import cli
module = importlib.import_module(sys.argv[1])
module.define_flags()
defined = set(flags.FLAGS)
ended = []
for args in json.loads(sys.argv[2]):
  flags.FLAGS.unparse_flags()
  for name in set(flags.FLAGS) - defined:  # A config file's --config.* flags, defined by the parse.
    delattr(flags.FLAGS, name)
  sys.argv = [module.__name__, *args]
  err, code = io.StringIO(), 0
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:
      cli.run(module.main)
    except SystemExit as e:
      code = e.code or 0
  ended.append([code, err.getvalue()])
print(json.dumps(ended))
"""


def command_lines(
    module: str, argvs: list[list[str]], cwd=None, missing: tuple[str, ...] = ()
) -> list[tuple[int, str]]:
  """(exit code, stderr) of `python -m module *argv` for each argv, run in one process (the module
  defines its flags with `define_flags` and runs `cli.run(main)`, as tokjax's commands do).
  missing: packages that fail to import in that process (an optional extra not installed)."""
  proc = subprocess.run(
      [sys.executable, '-c', _COMMAND_LINES, module, json.dumps(argvs), json.dumps(missing)],
      cwd=cwd,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr
  return [(code, err) for code, err in json.loads(proc.stdout)]
