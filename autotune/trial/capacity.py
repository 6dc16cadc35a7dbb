"""Capacity: the highest Poisson request rate a config sustains while it meets the SLOs.

With `load: capacity` a trial is a short search on one started server: a saturation burst bounds the rate
and sets the config's request lifetime, then Poisson probes (an unmeasured warm-up, a measured window of
several lifetimes) step down from 90 % of saturation and bisect until the bracket is within `resolution`.
With a hint (the guided search's corrected prediction of the capacity, `CapacitySearch.hint_rate`) the
probes start at the hint instead and step away from it by growing steps until a rate passes and one above
it fails, then bisect: fewer probes when the hint is close, and the verdicts still come only from probes.
A rate passes when the server kept up and every SLO holds with 95 % confidence (trial/probe.py). The
rules and why each is there: docs/measurement.md, "Load level: capacity or fixed".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.backends.base import Backend, Session
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.capacity_report import BUDGET_STOP, KEEPING_UP, CapacityReport
from autotune.measure.evidence import UNSURE, Z, sequential_z
from autotune.measure.load_report import Saturation
from autotune.measure.metrics import BenchmarkResult
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.measure.steady_state import MIN_WARMUP_S, MIN_WINDOW_S, Window, plan_window, relaxation_s
from autotune.trial.live import write_probe
from autotune.trial.probe import MIN_SERVED, Probe, judge_probes
from autotune.trial.saturation import burst_summaries, saturation_runs
from autotune.workloads.spec import WorkloadSpec

MAX_PROBES = 8  # rate probes after the saturation run
RESOLUTION = 0.03  # stop when high / low <= 1.03: below run-to-run noise on real GPUs (1-3 %) is wasted
START_FRACTION = 0.9  # the first probe, as a fraction of saturation throughput
STEP_DOWN = 0.7  # while no rate passed
UNSURE_STEP = 0.9  # ... from a rate too close to call: the threshold is near it
MIN_STEP = 0.35  # the largest step down an ITL/TPOT miss can ask for
HINT_STEP = 0.03  # a hinted search's first step away from the hint (= RESOLUTION), doubled at each probe
SMOOTH_METRICS = ("itl", "tpot")
SATURATION_MARGIN = 1.1  # bracket top = saturation throughput x this (the mid-run rate is an estimate)
MIN_RATE = 0.05  # below this the config serves nothing useful: stop stepping down
MAX_PROBE_REQUESTS = 6000  # per probe (x window scale): a very fast config gets a shorter window
MIN_WINDOW_REQUESTS = 400
TAIL_SAMPLES = 10  # a window must hold this many requests over a percentile SLO's limit at its threshold
# Below half the saturation rate a server rarely queues for long: a TTFT tail there shows in 400 requests
# (docs/evidence.md, "Capacity accuracy").
QUEUE_FREE_BELOW = 0.5
MAX_WINDOWS = 3  # an unsure probe is measured again (other windows, pooled with the first), twice
QUEUE_METRICS = ("ttft", "e2el")  # the SLOs a waiting queue's slow build-up moves
RELAXATIONS = 3.0  # a queued SLO's window: this many relaxation times (its warm-up: one)


@dataclass(frozen=True)
class CapacitySearch:
    """The search's bounds (a record so tests and the accuracy benchmark can change them)."""

    max_probes: int = MAX_PROBES
    resolution: float = RESOLUTION
    window_scale: float = 1.0  # x the window and warm-up derived from the config's dynamics
    min_warmup_s: float = MIN_WARMUP_S  # floors of the derived warm-up and window (tests lower them)
    min_window_s: float = MIN_WINDOW_S
    # p99 over fewer requests is the 2nd-4th largest value: too noisy to compare rates by (a window of
    # 140 requests overestimated a config's capacity by 33 %, 400 came within 2 % of 1,000)
    min_window_requests: int = MIN_WINDOW_REQUESTS
    max_windows: int = MAX_WINDOWS
    tail_samples: int = TAIL_SAMPLES  # see window_requests (tests over HTTP lower it)
    min_served: float = MIN_SERVED  # (and this: their windows of a second or two are too short for it)
    z: float = Z  # the confidence (standard errors) each SLO must hold by
    # Below this fraction of the saturation throughput a p99 TTFT needs no 1,000-request tail window
    # (window_requests): 400 requests see its queueing episodes. 0: every rate gets the tail window.
    queue_free_below: float = QUEUE_FREE_BELOW
    max_probe_requests: int = MAX_PROBE_REQUESTS  # per probe window and warm-up (x window_scale)
    relaxations: float = RELAXATIONS
    # A predicted capacity (req/s) to start from and bracket (None: from START_FRACTION x saturation).
    # Only where it comes from differs: every probe is measured and judged as without it.
    hint_rate: float | None = None
    hint_step: float = HINT_STEP
    # GPU seconds (per GPU) the whole search may spend, startup included (None: no cap): the guided run's
    # share of its --gpu-hours. A window that would pass it is not started (docs/measurement.md).
    max_gpu_s: float | None = None


def find_capacity(
    backend: Backend,
    config: EngineConfig,
    workload: WorkloadSpec,
    slos: Sequence[Slo],
    seed: int = 0,
    gpu_ids: Sequence[int] = (),
    trial_dir: Path | None = None,
    search: CapacitySearch = CapacitySearch(),  # noqa: B008  (frozen, so a shared default is safe)
) -> TrialResult:
    """Search the highest sustained SLO-meeting rate for `config`: the result at it, the search in its
    `capacity` report.

    Every rate is measured on one server (one backend session), so the trial pays one startup.
    """
    with backend.session(config, gpu_ids, trial_dir) as session:
        return _search(session, config, workload, slos, seed, search, trial_dir)


def _search(
    session: Session,
    config: EngineConfig,
    workload: WorkloadSpec,
    slos: Sequence[Slo],
    seed: int,
    search: CapacitySearch,
    trial_dir: Path | None = None,
) -> TrialResult:
    workload = workload.with_rate_arrivals()
    sat_runs = saturation_runs(session, config, workload, seed, search.max_gpu_s)
    sat_result = sat_runs[-1]
    sat = _saturation(sat_result)
    if not sat_result.ok or not sat or sat.throughput <= 0:
        # Did not start, could not serve at all, or the cap left no room to saturate it: no rate will
        # help, and the reason is the trial's.
        return _annotate(sat_result, [], sat_runs, None, None, 0.0)
    window = plan_window(sat.lifetime_s, search.window_scale, search.min_warmup_s, search.min_window_s)
    top = SATURATION_MARGIN * sat.throughput
    queued_slos = any(s.metric in QUEUE_METRICS for s in slos)
    if queued_slos:
        top = min(top, queue_ceiling(sat.throughput, window, search))

    # Up to max_windows looks at a rate: each must clear a higher bar for the rate to pass with the
    # confidence `z` asks for (a miss is told at `z` itself: a false miss costs capacity, not a promise).
    pass_z = sequential_z(search.max_windows, search.z)

    def plan_at(rate: float) -> Window:
        queued = rate >= search.queue_free_below * sat.throughput
        requests = window_requests(slos, search.min_window_requests, search.tail_samples, queued)
        settle = relaxation_s(rate, sat.throughput) if queued_slos else 0.0
        return _probe_window(window, rate, search, requests, settle)

    def affords(rate: float) -> bool:
        """Whether the cap leaves room for a window at `rate`: its load and its last requests' drain."""
        if search.max_gpu_s is None:
            return True
        spent = sum(r.gpu_seconds for r in (*sat_runs, *(r for p in probes for r in p.runs)))
        return spent + plan_at(rate).end + sat.lifetime_s <= search.max_gpu_s

    def measure(p: Probe) -> None:
        """Another window at the probe's rate (of other requests: seed), judged with its earlier ones."""
        write_probe(trial_dir, len(probes), search.max_probes, p.rate)  # for the progress line
        plan = plan_at(p.rate)
        load = workload.with_load(
            request_rate=p.rate, num_requests=max(1, math.ceil(p.rate * plan.end)), measure_from=plan.start
        )
        # Every window gets other requests: the same ones at each rate would make every probe as lucky as
        # the first, and the windows that pool_nearby pools would not be independent.
        p.runs.append(session.measure(load, slos, seed + sum(q.windows for q in probes)))
        judge_probes(probes, slos, sat.throughput, pass_z, search.z, search.min_served)

    probes: list[Probe] = []
    rate: float | None = min(search.hint_rate or START_FRACTION * sat.throughput, top)
    capped = False
    while rate is not None and len(probes) < search.max_probes:
        if capped := not affords(rate):
            break
        probes.append(Probe(rate))
        measure(probes[-1])
        # A window too close to call is measured again, and the windows pooled.
        while probes[-1].own == UNSURE and probes[-1].windows < search.max_windows and session.alive:
            if capped := not affords(rate):
                break
            measure(probes[-1])
        if capped or not session.alive:
            break  # the cap is reached, or the server died or hung: no other rate can be measured on it
        following = _next_hinted_rate if search.hint_rate else _next_rate
        rate = following(probes, *_bracket(probes, top), search, slos)
    low, high = _bracket(probes, top)
    lowest = min(probes, key=lambda p: p.rate).result if probes else sat_result  # no probe: cut at once
    best = low.result if low is not None else lowest
    annotated = _annotate(best, probes, sat_runs, low, high, top)
    stopped_by = None
    if capped:
        cap_h = (search.max_gpu_s or 0.0) / 3600
        stopped_by = f"{BUDGET_STOP}: a window more would pass this trial's {cap_h:.2f} GPU-h per GPU"
        if low is None:  # no verdict: the trial is told as cut short, not as missing the SLOs
            annotated.failure, annotated.message = FailureKind.BUDGET_SPENT, stopped_by
    elif not session.alive and probes[-1].result is not best:
        # Say why the search stopped short (e.g. an OOM under load at a higher rate).
        last = probes[-1].result
        stopped_by = f"{last.failure}: {last.message}"
    window_s = (round(window.start, 2), round(window.length, 2))
    assert annotated.capacity is not None
    bursts = burst_summaries(sat_runs, seed)
    annotated.capacity = dataclasses.replace(
        annotated.capacity, stopped_by=stopped_by, window_s=window_s, bursts=bursts
    )
    return annotated


def _saturation(result: TrialResult) -> Saturation | None:
    """The saturation figures of a burst's result (None: too few completions, or not a burst)."""
    return result.load.saturation if result.load is not None else None


def _bracket(probes: Sequence[Probe], top: float) -> tuple[Probe | None, float]:
    """The highest passing probe, and the lowest rate above it that did not pass (else `top`)."""
    low = max((p for p in probes if p.passed), key=lambda p: p.rate, default=None)
    floor = low.rate if low is not None else 0.0
    return low, min((p.rate for p in probes if not p.passed and p.rate > floor), default=top)


def _next_rate(
    probes: Sequence[Probe], low: Probe | None, high: float, search: CapacitySearch, slos: Sequence[Slo]
) -> float | None:
    """The next rate to probe, or None once the bracket is as fine as it will get.

    While nothing passed, the rate steps down from the lowest probe (see `step_down`; by UNSURE_STEP
    from one too close to call, which the threshold is near); then geometric
    bisection until the bracket is within `resolution`, or within twice that when the last probe was
    unsure (the threshold lies within the measurement's noise there: a rate between would be unsure too).
    """
    if low is None:
        lowest = min(probes, key=lambda p: p.rate)
        complete = lowest.result.benchmark if lowest.result.ok else None
        step = UNSURE_STEP if lowest.verdict == UNSURE else step_down(complete, slos)
        rate = lowest.rate * step
        return rate if rate >= MIN_RATE else None
    if high / low.rate <= 1 + search.resolution:
        return None
    if probes[-1].verdict == UNSURE and high / low.rate <= (1 + search.resolution) ** 2:
        return None
    return math.sqrt(low.rate * high)


def _next_hinted_rate(
    probes: Sequence[Probe], low: Probe | None, high: float, search: CapacitySearch, slos: Sequence[Slo]
) -> float | None:
    """The next rate of a hinted search: away from the hint by hint_step, 2 x hint_step, ... (a step
    per probe on that side) until a rate passes and a higher one fails; then `_next_rate`'s bisection.
    Down, an ITL/TPOT miss large enough to ask for a bigger step (`step_down`) gets it."""
    if low is None:
        lowest = min(probes, key=lambda p: p.rate)
        factor = 1.0 / (1.0 + search.hint_step * 2 ** (len(probes) - 1))
        if lowest.verdict != UNSURE and lowest.result.ok:
            smooth = step_down(lowest.result.benchmark, slos)
            factor = min(factor, smooth) if smooth < STEP_DOWN else factor
        rate = lowest.rate * factor
        return rate if rate >= MIN_RATE else None
    if any(not p.passed and p.rate > low.rate for p in probes):
        return _next_rate(probes, low, high, search, slos)  # bracketed: bisect
    passed = sum(p.passed for p in probes)
    up = low.rate * (1.0 + search.hint_step * 2 ** (passed - 1))
    if up < high:
        return up
    return _next_rate(probes, low, high, search, slos)  # the step reaches the top: bisect below it


def window_requests(
    slos: Sequence[Slo],
    floor: int = MIN_WINDOW_REQUESTS,
    tail_samples: int = TAIL_SAMPLES,
    queued: bool = True,
) -> int:
    """How many requests a probe's window needs: `floor`, or enough that a per-request percentile SLO
    at its threshold has `tail_samples` requests over the limit (1,000 for a p99 TTFT): its tail comes in
    rare queueing episodes, and a 400-request window that held none passed rates that a 4,000-request
    run missed by 2x. ITL pools every token gap, so its tail is seen in far fewer requests. Without
    `queued` (a rate far below saturation, see CapacitySearch.queue_free_below) TTFT is exempt too:
    queueing episodes there are short and frequent, not rare; TPOT and E2EL tails come from the
    requests' own lengths at any load and keep the rule."""
    exempt = ("itl",) if queued else ("itl", "ttft")
    shares = [s.allowed_share for s in slos if s.metric not in exempt]
    return max([floor, *(math.ceil(tail_samples / q) for q in shares if q)])


def step_down(benchmark: BenchmarkResult | None, slos: Sequence[Slo]) -> float:
    """How far to lower the rate after a failed probe (its complete `benchmark`, else None) while none
    has passed yet.

    ITL and TPOT grow smoothly with the load (the batch grows with the rate), so missing one by a factor
    says roughly how far the rate must fall: 1 / (1 + margin), between MIN_STEP and STEP_DOWN. TTFT
    explodes only near capacity (its margin says nothing about the distance), so other misses step by
    STEP_DOWN.
    """
    smooth = [s.margin(benchmark) for s in slos if s.metric in SMOOTH_METRICS] if benchmark else []
    miss = max(smooth, default=0.0)
    return min(STEP_DOWN, max(MIN_STEP, 1.0 / (1.0 + miss))) if miss > 0 else STEP_DOWN


def queue_ceiling(saturation: float, window: Window, search: CapacitySearch) -> float:
    """The highest rate whose queue relaxes within the longest probe there may be (a warm-up and a
    window of one relaxation time each, search.max_probe_requests in all): above it a TTFT or E2EL SLO
    cannot be confirmed, so it is not probed."""
    low, high = 0.0, saturation
    for _ in range(40):  # bisection: the relaxation time grows with the rate, the window shrinks
        mid = (low + high) / 2
        start, length = _settled(window.start, relaxation_s(mid, saturation), search)
        fits = mid * (start + length) <= search.max_probe_requests * search.window_scale
        low, high = (mid, high) if fits else (low, mid)
    return low


def _settled(start: float, settle_s: float, search: CapacitySearch) -> tuple[float, float]:
    """The warm-up's end and the shortest window a queue that relaxes in `settle_s` needs: a warm-up of
    at least one relaxation time and a window of `relaxations` (both x window_scale)."""
    settle = settle_s * search.window_scale
    return max(start, settle), search.relaxations * settle


def _probe_window(
    window: Window, rate: float, search: CapacitySearch, min_requests: int, settle_s: float = 0.0
) -> Window:
    """`window` at `rate`: long enough for `min_requests` measured requests and for the queue to settle
    (`settle_s`, see relaxation_s), and shortened (warm-up too, in proportion) when the probe would send
    more than search.max_probe_requests x scale."""
    scale = search.window_scale
    start, settled_length = _settled(window.start, settle_s, search)
    length = max(window.length, min_requests * scale / rate, settled_length)
    window = Window(start, start + length)
    cap = search.max_probe_requests * scale
    if rate * window.end <= cap:
        return window
    factor = cap / (rate * window.end)
    return Window(window.start * factor, window.end * factor)


def _annotate(
    best: TrialResult,
    probes: list[Probe],
    sat_runs: list[TrialResult],
    low: Probe | None,
    high: float | None,
    top: float,
) -> TrialResult:
    """Sum the GPU time of every run (one startup, saturation, probes) into the result, set sustained
    throughputs, record the search."""
    sat = sat_runs[-1]
    runs = [*sat_runs, *(r for p in probes for r in p.runs)]
    best.startup_s = sum(r.startup_s for r in runs)
    best.benchmark_s = sum(r.benchmark_s for r in runs)
    best.saved_s = sum(r.saved_s for r in runs)
    capacity = low.rate if low is not None else 0.0
    bench = best.benchmark
    goodput = bench.request_goodput if bench is not None else None
    own = bench if bench is not None and capacity > 0 and bench.completed else None  # the window's
    if own is not None:
        per_request_out = own.total_output_tokens / own.completed
        per_request_all = (own.total_input_tokens + own.total_output_tokens) / own.completed
        # goodput too, as the share of the window's requests that met the SLOs: it cannot pass throughput
        good_share = own.request_goodput / own.request_throughput if own.request_goodput is not None else None
        best.benchmark = dataclasses.replace(
            own,
            request_throughput=capacity,
            output_throughput=capacity * per_request_out,
            total_token_throughput=capacity * per_request_all,
            request_goodput=capacity * good_share if good_share is not None else None,
        )
    saturation = _saturation(sat)
    best.capacity = CapacityReport(
        rate=round(capacity, 4),
        # The search's verdict at the reported rate, not its window's backlog trend alone: below the
        # saturation rate the saturation run is the evidence (probe_verdict). No rate: the lowest's.
        kept_up=True if capacity > 0 else best.kept_up,
        bracket=(round(capacity, 4), round(high, 4)) if high else None,
        # How finely capacity is known: the bracket's width relative to its bottom (None: nothing passed).
        resolution=round(high / capacity - 1, 4) if high and capacity > 0 else None,
        bound_measured=bool(high is not None and high < top),
        saturation_throughput=saturation.throughput if saturation is not None else None,
        goodput=round(goodput, 4) if goodput is not None else None,
        probes=tuple(p.summary() for p in probes),
        measured_request_throughput=round(own.request_throughput, 4) if own else None,
        measured_output_throughput=round(own.output_throughput, 4) if own else None,
        measured_total_token_throughput=round(own.total_token_throughput, 4) if own else None,
        limited_by=_limited_by(probes, low, high),
    )
    return best


def _limited_by(probes: Sequence[Probe], low: Probe | None, high: float | None) -> tuple[str, ...] | None:
    """What keeps capacity from being higher: what the lowest failed rate above it fell short of (a
    failed rate's missed SLOs, not those it only left unsure), or keeping up when above it lies only the
    saturation throughput (the bracket's top is an estimate from the saturation run, or the rate past
    which a queue cannot settle within a probe); without a passing rate, what the lowest probe fell
    short of (None: nothing was probed)."""
    if low is None:
        lowest = min(probes, key=lambda p: p.rate, default=None)
        return (lowest.missed or (KEEPING_UP,)) if lowest is not None else None
    above = next((p for p in probes if p.rate == high and not p.passed), None)
    return (above.missed or (KEEPING_UP,)) if above is not None else (KEEPING_UP,)
