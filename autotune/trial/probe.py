"""A capacity probe: the windows measured at one rate, and the verdict on them.

A rate passes when the server kept up with it and every SLO holds with confidence over the windows
measured at it (`probe_verdict`), or, when those cannot tell, over its windows pooled with those of
the probes around it (`pool_nearby`). autotune/trial/capacity.py runs the search.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.core.errors import FailureKind
from autotune.measure.capacity_report import KEEPING_UP, ProbeSummary
from autotune.measure.evidence import (
    CLUSTERED,
    FAIL,
    PASS,
    UNSURE,
    Criterion,
    Z,
    episode_size,
    floored,
    judge,
    pool,
)
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.measure.steady_state import relaxation_s

# Above the saturation rate a probe must have served this share of the rate asked for, whatever the
# backlog's noise allowance (huge near saturation): a user checking the rate wants >= 95 % served.
MIN_SERVED = 0.96
# Below saturation the saturation run is the evidence that the server keeps up (a window's backlog count
# wanders too slowly to tell a 2 % shortfall): only a window that served less than this share fails.
GROSS_SHORTFALL = 0.9
# An unsure rate may pool the windows of probes within this ratio of it: the bisection's first step
# after a 0.7x step down lands 1.2x from either end.
NEAR_SPAN = 1.2
EPISODE_WINDOWS = 3.0  # windows with a share over this x the allowed one show a standing queue, not episodes


@dataclass
class Probe:
    """One measured rate: every window it took, the verdict on them, and how that verdict was reached."""

    rate: float
    runs: list[TrialResult] = field(default_factory=list)
    own: str = UNSURE  # the verdict on its own windows, pooled: PASS, FAIL or UNSURE (a miss)
    verdict: str = UNSURE  # `own`, or PASS on the evidence of the probes around it (pool_nearby)
    pooled: list[float] = field(default_factory=list)  # the rates whose windows made it pass
    short_of: tuple[str, ...] = ()  # what it did not meet: KEEPING_UP, SLOs (str), or its failure
    # of short_of on a failed probe, the SLOs only not confirmed (too close to call), not missed: a
    # rate that missed its ITL limit need not have missed its TTFT one too
    unsure: tuple[str, ...] = ()

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

    @property
    def missed(self) -> tuple[str, ...]:
        """What it fell short of, less the SLOs it left unsure on a failed probe (`unsure`)."""
        return tuple(s for s in self.short_of if s not in self.unsure)

    def summary(self) -> ProbeSummary:
        """What the trial's capacity report keeps of it (the report plots these)."""
        bench = self.result.benchmark
        load = self.result.load
        steady = load.steady if load is not None else None
        return ProbeSummary(
            rate=round(self.rate, 4),
            served_rate=steady.served_rate if steady else None,
            backlog_growth=steady.backlog_growth if steady else None,
            backlog_filling=steady.backlog_filling if steady else None,
            kept_up=self.result.kept_up,
            p99_ttft_ms=self._worst_p99("ttft"),
            p99_itl_ms=self._worst_p99("itl"),
            meets_slos=self.passed,
            verdict=self.verdict,
            windows=self.windows,
            requests=bench.completed if bench else None,  # measured in its last window
            pooled_with=tuple(self.pooled) or None,
            failure=str(self.result.failure) if self.result.failure else None,
            short_of=None if self.passed else self.short_of,
            unconfirmed=self.unsure if self.verdict == FAIL and self.unsure else None,
        )

    def _worst_p99(self, metric: str) -> float | None:
        """The highest p99 of `metric` over its windows: the verdict pools them all, so its last
        window's alone (287 ms after 1,240 and 1,197) would stand beside an UNSURE it does not explain."""
        values = [r.benchmark.latency_ms[metric]["p99"] for r in self.runs if r.benchmark is not None]
        return round(max(values), 2) if values else None


def meets(result: TrialResult, slos: Sequence[Slo]) -> bool:
    """A complete benchmark that kept up with its load (when it had one) and met every SLO."""
    if not result.ok or result.kept_up is False:
        return False
    return all(slo.margin(result.benchmark) <= 0 for slo in slos)  # type: ignore[arg-type]


def probe_verdict(runs: Sequence[TrialResult], slos: Sequence[Slo], **options: Any) -> str:
    """PASS, FAIL or UNSURE for a probe's runs at one rate: `judged`'s verdict (`options` are its)."""
    return judged(runs, slos, **options)[0]


def judged(
    runs: Sequence[TrialResult],
    slos: Sequence[Slo],
    z: float = Z,
    min_served: float = MIN_SERVED,
    rate: float | None = None,
    saturation: float | None = None,
    fail_z: float | None = None,
    episodes: Mapping[str, float] | None = None,
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """PASS, FAIL or UNSURE for a probe's runs at one `rate`; what it fell short of: KEEPING_UP when
    the server did not keep up, else the SLOs not met with confidence (str, e.g. "ttft_p99=2s"), or
    the failure of a window that ended without metrics (e.g. "crashed"); nothing when it passed; and,
    when it failed, those of the SLOs that were only unsure (neither met nor missed with confidence).

    In each run the server must have kept up and served `min_served` of the rate, and every SLO hold by
    `z` standard errors over their pooled windows (a backend that gave no evidence is judged on the last
    run's point values); a miss needs `fail_z` errors (default z), and a clustered SLO's windows are
    never surer than its `episodes` (samples per tail event, see `judge_probes`) allow.

    A rate at or below the `saturation` throughput is known to be sustainable: its windows fail only on
    a gross shortfall (GROSS_SHORTFALL, counting what a filling server still adds as served). Above it
    the window must show it kept up, and served `min_served` of the rate asked for, not of the arrivals
    it happened to get (400 Poisson arrivals scatter by 5 %: a window 5 % over saturation that drew 5 %
    fewer looked kept up), with no credit for filling (in an overload the lifetimes it is computed
    from grow too)."""
    for result in runs:
        missed = _load_miss(result, slos, min_served, rate, saturation)
        if missed:
            return FAIL, missed, ()
    evidence = [_evidence(r) for r in runs]
    if any(e is None for e in evidence):
        missed = _point_misses(runs[-1], slos)
        return (FAIL, missed, ()) if missed else (PASS, (), ())
    allowed = {s.name: s.allowed_share for s in slos}
    criteria = pool([_criteria(e or (), allowed, episodes) for e in evidence])
    verdict = judge(criteria, z, fail_z)
    texts = {s.name: str(s) for s in slos}
    unmet = tuple(texts.get(c.name, c.name) for c in criteria if c.verdict(z, fail_z) != PASS)
    if verdict == PASS:
        return PASS, (), ()
    # an unsure probe's SLOs are all unsure (its verdict says so); a failed one's may be either
    unsure = tuple(texts.get(c.name, c.name) for c in criteria if c.verdict(z, fail_z) == UNSURE)
    return verdict, unmet, unsure if verdict == FAIL else ()


def keeps_up(result: TrialResult, rate: float, saturation: float | None) -> bool:
    """Whether one completed window at `rate` passes the search's rule on keeping up (`_load_miss`, no
    SLO): at or below the `saturation` throughput a backlog that grew past the count's allowance still
    passes unless the window served under GROSS_SHORTFALL of its arrivals."""
    return KEEPING_UP not in _load_miss(result, (), MIN_SERVED, rate, saturation)


def _load_miss(
    result: TrialResult, slos: Sequence[Slo], min_served: float, rate: float | None, saturation: float | None
) -> tuple[str, ...]:
    """Why one window fails its probe whatever the SLOs say: it ended without metrics (its failure; an
    early abort: the SLOs it lost), or the server did not keep up (KEEPING_UP); () when neither."""
    below = rate is not None and saturation is not None and rate <= saturation
    if not result.ok:
        if result.failure is FailureKind.EARLY_ABORT or result.failure is None:
            return tuple(str(s) for s in slos if s.key in result.message) or (KEEPING_UP,)
        return (str(result.failure),)
    if not below and result.kept_up is False:
        return (KEEPING_UP,)
    steady = result.load.steady if result.load is not None else None
    if below and steady is not None and steady.served_share() < GROSS_SHORTFALL:
        return (KEEPING_UP,)
    if not below and steady is not None and steady.served_rate < min_served * (rate or steady.offered_rate):
        return (KEEPING_UP,)
    return ()


def _point_misses(result: TrialResult, slos: Sequence[Slo]) -> tuple[str, ...]:
    """The SLOs a run's point values miss (no evidence to judge them by), or KEEPING_UP."""
    if not result.ok or result.kept_up is False:
        return (KEEPING_UP,)
    return tuple(str(s) for s in slos if s.margin(result.benchmark) > 0)  # type: ignore[arg-type]


def _evidence(result: TrialResult) -> tuple[Criterion, ...] | None:
    """A window's SLO evidence (None: its backend gave none, or it was not an open-loop window)."""
    return result.load.slo_evidence if result.load is not None else None


def _criteria(
    evidence: Sequence[Criterion],
    allowed: Mapping[str, float | None],
    episodes: Mapping[str, float] | None,
) -> list[Criterion]:
    """A window's criteria, each clustered one floored by the episodes seen around it."""
    out = []
    for c in evidence:
        share, size = allowed.get(c.name), (episodes or {}).get(c.name, 1.0)
        out.append(floored(c, share, size) if share is not None and size > 1 else c)
    return out


def judge_probes(
    probes: Sequence[Probe],
    slos: Sequence[Slo],
    saturation: float,
    z: float = Z,
    fail_z: float | None = None,
    min_served: float = MIN_SERVED,
) -> None:
    """(Re)judge every probe on its own windows, then let unsure ones pool with their neighbours.

    A TTFT tail comes in episodes (one queue build-up delays tens of requests), and near a threshold
    most 1,000-request windows hold none: a window without one looks surer than it is (a 70B config
    passed 0.58 req/s on a 1,000-request window without one request over a 5 s limit, where
    10,000-request runs put 0.6 % of requests over it at 0.55 req/s and 1.2 % at 0.60). The
    episodes' size is seen in the windows that did hold one, at the rate or just above it (more load,
    larger episodes): so each window at a rate is judged as if its samples came in episodes as large
    as the largest seen within NEAR_SPAN above it, scaled down to its rate (`_excursion`), among
    windows near the threshold (a share of at most EPISODE_WINDOWS x the allowed one; further over,
    the tail is a standing queue). As probes arrive, an earlier verdict may change."""
    for p in probes:
        episodes = _episodes(p, probes, slos, saturation)
        verdict = judged(p.runs, slos, z, min_served, p.rate, saturation, fail_z, episodes)
        p.own, p.short_of, p.unsure = verdict
        p.verdict = p.own
        p.pooled = []
    pool_nearby(probes, slos, saturation, z)


def _episodes(p: Probe, probes: Sequence[Probe], slos: Sequence[Slo], saturation: float) -> dict[str, float]:
    """The largest episode size of each clustered SLO in windows at p's rate up to NEAR_SPAN above,
    each scaled to p's rate: an episode lasts about the queue's relaxation time, so it holds about
    rate x relaxation time requests, which falls steeply below saturation (`_excursion`)."""
    sizes: dict[str, float] = {}
    for slo in slos:
        allowed = slo.allowed_share
        if slo.metric not in CLUSTERED or allowed is None:
            continue
        windows = [
            (q.rate, c)
            for q in probes
            if p.rate <= q.rate <= p.rate * NEAR_SPAN
            for r in q.runs
            for c in _evidence(r) or ()
            if c.name == slo.name and c.margin + allowed <= EPISODE_WINDOWS * allowed
        ]
        scaled = [max(1.0, episode_size(c, allowed) * _excursion(p.rate, q, saturation)) for q, c in windows]
        sizes[slo.name] = max(scaled, default=1.0)
    return sizes


def _excursion(rate: float, above: float, saturation: float) -> float:
    """How many requests a queue excursion holds at `rate` relative to one at `above` (rate x relaxation
    time each, see relaxation_s); 1 when `above` is not below saturation (no relaxation time there)."""
    slow = relaxation_s(above, saturation)
    return rate * relaxation_s(rate, saturation) / (above * slow) if math.isfinite(slow) else 1.0


def pool_nearby(probes: Sequence[Probe], slos: Sequence[Slo], saturation: float, z: float = Z) -> None:
    """Let an unsure rate pass on the evidence of the probes around it, when that is enough.

    Near a threshold that moves slowly with the rate (an ITL tail from prefills interleaved with
    decodes, an E2EL tail from long outputs) each window is too short to tell, and measuring one rate
    again and again until it passes picks luck. The windows of every rate within NEAR_SPAN of r tell
    together: a line through their margins against the rate (weighted by samples), read at r, with
    its error (widened when the windows scatter more than their errors say). A share over the limit
    grows with the rate and is convex in it (0 at no load; more requests, each in a busier server),
    so a line through rates on both sides of r overstates the share at r. Without a rate below r, or
    when the line falls with the rate (noise), the rates above r bound it instead:
    a share grows at least in proportion to the rate, so the share at q > r scaled by r / q is at least
    the one at r (a mean SLO's margin just grows with the rate). Only the rate's own runs decide
    whether the server kept up.
    """
    allowed = {s.name: s.allowed_share for s in slos}
    for p in probes:
        if p.own != UNSURE:
            continue
        near = [q for q in probes if p.rate / NEAR_SPAN <= q.rate <= p.rate * NEAR_SPAN]
        windows = [(q.rate, _evidence(r)) for q in near for r in q.runs]
        if not any(q.rate > p.rate for q in near) or any(e is None for _, e in windows):
            continue
        episodes = _episodes(p, probes, slos, saturation)
        points: dict[str, list[tuple[float, Criterion]]] = {}
        for q, evidence in windows:
            for c in _criteria(evidence or (), allowed, episodes):
                points.setdefault(c.name, []).append((q, c))
        criteria = [_at(p.rate, pts, allowed.get(name)) for name, pts in points.items()]
        if judge(criteria, z) == PASS:
            p.verdict = PASS
            p.pooled = [round(q.rate, 4) for q in near if q is not p]
            p.short_of = p.unsure = ()


def _at(rate: float, points: Sequence[tuple[float, Criterion]], allowed: float | None) -> Criterion:
    """One criterion at `rate` from windows at nearby rates: the line through them (`_line`), else the
    windows at or above `rate`, scaled to it, pooled."""
    line = _line(rate, points)
    if line is not None:
        return line
    return pool([[_scaled(c, allowed, rate / q)] for q, c in points if q >= rate])[0]


def _line(rate: float, points: Sequence[tuple[float, Criterion]]) -> Criterion | None:
    """The least-squares line through (rate, margin) points weighted by their samples, read at `rate`,
    its error from each window's own (weights by 1 / error^2 would favour the windows that happened to
    hold no tail event: their errors are the smallest); None without points on both sides of `rate`,
    or when it falls with the rate."""
    x = np.array([q / rate - 1.0 for q, _ in points])
    if not (x < 0).any() or not (x > 0).any():
        return None
    y = np.array([c.margin for _, c in points])
    errors = np.array([c.error for _, c in points])
    if not np.isfinite(errors).all():
        return None
    w = np.array([float(c.samples) for _, c in points])
    design = np.column_stack([np.ones_like(x), x])
    estimator = np.linalg.pinv(design.T @ (design * w[:, None])) @ (design * w[:, None]).T
    intercept, slope = estimator @ y
    if slope < 0:
        return None
    dof = len(x) - 2
    residuals = (y - design @ [intercept, slope]) / np.maximum(errors, 1e-12)
    scatter = float(np.sum(residuals**2)) / dof if dof > 0 else 1.0
    error = math.sqrt(float(np.sum((estimator[0] * errors) ** 2)) * max(1.0, scatter))
    return Criterion(points[0][1].name, float(intercept), error, sum(c.samples for _, c in points))


def _scaled(c: Criterion, allowed: float | None, factor: float) -> Criterion:
    """A percentile criterion's share over its limit x `factor` (its margin is share - allowed);
    a mean's as it is."""
    if allowed is None:
        return c
    return Criterion(c.name, (c.margin + allowed) * factor - allowed, c.error * factor, c.samples)
