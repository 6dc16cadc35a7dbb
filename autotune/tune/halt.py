"""Halting a run whose first launched trials all fail alike.

When every server of a run dies with the same message (a broken serve command, a flag the installed
vLLM does not know, a missing model), the cause is the setup, not the configs: going on to --n-trials
spends a startup per trial and ends with the cause buried in trials.csv. The tuner asks this record
after each trial told and halts the run (autotune/tune/tuner.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial, TrialState

from autotune.core.errors import FailureKind

HALT_AFTER = 3  # the defaults and two more: one failure alike is chance, three are the setup

# Failures a config causes by its own values (its memory, its pace under the SLOs, the budget's cut):
# the same message from several configs still says nothing against the setup. A port in use is not
# one: a passing collision is retried on another port (backends/server.py), so three launches failing
# alike on it is a port the setup pins (a --serve-cmd with --port) that another program holds.
_CONFIG_FAILURES = frozenset(
    {
        FailureKind.KV_CACHE_OOM,
        FailureKind.STARTUP_OOM,
        FailureKind.OOM_UNDER_LOAD,
        FailureKind.EARLY_ABORT,
        FailureKind.BENCHMARK_TIMEOUT,
        FailureKind.BUDGET_SPENT,
    }
)


# An id a launch names in its message (a container's, an image's digest): each trial's own, so two
# messages that differ only by one still say the same thing of the setup.
_IDS = re.compile(r"\b[0-9a-f]{12,}\b", re.IGNORECASE)


def _alike_key(failure: str, message: str) -> tuple[str, str]:
    """What two failures must share to count as alike: their kind and their message but for ids."""
    return failure, _IDS.sub("<id>", message)


@dataclass
class FirstFailures:
    """The failures of a run's first launched trials, while they are all alike."""

    seen: list[tuple[str, str]] = field(default_factory=list)  # (failure kind, message) per trial
    varied: bool = False  # a launched trial did anything else: the setup is not what fails them all

    def record(self, frozen: FrozenTrial) -> str | None:
        """Note a trial told this run; the reason to halt once the first HALT_AFTER launched trials
        failed with one kind and one message, else None."""
        attrs = frozen.user_attrs
        launched = attrs.get("launched", True) and "duplicate_of" not in attrs
        if self.varied or not launched or frozen.state != TrialState.COMPLETE:
            return None  # unlaunched, answered from another trial, or cut short: no word on the setup
        failure, message = attrs.get("failure"), str(attrs.get("message") or "")
        alike = bool(failure and message) and failure not in _CONFIG_FAILURES
        if not alike or (self.seen and _alike_key(*self.seen[0]) != _alike_key(failure, message)):
            self.varied = True
            return None
        self.seen.append((failure, message))
        if len(self.seen) < HALT_AFTER:
            return None
        return (
            f"the first {HALT_AFTER} configs launched all failed alike ({failure}: {message}); the "
            "cause is the setup (the serve command, a flag the installed vLLM lacks, the environment), not "
            "the configs: fix it and start a new --study (these failures stay in this one)"
        )
