"""What a run cost and what its recommendation costs to deploy: GPU-hours spent and saved (a simulated
run's also as time on the user's GPUs), replicas for a target request rate, $/Mtok at a GPU price (the
estimate shown before a real-GPU run: autotune/outputs/estimate.py).

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

from autotune.core.config import gpus_per_replica
from autotune.core.values import counted
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
    gpus: int = 0  # the GPUs the run was given (--gpus; 0: not given)
    gpu: str = ""  # their type
    repeats_h: float = 0.0  # of spent_h: re-measuring the top configs and the baseline
    widest: int = 1  # the most GPUs one trial took (core.config.gpus_per_replica)
    longest_s: float = 0.0  # the longest one trial ran (its GPU time over its GPUs): no run is shorter

    def text(self) -> str:
        """One sentence for the run summary and the report."""
        kind = "simulated " if self.simulated else ""
        saved = []
        if self.aborted:
            saved.append(f"{self.saved_abort_h:.2f} h by early abort ({counted(self.aborted, 'trial')})")
        if self.screened:
            not_launched = f"{counted(self.screened, 'config')} not launched"
            saved.append(f"{self.saved_screen_h:.2f} h by screening ({not_launched})")
        tail = f"; saved about {' and '.join(saved)}" if saved else ""
        repeats = f", {self.repeats_h:.2f} of them re-measuring the top configs" if self.repeats_h else ""
        return f"{kind}GPU time spent {self.spent_h:.2f} GPU-h{repeats}{self._on_real_gpus()}{tail}."

    def _on_real_gpus(self) -> str:
        """A simulated run's GPU-hours as time on the user's GPUs (its --gpus, else as many as its widest
        trial took: one GPU cannot run a TP=4 trial), its trials packed onto them, and no shorter than its
        longest trial."""
        if not self.simulated:
            return ""
        gpus, kind = max(1, self.gpus or self.widest), f" {self.gpu}" if self.gpu else ""
        hint = "" if self.gpus else "; --gpus N: on N"
        wall = max(self.spent_h * 3600 / gpus, self.longest_s)  # trials in parallel, at best
        on = f"about {clock(wall)} on {counted(gpus, 'GPU')}"
        return f" (on real{kind} GPUs: {on}{hint})"


def cost_view(
    records: Sequence[TrialRecord], simulated: bool, gpus: int = 0, gpu: str = "", repeats_s: float = 0.0
) -> CostView:
    """Spent and saved GPU-hours of a study's records (duplicates cost nothing) and its re-measurements
    (`repeats_s`); `gpus` of type `gpu`: what the run was given, to say a simulated run's GPU-hours as
    time on them."""
    launched_failures = [
        r.gpu_seconds for r in records if r.failure in STARTUP_FAILURES and r.launched and r.gpu_seconds > 0
    ]
    screened = sum(1 for r in records if r.screened)
    per_screened = statistics.median(launched_failures) if launched_failures else 0.0
    return CostView(
        spent_h=(sum(r.gpu_seconds for r in records) + repeats_s) / 3600,
        saved_abort_h=sum(r.gpu_seconds_saved for r in records) / 3600,
        saved_screen_h=screened * per_screened / 3600,
        aborted=sum(1 for r in records if r.gpu_seconds_saved > 0),
        screened=screened,
        simulated=simulated,
        gpus=gpus,
        gpu=gpu,
        repeats_h=repeats_s / 3600,
        widest=max((gpus_per_replica(r.config) for r in records if r.launched), default=1),
        longest_s=max((r.gpu_seconds / gpus_per_replica(r.config) for r in records), default=0.0),
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
    simulated: bool = False  # the per-replica rate comes from the simulated engine

    def text(self) -> str:
        """One sentence for the report."""
        bound = "" if self.capacity_known else " at most (measured at a fixed load, not at capacity)"
        sim = " (simulated: confirm the rate on a GPU)" if self.simulated else ""
        price = f"; ${self.usd_per_mtok:,.2f} per million output tokens{sim}" if self.usd_per_mtok else sim
        return (
            f"{self.target_rate:g} req/s: {counted(self.replicas, 'replica')}{bound} x "
            f"{counted(self.gpus // self.replicas, 'GPU')} = {counted(self.gpus, 'GPU')} (one replica serves "
            f"{self.per_replica_rate:.2f} req/s within the SLOs)"
            f"{price}."
        )


def sizing(
    best: TrialRecord, target_rate: float, gpu_price: float | None = None, simulated: bool = False
) -> Sizing | None:
    """Replicas and GPUs to serve `target_rate` req/s with the recommended trial; None without a rate
    (`simulated`: its rate comes from the simulated engine, and the sizing says so)."""
    # a capacity trial's rate is its capacity (0: no rate passed, nothing to size); else its fixed load's:
    # the rate offered when it kept up (completions over the run's duration count its drain as idle time)
    known = best.capacity is not None
    rate = best.capacity.rate if known else float(best.metrics.get("request_throughput") or 0.0)
    steady = best.load.steady if best.load is not None else None
    if not known and steady is not None and steady.kept_up:
        rate = max(rate, steady.offered_rate)
    if rate <= 0 or target_rate <= 0:
        return None
    replicas = math.ceil(target_rate / rate)
    gpus = gpus_per_replica(best.config)
    usd = None
    completed = best.metrics.get("completed") or 0
    out_tokens = best.metrics.get("total_output_tokens") or 0
    if gpu_price and completed and out_tokens:
        tokens_per_hour = target_rate * (out_tokens / completed) * 3600
        usd = gpu_price * replicas * gpus / (tokens_per_hour / 1e6)
    return Sizing(target_rate, rate, replicas, replicas * gpus, known, usd, simulated)
