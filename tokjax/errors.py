"""The one exception type for mistakes a user can fix (bad corpus, bad config value, ...).

Entry points catch `UserError`, print its message on one line and exit non-zero, without a traceback.
The message must say what is wrong and how to fix it.
"""


class UserError(Exception):
  """A problem with the user's input, with a message that says how to fix it."""
