"""Capacity search: the highest request rate at which a config still meets the SLOs.

With `load: capacity` a trial is not one benchmark but a short search per config: an exponential
bracket from the workload's request_rate (doubling while the SLOs hold, halving while they fail),
then geometric bisection until the bracket is within `tolerance`. Each step is one benchmark at a
Poisson rate on the same started server (one startup per trial), so the bound on evaluations is the
bound on benchmark time. A server that dies or hangs ends the search: the rates that met the SLOs
before still count. The trial's result is the
benchmark at the highest rate that met the SLOs, with its throughputs set to the *sustained* ones at
that rate (rate x tokens per request): a short benchmark's measured throughput is dominated by its
drain tail (the last long request), not by the load the config can carry. The measured ones stay in
`info` (measured_output_throughput...).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend, Session, TrialResult
from autotune.config import EngineConfig
from autotune.slo import Slo

MAX_EVALS = 8
TOLERANCE = 0.05  # stop when high / low <= 1.05: finer than run-to-run noise on real GPUs is wasted
SUSTAINED = ("request_throughput", "output_throughput", "total_token_throughput")
DEFAULT_START_RATE = 8.0  # req/s, when the workload's own rate is inf
MIN_RATE = 0.05  # below this the config serves nothing useful: stop halving


@dataclass(frozen=True)
class CapacitySearch:
    """The search bounds (a separate record so tests and benchmarks can tighten them)."""

    max_evals: int = MAX_EVALS
    tolerance: float = TOLERANCE


def meets(result: TrialResult, slos: Sequence[Slo]) -> bool:
    """A complete benchmark whose every SLO margin is <= 0."""
    return result.ok and all(slo.margin(result.benchmark) <= 0 for slo in slos)  # type: ignore[arg-type]


def find_capacity(
    backend: Backend,
    config: EngineConfig,
    workload: Any,
    slos: Sequence[Slo],
    seed: int = 0,
    gpu_ids: Sequence[int] = (),
    trial_dir: Path | None = None,
    search: CapacitySearch = CapacitySearch(),  # noqa: B008  (frozen, so a shared default is safe)
) -> TrialResult:
    """Search the highest SLO-meeting rate for `config`: the result at that rate, the search in `info`.

    Every rate is measured on one server (one backend session), so the trial pays one startup.
    """
    with backend.session(config, gpu_ids, trial_dir) as session:
        return _search(session, workload, slos, seed, search)


def _search(
    session: Session, workload: Any, slos: Sequence[Slo], seed: int, search: CapacitySearch
) -> TrialResult:
    def run(rate: float) -> TrialResult:
        return session.measure(workload.with_load(request_rate=rate), slos, seed)

    start = workload.request_rate if math.isfinite(workload.request_rate) else DEFAULT_START_RATE
    if not slos:
        # Nothing bounds the rate: capacity is the saturated throughput (all requests at t=0).
        result = run(math.inf)
        return _annotate(
            result, [result], [math.inf], result.benchmark.request_throughput if result.ok else 0.0
        )
    low: float | None = None
    high: float | None = None
    best: TrialResult | None = None
    tried: list[float] = []
    results: list[TrialResult] = []
    rate = start
    while len(tried) < search.max_evals:
        result = run(rate)
        tried.append(rate)
        results.append(result)
        if result.failure is not None and result.benchmark is None and not tried[:-1]:
            return result  # did not start: no rate will help, and the reason is the trial's failure
        if meets(result, slos):
            low, best = rate, result
        else:
            high = rate
        if not session.alive:
            break  # the server died or hung: no other rate can be measured on it
        if high is None:
            rate = rate * 2
        elif low is None:
            rate = rate / 2
            if rate < MIN_RATE:
                break
        elif high / low <= 1 + search.tolerance:
            break
        else:
            rate = math.sqrt(low * high)
    if best is None:
        # No rate met the SLOs: report the gentlest one tried, which is infeasible and says by how much.
        best = results[tried.index(min(tried))]
    annotated = _annotate(best, results, tried, low or 0.0)
    if not session.alive and results[-1] is not best:
        # Say why the search stopped short (e.g. an OOM under load at a higher rate).
        annotated.info["capacity_stopped_by"] = f"{results[-1].failure}: {results[-1].message}"
    return annotated


def _annotate(
    best: TrialResult, results: list[TrialResult], tried: list[float], capacity: float
) -> TrialResult:
    """Sum the GPU time of every step (one startup, every benchmark) into the result, set sustained
    throughputs, record the search."""
    best.startup_s = sum(r.startup_s for r in results)
    best.benchmark_s = sum(r.benchmark_s for r in results)
    best.saved_s = sum(r.saved_s for r in results)
    bench = best.benchmark
    goodput = bench.request_goodput if bench is not None else None
    measured = {}
    if bench is not None and capacity > 0 and math.isfinite(capacity) and bench.completed:
        measured = {f"measured_{k}": round(getattr(bench, k), 4) for k in SUSTAINED}
        per_request_out = bench.total_output_tokens / bench.completed
        per_request_all = (bench.total_input_tokens + bench.total_output_tokens) / bench.completed
        best.benchmark = dataclasses.replace(
            bench,
            request_throughput=capacity,
            output_throughput=capacity * per_request_out,
            total_token_throughput=capacity * per_request_all,
        )
    best.info = {
        **best.info,
        **measured,
        "capacity_rate": round(capacity, 4),
        "capacity_goodput": round(goodput, 4) if goodput is not None else None,
        "capacity_rates_tried": [round(r, 4) if math.isfinite(r) else "inf" for r in tried],
    }
    return best
