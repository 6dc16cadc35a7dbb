"""Errors a user can cause. The CLI prints their message as one line and exits non-zero."""


class AutotuneError(Exception):
    """A user-facing error (bad input, missing file, unknown model...). Its message is one line."""


class EngineStartupError(Exception):
    """The engine refused to start with this config; the message is vLLM's own (verbatim)."""

    def __init__(self, message: str, kind: str = "invalid_config") -> None:
        super().__init__(message)
        self.kind = kind  # a FailureKind value, see autotune.backends.base


class RunFailure(AutotuneError):
    """A run that stopped on a fault outside the user's input (a locked or full storage, a full disk).

    One line too, ending with how to continue; the exit code is 1, not the usage error's 2.
    """

    exit_code = 1
