"""Command-line plumbing shared by tokjax's entry points: flags parsed, and user mistakes reported as
one `error: ...` line with exit code 2 instead of a traceback."""

import re
import sys

from absl import app, flags

from tokjax.errors import UserError


def fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _parse(argv):
  try:
    args = flags.FLAGS(argv)
    for name in ('config',):  # Config files load lazily: load now, so a bad path is reported here.
      if name in flags.FLAGS and flags.FLAGS[name].value is not None:
        _ = flags.FLAGS[name].value.keys()
    return args
  except flags.Error as e:
    fail(f'{e}. Run with --helpshort to see the flags.')
  except (AttributeError, KeyError) as e:
    key = next(
        (
            a
            for a in argv
            if a.startswith('--config.') and re.sub(r'=.*', '', a).rsplit('.', 1)[-1] in str(e)
        ),
        None,
    )
    fail(f'unknown config key {key or e}; check the field names in tokjax/config_defaults.py.')
  except (IOError, OSError) as e:
    reason = re.findall(r'\[Errno \d+\] ([^\n]*)', str(e)) or [str(e).splitlines()[-1].strip()]
    fail(
        f'cannot load the config file: {reason[-1]}. Pass an existing config, e.g. '
        '--config=configs/default.py.'
    )


def run(main) -> None:
  """app.run(main) with friendly flag errors, and UserError from main printed as one line."""

  def wrapped(argv):
    if len(argv) > 1:
      fail(f'unexpected arguments {argv[1:]}; every option is a --flag.')
    try:
      main(argv)
    except UserError as e:
      fail(str(e))

  app.run(wrapped, flags_parser=_parse)
