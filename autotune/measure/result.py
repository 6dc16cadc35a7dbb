"""The record a trial's measurement produces: a benchmark, or a failure with its reason.

Beside the metrics it carries typed parts, each filled by the layer that knows it: what the server
reported (the backend), how the load went (the steady-state judgement), the capacity search's outcome
(autotune/trial/capacity.py) and where the trial ran (autotune/trial/task.py). The study stores them
in the trial's `info` attr (autotune/tune/result_attrs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.capacity_report import CapacityReport
from autotune.measure.load_report import LoadReport
from autotune.measure.metrics import BenchmarkResult
from autotune.measure.placement import Placement
from autotune.measure.server_report import ServerReport


@dataclass
class TrialResult:
    """The outcome of evaluating one config: a benchmark, or a failure with its reason."""

    config: EngineConfig
    benchmark: BenchmarkResult | None = None
    failure: FailureKind | None = None
    message: str = ""  # one line: the vLLM error message or what went wrong
    log_tail: str = ""  # the last lines of the server log, for failed trials
    startup_s: float = 0.0  # GPU seconds spent starting the server (simulated for the sim backend)
    benchmark_s: float = 0.0  # GPU seconds spent running the load
    saved_s: float = 0.0  # GPU seconds early abort spared (an estimate: see where it is set)
    server: ServerReport | None = None  # what the server reported (None: no server, e.g. not launched)
    load: LoadReport | None = None  # how the load went (None: not judged, e.g. a closed loop)
    capacity: CapacityReport | None = None  # a capacity search's outcome (None: a fixed load)
    placement: Placement | None = None  # where it ran (None: in the driver's process)
    # The server had failed in an earlier measurement of its session: this one ran no load.
    failed_in_earlier_measurement: bool = False

    @property
    def ok(self) -> bool:
        """True when the benchmark ran to the end (an early abort is not ok but keeps metrics)."""
        return self.failure is None and self.benchmark is not None

    @property
    def kept_up(self) -> bool | None:
        """Whether the server kept up with the load: the capacity search's verdict at its rate, else the
        window's (None: not judged)."""
        if self.capacity is not None:
            return self.capacity.kept_up
        return self.load.kept_up if self.load is not None else None

    @property
    def cut_by_budget(self) -> bool:
        """Whether the run's GPU-hour budget stopped its capacity search: its capacity is a lower bound,
        or it has none (FailureKind.BUDGET_SPENT)."""
        cut = self.capacity is not None and self.capacity.cut_by_budget
        return self.failure == FailureKind.BUDGET_SPENT or cut

    @property
    def gpu_seconds(self) -> float:
        """Device time this trial cost, per GPU."""
        return self.startup_s + self.benchmark_s


def requests_failed_message(failed: Sequence[Any], total: int) -> str:
    """One line for a run where requests failed: how many, and the first error (the server's words)."""
    first = " ".join(str(getattr(failed[0], "error", "") or "no answer").split())[:300]
    return f"{len(failed)} of {total} requests failed: {first}"
