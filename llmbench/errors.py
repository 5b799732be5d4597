"""The one exception type that reaches a person.

Anything raised as `UserError` is a mistake the user can fix (a bad path, a corrupt file, an
invalid parameter). The CLI prints its message as one line and exits with code 2; every other
exception is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input: the message says what, where, and what to do."""
