"""The exceptions that reach a person: a mistake they can fix, or a backend that died.

Anything raised as `UserError` is a mistake the user can fix (a bad path, a corrupt file, an
invalid parameter). The CLI prints its message as one line and exits with code 2. A
`BackendFailure` ends a run that cannot go on (the engine thread crashed): one line naming the
error, exit code 1, the results measured so far kept. Every other exception is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A problem with the user's input: the message says what, where, and what to do."""


class BackendFailure(Exception):
    """The backend itself failed, not one request: every waiting request ends with this error."""
