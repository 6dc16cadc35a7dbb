"""The outcome of a capacity search (autotune/trial/capacity.py): the highest rate that passed, how
finely the search knows it, why it stopped, and every rate it probed (the report plots them)."""

from __future__ import annotations

from dataclasses import dataclass

# What limits a capacity when no SLO does: the server could not keep up with more arrivals (its
# throughput), whatever the latencies at that rate.
KEEPING_UP = "keeping up"
BUDGET_STOP = "the GPU-hour budget"  # how `stopped_by` starts where the run's budget cut the search short


@dataclass(frozen=True)
class ProbeSummary:
    """One probed rate: its last window's figures, its windows' worst p99s, and the verdict on all of
    its windows."""

    rate: float
    served_rate: float | None = None
    backlog_growth: float | None = None
    backlog_filling: float | None = None
    kept_up: bool | None = None
    p99_ttft_ms: float | None = None  # the highest of its windows' (the verdict pools them all)
    p99_itl_ms: float | None = None
    meets_slos: bool = False
    verdict: str | None = None  # PASS, FAIL or UNSURE (autotune/measure/evidence.py)
    windows: int | None = None  # windows measured and pooled
    requests: int | None = None  # measured in its last window
    pooled_with: tuple[float, ...] | None = None  # the rates whose windows made it pass
    failure: str | None = None  # the failure kind of its last window
    # what it did not meet (None: it passed): KEEPING_UP, the SLOs not met with confidence, or a failure
    short_of: tuple[str, ...] | None = None
    # of short_of on a failed probe, the SLOs it did not miss, only did not confirm (None: none, or a
    # study before it, whose short_of names them all)
    unconfirmed: tuple[str, ...] | None = None


@dataclass(frozen=True)
class BurstSummary:
    """A saturation burst as the guide can replay it (tune/guide_check.py): its size and seed (the same
    requests, from the workload spec) and what it measured (vllm bench serve keys)."""

    requests: int
    seed: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class CapacityReport:
    """A capacity search's outcome. The trial's metrics are the window at `rate`, with throughputs set
    to the sustained ones at that rate; the window's own throughputs are kept in `measured_*`."""

    rate: float  # the highest passing rate (req/s); 0: none passed
    kept_up: bool | None  # the search's verdict at `rate` (None: nothing passed, the lowest's window)
    bracket: tuple[float, float] | None  # (rate, the lowest rate above it that did not pass, or the top)
    resolution: float | None  # the bracket's width relative to its bottom (None: nothing passed)
    bound_measured: bool  # the bracket's top is a probe that failed, not the saturation estimate
    saturation_throughput: float | None
    goodput: float | None  # the window's request goodput
    probes: tuple[ProbeSummary, ...] = ()
    measured_request_throughput: float | None = None  # the window's own (None: no rate passed)
    measured_output_throughput: float | None = None
    measured_total_token_throughput: float | None = None
    stopped_by: str | None = None  # why the search stopped short (the server died or hung, BUDGET_STOP)
    window_s: tuple[float, float] | None = None  # the planned warm-up and window (seconds)
    # what keeps it from being higher: the rate above it fell short of these (KEEPING_UP, SLOs), or
    # KEEPING_UP when above it lies only the saturation throughput; None: not known (an old study)
    limited_by: tuple[str, ...] | None = None
    bursts: tuple[BurstSummary, ...] = ()  # the saturation bursts that opened the search, in order

    @property
    def cut_by_budget(self) -> bool:
        """Whether the run's GPU-hour budget stopped the search (its rate is then a lower bound)."""
        return bool(self.stopped_by and self.stopped_by.startswith(BUDGET_STOP))
