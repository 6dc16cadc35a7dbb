"""What a run has told so far: the counts the progress line and the run's summary show, the best
feasible value, and a line on the last trial told (autotune/tune/tuner.py keeps one per run)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotune.core.errors import STARTUP_FAILURES, FailureKind
from autotune.tune.progress import ProgressState
from autotune.tune.result_attrs import parse_info
from autotune.tune.study import margins_of, unmet_reason


@dataclass
class Tally:
    """Counts of told trials, by what they were."""

    maximize: bool  # the primary objective's direction: which value is the best
    done: int = 0  # trials that count toward n_trials
    rejected: int = 0  # told before launch (invalid or screened)
    duplicates: int = 0  # told an earlier result
    duplicate_streak: int = 0  # duplicates since the last measured config
    screened: int = 0
    unstarted: int = 0  # of the done: launched but failed to start (they served no load: not measured)
    feasible: int = 0
    failed: int = 0
    best: float | None = None
    baseline: float | None = None
    last: str = ""
    gpu_s: float = 0.0  # GPU time of the told trials (the progress line of a guided run)

    def record(self, frozen: FrozenTrial) -> None:
        """Count one told trial and describe it in `last`. A FAIL one (interrupted, or cut short by the
        budget before a verdict) counts its GPU time only: --n-trials counts trials with a verdict."""
        attrs = frozen.user_attrs
        if "duplicate_of" not in attrs:
            self.gpu_s += float(attrs.get("gpu_seconds", 0.0))
        if frozen.state == TrialState.FAIL:  # no verdict (cut short): its GPU time spent, not a trial done
            self.last = f"#{frozen.number} {_status(attrs)}"
            return
        if "duplicate_of" in attrs:
            self.duplicates += 1
            self.duplicate_streak += 1
        elif attrs.get("launched", True):
            self.done += 1
            self.unstarted += attrs.get("failure") in STARTUP_FAILURES
            self.duplicate_streak = 0
        else:
            self.rejected += 1
            self.screened += bool(attrs.get("screened"))
        value = frozen.values[0] if frozen.values else None
        if attrs.get("feasible") and "duplicate_of" not in attrs:
            self.feasible += 1
            if value is not None and (self.best is None or self._better(value, self.best)):
                self.best = value
        failure = attrs.get("failure")
        if failure and attrs.get("launched", True) and failure != FailureKind.EARLY_ABORT:
            self.failed += 1
        if attrs.get("baseline") and attrs.get("feasible"):
            self.baseline = value
        shown = f" {value:,.0f}" if value is not None and attrs.get("feasible") else ""
        self.last = f"#{frozen.number} {_status(attrs)}{shown}"

    @property
    def measured(self) -> int:
        """Configs that served load (the done ones that started)."""
        return self.done - self.unstarted

    @property
    def finished(self) -> int:
        """The told trials that finished: the done, the rejected and the duplicates."""
        return self.done + self.rejected + self.duplicates

    def kinds_text(self) -> str:
        """The finished trials by kind: "2 measured, 1 rejected before launch" (--n-trials counts the
        measured ones and those that failed to start)."""
        kinds = [(self.measured, "measured"), (self.unstarted, "failed to start")]
        kinds += [(self.rejected, "rejected before launch"), (self.duplicates, "duplicates")]
        return ", ".join(f"{n} {what}" for n, what in kinds if n or what == "measured")

    def state(self, total: int, guided: bool, **rest: Any) -> ProgressState:
        """The progress line's state: these counts of `total`, the GPU-hours spent when `guided`, and
        `rest` (the running trials, the times, the budget: ProgressState's other fields)."""
        counts = {"feasible": self.feasible, "failed": self.failed, "rejected": self.rejected}
        counts |= {"best": self.best, "baseline": self.baseline, "last": self.last, "maximize": self.maximize}
        gpu_hours = self.gpu_s / 3600 if guided else None
        return ProgressState(done=self.done, total=total, gpu_hours=gpu_hours, **counts, **rest)

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.maximize else a < b


def _status(attrs: Mapping[str, Any]) -> str:
    """A told trial in a few words: feasible, or why not (unmet_reason) with the rates it fell short at."""
    stored = parse_info(attrs)
    if attrs.get("feasible"):
        status = "feasible"
    else:
        status = unmet_reason(attrs.get("failure"), margins_of(attrs), stored.capacity, stored.kept_up)
    if status == "did not keep up":
        steady = stored.load.steady if stored.load is not None else None
        if steady is not None:
            status += f" (served {steady.served_rate:.1f} of {steady.offered_rate:.1f} req/s)"
    if attrs.get("screened"):
        status = f"screened ({status})"
    return status
