"""The record a trial's measurement produces: a benchmark, or a failure with its reason."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.metrics import BenchmarkResult


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
    info: dict[str, Any] = field(default_factory=dict)  # e.g. num_gpu_blocks, resolved flags

    @property
    def ok(self) -> bool:
        """True when the benchmark ran to the end (an early abort is not ok but keeps metrics)."""
        return self.failure is None and self.benchmark is not None

    @property
    def gpu_seconds(self) -> float:
        """Device time this trial cost, per GPU."""
        return self.startup_s + self.benchmark_s


def requests_failed_message(failed: Sequence[Any], total: int) -> str:
    """One line for a run where requests failed: how many, and the first error (the server's words)."""
    first = " ".join(str(getattr(failed[0], "error", "") or "no answer").split())[:300]
    return f"{len(failed)} of {total} requests failed: {first}"
