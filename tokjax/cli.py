"""Command-line plumbing shared by tokjax's entry points: flags parsed, a quiet terminal, and user
mistakes reported as one `error: ...` line with `errors.USER_ERROR_EXIT` (2) instead of a traceback.

Third-party INFO logs (absl, orbax, jax) are off by default: only warnings and errors show. absl's own
`--verbosity` flag brings them back: `--verbosity=0` shows INFO, `--verbosity=1` DEBUG.
"""

import logging as std_logging
import math
import re
import sys

from absl import app, flags, logging

from tokjax import errors
from tokjax.errors import Interrupted, UserError

HELP_FLAGS = ('-h', '--help', '-?', '--helpshort', '--helpfull')
# The flag that a lone positional argument sets (`positional`), for the command being run.
_positional: list[str] = []


def positional(flag: str) -> None:
  """Lets the command take one positional argument as --flag (segment's FILE); called by its
  `define_flags`. More than one, or one with --flag given too, is one line."""
  _positional[:] = [flag]


def fail(message: str) -> None:
  sys.exit(errors.report(message))


def quiet_logs() -> None:
  """Warnings and errors only, unless --verbosity was given (absl would switch to INFO otherwise)."""
  if 'verbosity' in flags.FLAGS and flags.FLAGS['verbosity'].present:
    return
  logging.set_verbosity(logging.WARNING)
  std_logging.getLogger().setLevel(std_logging.WARNING)


def _help(argv) -> None:
  """--help and its variants print the command's flags and exit 0 (absl would exit 1)."""
  if any(a in HELP_FLAGS for a in argv[1:]):
    full = '--helpfull' in argv
    text = flags.FLAGS.get_help() if full else flags.FLAGS.main_module_help()
    doc = sys.modules['__main__'].__doc__ or ''
    print((doc.strip() + '\n\n' if doc else '') + (text or flags.FLAGS.get_help()))
    sys.exit(0)


def _config_error(e: BaseException) -> str:
  if isinstance(e, SyntaxError):
    where = f'{e.filename}, line {e.lineno}' if e.filename else f'line {e.lineno}'
    return f'the config file has a syntax error ({e.msg}, {where}); fix it and rerun.'
  lines = str(e).strip().splitlines()
  reason = (re.findall(r'\[Errno \d+\] ([^\n]*)', str(e)) or [lines[-1].strip() if lines else ''])[
      -1
  ]
  return (
      f'cannot load the config file: {reason or type(e).__name__}. Pass an existing config, e.g. '
      '--config=configs/default.py.'
  )


def _unknown_key(arg: str | None, error: BaseException) -> str:
  """The line for an unknown --config.KEY: where the key lives now if a saved-config migration moved
  it (`tokjax.config.saved.MIGRATIONS`), else where the fields are listed."""
  if arg is None:
    return f'unknown config key {error}; check the field names in tokjax/config/defaults.py.'
  name, _, value = arg.removeprefix('--config.').partition('=')
  from tokjax.config import saved  # pylint: disable=g-import-not-at-top  (commands without a config)

  moved = saved.moved(name)
  if moved is None:
    return f'unknown config key {arg}; check the field names in tokjax/config/defaults.py.'
  if moved.new is None:
    return f'config.{name} was removed (commit {moved.commit}); drop --config.{name}.'
  if moved.convert is not None:  # The new field reads other values: do not carry this one over.
    return (
        f'config.{name} became config.{moved.new} (commit {moved.commit}); set '
        f'--config.{moved.new} instead (its values: tokjax/config/defaults.py).'
    )
  return (
      f'config.{name} moved to config.{moved.new} (commit {moved.commit}); pass '
      f'--config.{moved.new}={value}.'
  )


def _non_finite_flag() -> str | None:
  """The line for the first float flag given a NaN or an infinity: absl's bounds let NaN through,
  and no command's float means either."""
  for name in sorted(flags.FLAGS):
    if '.' in name:  # A --config.FIELD override: validation names the config field.
      continue
    flag = flags.FLAGS[name]
    if flag.present and isinstance(flag.value, float) and not math.isfinite(flag.value):
      return f'--{name}={flag.value} must be a finite number.'
  return None


def _parse(argv):
  _help(argv)
  try:
    args = flags.FLAGS(argv)
    for name in ('config',):  # Config files load lazily: load now, so a bad path is reported here.
      if name in flags.FLAGS and (config := flags.FLAGS[name].value) is not None:
        _ = config.keys()
    bad = _non_finite_flag()
    if bad:
      fail(bad)
    return args
  except UserError as e:  # A config file's get_config rejecting its argument (e.g. a variant).
    fail(str(e))
  except flags.Error as e:
    cause = e.__cause__ or e.__context__
    if isinstance(cause, SyntaxError):
      fail(_config_error(cause))
    fail(f'{e}. Run with --helpshort to see the flags.')
  except SyntaxError as e:
    fail(_config_error(e))
  except (AttributeError, KeyError) as e:
    key = next(
        (
            a
            for a in argv
            if a.startswith('--config.') and re.sub(r'=.*', '', a).rsplit('.', 1)[-1] in str(e)
        ),
        None,
    )
    fail(_unknown_key(key, e))
  except (IOError, OSError) as e:
    fail(_config_error(e))
  except (NameError, ImportError, TypeError, ValueError) as e:
    fail(f'cannot load the config file: {type(e).__name__}: {str(e).splitlines()[0][:200]}.')


def run(main) -> None:
  """app.run(main) with friendly flag errors, quiet third-party logs, UserError from main printed as
  one line, and an `Interrupted` run (SIGTERM/SIGINT) exiting with its own code and one line."""

  def wrapped(argv):
    quiet_logs()
    if len(argv) > 1 and _positional:
      name = _positional[0]
      if len(argv) > 2:
        fail(
            f'{len(argv) - 1} positional arguments {argv[1:]}; this command takes only one '
            f'{name.upper()} (or --{name}), every other option is a --flag.'
        )
      if flags.FLAGS[name].present:
        fail(f'{argv[1]!r} and --{name}={flags.FLAGS[name].value} both name the {name}; pass one.')
      flags.FLAGS[name].value = argv[1]
    elif len(argv) > 1:
      fail(f'unexpected arguments {argv[1:]}; every option is a --flag.')
    try:
      main(argv)
    except UserError as e:
      fail(str(e))
    except Interrupted as e:
      print(str(e), file=sys.stderr, flush=True)
      sys.exit(e.exit_code)

  app.run(wrapped, flags_parser=_parse)
