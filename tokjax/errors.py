"""The exceptions entry points turn into one line instead of a traceback.

`UserError`: a mistake a user can fix (bad corpus, bad config value, ...); printed as `error: ...`
by `report`, and every command then exits with `USER_ERROR_EXIT`. The message must say what is wrong
and how to fix it.
`Interrupted`: a run stopped by a signal after saving; its message says where and how to resume, and
the process exits with 128 + the signal number (the shell convention: 143 for SIGTERM, 130 for SIGINT).
"""

import sys

# The exit status of every command stopped by a UserError: the shell's status for wrong usage (as
# argparse's usage errors), so a script tells bad input from a crash (1).
USER_ERROR_EXIT = 2


def report(message: str) -> int:
  """Prints `error: message` on stderr, one line; returns `USER_ERROR_EXIT` for the command to exit
  with."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  return USER_ERROR_EXIT


class UserError(Exception):
  """A problem with the user's input, with a message that says how to fix it."""


class Interrupted(Exception):
  """A run stopped by a signal, its state saved; the message says how to resume."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.exit_code = 128 + signum
