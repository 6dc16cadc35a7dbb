"""A capacity probe: the windows measured at one rate, and the verdict on them.

A rate passes when the server kept up with it and every SLO holds with confidence over the windows
measured at it (`probe_verdict`), or, when those cannot tell, over its windows pooled with those of
the probes just above it, scaled to its rate (`pool_upward`). autotune/capacity.py runs the search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.backends.base import TrialResult
from autotune.evidence import FAIL, PASS, UNSURE, Criterion, Z, from_info, judge, pool
from autotune.slo import Slo

# Above the saturation rate, whatever the backlog's noise allowance, a probe must have served this share
# of the rate asked for: near saturation the count's memory is long and its noise estimate huge (a probe
# serving 90 % of its load was allowed 12 % of growth), while a user checking the rate with
# `vllm bench serve` wants >= 95 %.
MIN_SERVED = 0.96
# Below saturation the saturation run is the evidence that the server keeps up: a window's own backlog
# count wanders too slowly to tell a 2 % shortfall in 1,000 requests (a config with 256 sequences
# "served" 95.6 % at 95 % of its saturation rate, and 100.0 % over 10,000 requests). Only a window that
# served less than this share says the estimate was wrong.
GROSS_SHORTFALL = 0.9
UPWARD_STEPS = 4  # an unsure rate may pool the windows of probes up to (1 + resolution)^this above it


@dataclass
class Probe:
    """One measured rate: every window it took, the verdict on them, and how that verdict was reached."""

    rate: float
    runs: list[TrialResult] = field(default_factory=list)
    own: str = UNSURE  # the verdict on its own windows, pooled: PASS, FAIL or UNSURE (a miss)
    verdict: str = UNSURE  # `own`, or PASS on the evidence of the probes just above it (pool_upward)
    pooled: list[float] = field(default_factory=list)  # the rates whose windows made it pass

    @property
    def result(self) -> TrialResult:
        """Its last window."""
        return self.runs[-1]

    @property
    def windows(self) -> int:
        """Windows measured and pooled."""
        return len(self.runs)

    @property
    def passed(self) -> bool:
        """Whether the rate is sustained with every SLO met (with confidence)."""
        return self.verdict == PASS

    def to_info(self) -> dict[str, Any]:
        """What the trial's `capacity_probes` attr keeps of it (the report plots these)."""
        bench = self.result.benchmark
        info = self.result.info
        return {
            "rate": round(self.rate, 4),
            "served_rate": info.get("served_rate"),
            "backlog_growth": info.get("backlog_growth"),
            "backlog_filling": info.get("backlog_filling"),
            "kept_up": info.get("kept_up"),
            "p99_ttft_ms": round(bench.latency_ms["ttft"]["p99"], 2) if bench else None,
            "p99_itl_ms": round(bench.latency_ms["itl"]["p99"], 2) if bench else None,
            "meets_slos": self.passed,
            "verdict": self.verdict,
            "windows": self.windows,
            "requests": bench.completed if bench else None,  # measured in its last window
            "pooled_with": self.pooled or None,
            "failure": str(self.result.failure) if self.result.failure else None,
        }


def meets(result: TrialResult, slos: Sequence[Slo]) -> bool:
    """A complete benchmark that kept up with its load (when it had one) and met every SLO."""
    if not result.ok or result.info.get("kept_up") is False:
        return False
    return all(slo.margin(result.benchmark) <= 0 for slo in slos)  # type: ignore[arg-type]


def probe_verdict(
    runs: Sequence[TrialResult],
    slos: Sequence[Slo],
    z: float = Z,
    min_served: float = MIN_SERVED,
    rate: float | None = None,
    saturation: float | None = None,
) -> str:
    """PASS, FAIL or UNSURE for a probe's runs at one `rate`: in each the server must have kept up and
    served `min_served` of the rate, and every SLO hold by `z` standard errors over their pooled
    windows (a backend that gave no evidence is judged on the last run's point values).

    A rate at or below the `saturation` throughput is known to be sustainable: its windows fail only on
    a gross shortfall (GROSS_SHORTFALL, counting what a filling server still adds as served). Above it
    the window must show it kept up, and served `min_served` of the rate asked for, not of the arrivals
    it happened to get (400 Poisson arrivals scatter by 5 %: a window 5 % over saturation that drew 5 %
    fewer looked kept up), with no credit for filling (in an overload the lifetimes it is computed
    from grow too)."""
    below = rate is not None and saturation is not None and rate <= saturation
    for result in runs:
        if not result.ok or (not below and result.info.get("kept_up") is False):
            return FAIL
        info = result.info
        served = info.get("served_rate")
        if below and _served_share(info) < GROSS_SHORTFALL:
            return FAIL
        if not below and served is not None and served < min_served * (rate or info.get("offered_rate") or 0):
            return FAIL
    evidence = [r.info.get("slo_evidence") for r in runs]
    if any(e is None for e in evidence):
        return PASS if meets(runs[-1], slos) else FAIL
    return judge(pool([from_info(e) for e in evidence]), z)


def _served_share(info: dict[str, Any]) -> float:
    """The share of its arrivals a window served, counting what a server that keeps up still adds to
    its requests as it fills as served (1.0 when the backend did not say)."""
    offered, served = info.get("offered_rate"), info.get("served_rate")
    if not offered or served is None:
        return 1.0
    return served / offered + (info.get("backlog_filling") or 0.0)


def pool_upward(probes: Sequence[Probe], slos: Sequence[Slo], resolution: float, z: float = Z) -> None:
    """Let an unsure rate pass on the evidence of the probes just above it, when that is enough.

    A percentile SLO's share of samples over its limit grows at least in proportion to the rate (it is
    0 at no load and convex: more requests, each in a busier server), so the share at a rate q above r,
    scaled by r / q, bounds the share at r from above; a mean SLO's margin just grows with the rate.
    The windows of rates in [r, r x (1 + resolution)^UPWARD_STEPS], scaled so, pooled, overstate the
    margin at r: if even they pass with confidence, r does. Near a threshold that moves slowly with the
    rate (an ITL tail from prefills interleaved with decodes), unsure neighbours pooled tell what none
    could, without another window. Only the rate's own runs decide whether the server kept up.
    """
    allowed = {s.name: s.allowed_share for s in slos}
    for p in probes:
        if p.own != UNSURE:
            continue
        near = [q for q in probes if p.rate <= q.rate <= p.rate * (1 + resolution) ** UPWARD_STEPS]
        windows = [(q.rate, r.info.get("slo_evidence")) for q in near for r in q.runs]
        if len(near) < 2 or any(e is None for _, e in windows):
            continue
        scaled = [[_scaled(c, allowed.get(c.name), p.rate / q) for c in from_info(e)] for q, e in windows]
        if judge(pool(scaled), z) == PASS:
            p.verdict = PASS
            p.pooled = [round(q.rate, 4) for q in near if q is not p]


def _scaled(c: Criterion, allowed: float | None, factor: float) -> Criterion:
    """A percentile criterion's share over its limit x `factor` (its margin is share - allowed);
    a mean's as it is."""
    if allowed is None:
        return c
    return Criterion(c.name, (c.margin + allowed) * factor - allowed, c.error * factor, c.samples)
