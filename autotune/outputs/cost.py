"""What a run cost and what its recommendation costs to deploy: GPU-hours spent and saved, replicas for
a target request rate, $/Mtok at a GPU price, and the estimate shown before a real-GPU run.

GPU-hours saved are two estimates, each said as such:
- early abort: per trial, the load time the abort spared (the arrival schedule left plus a median
  request, or the completion pace once every request arrived; never past the benchmark's time limit:
  see early_abort.abort_savings);
- startup screening: each config screened out would have been launched and failed at startup; it is
  charged the median GPU time of this run's launched configs that failed to start (none launched: 0).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.tune.progress import clock
from autotune.tune.study import TrialRecord

STARTUP_FAILURES = ("invalid_config", "kv_cache_oom", "startup_oom", "startup_timeout")


@dataclass(frozen=True)
class CostView:
    """GPU time a run spent and saved, in GPU-hours (a TP=4 trial's hour is 4 GPU-hours)."""

    spent_h: float
    saved_abort_h: float
    saved_screen_h: float
    aborted: int  # trials stopped early
    screened: int  # configs not launched because they were predicted to fail to start
    simulated: bool

    def text(self) -> str:
        """One sentence for the run summary and the report."""
        kind = "simulated " if self.simulated else ""
        saved = []
        if self.aborted:
            saved.append(f"{self.saved_abort_h:.2f} h by early abort ({self.aborted} trials)")
        if self.screened:
            saved.append(f"{self.saved_screen_h:.2f} h by screening ({self.screened} configs not launched)")
        tail = f"; saved about {' and '.join(saved)}" if saved else ""
        return f"{kind}GPU time spent {self.spent_h:.2f} GPU-h{tail}."


def cost_view(records: Sequence[TrialRecord], simulated: bool) -> CostView:
    """Spent and saved GPU-hours of a study's records (duplicates cost nothing)."""
    launched_failures = [
        r.gpu_seconds for r in records if r.failure in STARTUP_FAILURES and r.launched and r.gpu_seconds > 0
    ]
    screened = sum(1 for r in records if r.screened)
    per_screened = statistics.median(launched_failures) if launched_failures else 0.0
    return CostView(
        spent_h=sum(r.gpu_seconds for r in records) / 3600,
        saved_abort_h=sum(r.gpu_seconds_saved for r in records) / 3600,
        saved_screen_h=screened * per_screened / 3600,
        aborted=sum(1 for r in records if r.gpu_seconds_saved > 0),
        screened=screened,
        simulated=simulated,
    )


@dataclass(frozen=True)
class Sizing:
    """Replicas of the recommended config for a target request rate, and what a token costs."""

    target_rate: float
    per_replica_rate: float  # req/s one replica serves within the SLOs
    replicas: int
    gpus: int
    capacity_known: bool  # False: measured at a fixed load, so per_replica_rate is a lower bound
    usd_per_mtok: float | None = None  # output tokens, at the target rate

    def text(self) -> str:
        """One sentence for the report."""
        bound = "" if self.capacity_known else " at most (measured at a fixed load, not at capacity)"
        price = f"; ${self.usd_per_mtok:,.2f} per million output tokens" if self.usd_per_mtok else ""
        return (
            f"{self.target_rate:g} req/s: {self.replicas} replicas{bound} x {self.gpus // self.replicas} "
            f"GPU = {self.gpus} GPUs (one replica serves {self.per_replica_rate:.2f} req/s within the SLOs)"
            f"{price}."
        )


def sizing(best: TrialRecord, target_rate: float, gpu_price: float | None = None) -> Sizing | None:
    """Replicas and GPUs to serve `target_rate` req/s with the recommended trial; None without a rate."""
    capacity = best.capacity.rate if best.capacity is not None else None
    known = bool(capacity)
    rate = float(capacity or best.metrics.get("request_throughput") or 0.0)
    if rate <= 0 or target_rate <= 0:
        return None
    replicas = math.ceil(target_rate / rate)
    tp = int(best.config.get("tensor_parallel_size", 1) or 1)
    usd = None
    completed = best.metrics.get("completed") or 0
    out_tokens = best.metrics.get("total_output_tokens") or 0
    if gpu_price and completed and out_tokens:
        tokens_per_hour = target_rate * (out_tokens / completed) * 3600
        usd = gpu_price * replicas * tp / (tokens_per_hour / 1e6)
    return Sizing(target_rate, rate, replicas, replicas * tp, known, usd)


@dataclass(frozen=True)
class RunEstimate:
    """Before a real-GPU run: how long it may take and what it costs."""

    per_trial_s: float  # GPU-seconds of one trial per GPU (startup + benchmarks)
    gpus_per_trial: int
    n_trials: int
    parallel: int  # trials at once
    source: str  # how per_trial_s was obtained

    @property
    def gpu_hours(self) -> float:
        """Total GPU-hours of the run."""
        return self.per_trial_s * self.gpus_per_trial * self.n_trials / 3600

    @property
    def wall_hours(self) -> float:
        """Wall-clock hours with `parallel` trials at once."""
        return self.per_trial_s * math.ceil(self.n_trials / max(1, self.parallel)) / 3600

    def text(self) -> str:
        """One line printed before the run starts."""
        return (
            f"estimate: about {clock(self.wall_hours * 3600)} and {self.gpu_hours:.2f} GPU-hours for "
            f"{self.n_trials} trials ({clock(self.per_trial_s)} per trial on {self.gpus_per_trial} GPU(s), "
            f"{self.parallel} at once; {self.source}). Early abort and screening make it less."
        )


def estimate_run(
    result: Any, n_trials: int, gpus_per_trial: int, parallel: int, source: str
) -> RunEstimate | None:
    """A run's estimate from one trial's result (e.g. the baseline replayed on the simulator)."""
    per_trial = float(result.startup_s + result.benchmark_s + getattr(result, "saved_s", 0.0))
    if per_trial <= 0:
        return None
    return RunEstimate(per_trial, max(1, gpus_per_trial), n_trials, max(1, parallel), source)
