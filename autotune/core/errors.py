"""Errors a user can cause (one line, non-zero exit), and why a trial failed (`FailureKind`)."""

from enum import StrEnum


class AutotuneError(Exception):
    """A user-facing error (bad input, missing file, unknown model...). Its message is one line."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line of an error message: its first line (else its type), cut at `limit`."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:limit]


class EngineStartupError(Exception):
    """The engine refused to start with this config; the message is vLLM's own (verbatim)."""

    def __init__(self, message: str, kind: str = "invalid_config", error_type: str = "ValueError") -> None:
        super().__init__(message)
        self.kind = kind  # a FailureKind value
        self.error_type = error_type  # the Python exception vLLM raises with it

    def log_line(self) -> str:
        """The line vLLM's log ends with: the exception and its message (a torch error names itself)."""
        message = str(self)
        return message if message.startswith("torch.") else f"{self.error_type}: {message}"


class RunFailure(AutotuneError):
    """A run that stopped on a fault outside the user's input (a locked or full storage, a full disk).

    One line too, ending with how to continue; the exit code is 1, not the usage error's 2.
    """

    exit_code = 1


class SetupLost(RunFailure):
    """What every trial runs on went away mid-run (the Ray cluster, the Docker engine).

    No later trial could run, and the trials it cut short did nothing wrong: the run stops as after
    Ctrl-C (those trials marked FAIL, the finished ones kept, the results written) and a resume
    continues. Raised by a trial, it ends the run instead of becoming the trial's failure.
    """

    what = "the setup"  # what was lost, in a guided search's stop note ("... was lost")
    resume_note = ""  # after the resume hint: how a resume reaches a new one


class FailureKind(StrEnum):
    """Why a trial produced no usable benchmark. The tuner tells each as a constraint violation."""

    INVALID_CONFIG = "invalid_config"  # vLLM rejected the flags (scheduler/config validation)
    KV_CACHE_OOM = "kv_cache_oom"  # no memory for KV blocks / max-length request does not fit
    STARTUP_OOM = "startup_oom"  # CUDA OOM while starting (profiling, CUDA graphs, sampler warm-up)
    OOM_UNDER_LOAD = "oom_under_load"  # CUDA OOM while serving
    CRASHED = "crashed"  # the server died mid-run
    STARTUP_TIMEOUT = "startup_timeout"  # /health never answered in time
    BENCHMARK_TIMEOUT = "benchmark_timeout"  # the load did not finish in time
    PORT_IN_USE = "port_in_use"
    REQUESTS_FAILED = "requests_failed"  # the server answered some requests with an error (e.g. too long)
    EARLY_ABORT = "early_abort"  # stopped early: the SLOs could no longer be met (partial metrics kept)
    # A capacity search cut short by the run's GPU-hour budget before any rate passed: no verdict, the
    # tuner tells it FAIL (tune/tuner.py), its GPU time spent
    BUDGET_SPENT = "budget_spent"
    ERROR = "error"  # anything else


# The failures that end a trial before any load was served: it cost a startup, not a search.
STARTUP_FAILURES = frozenset(
    {
        FailureKind.INVALID_CONFIG,
        FailureKind.KV_CACHE_OOM,
        FailureKind.STARTUP_OOM,
        FailureKind.STARTUP_TIMEOUT,
        FailureKind.PORT_IN_USE,
    }
)
