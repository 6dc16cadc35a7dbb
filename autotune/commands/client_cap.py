"""A request rate under a client concurrency cap: what the numbers leave unsaid.

With max_concurrency the client sends a request only when one of its slots is free, as `vllm bench serve`
does: the run is a closed loop, which has no verdict on keeping up with the arrivals, and its TTFT is
taken from the send, so the wait for a slot is in no latency. A server slower than the arrivals then
passes its SLOs while the requests pile up in the client (1,000 requests at 40 req/s under a cap of 4:
arrivals over 25 s, served at 1.7 req/s over 590 s). These notes say so; they judge nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from autotune.workloads.spec import Request, WorkloadSpec

# The run took longer than its arrivals plus a request's own latency by more than this factor's inverse:
# the cap clearly held requests back. Not served / offered alone: a short run that keeps up still serves
# well under its arrival rate, its last request finishing a lifetime after the last arrival.
HELD_BACK = 0.9


def offered_rate(requests: Sequence[Request]) -> float:
    """The requests' arrival rate: their count over the last arrival time (inf when all arrive at once)."""
    last = max((r.arrival_time for r in requests), default=0.0)
    return len(requests) / last if last > 0 else math.inf


def held_back_note(report: dict[str, Any], offered: float | None) -> str | None:
    """`bench`'s note on a capped run (`report` as printed) served clearly below the rate it was offered:
    its duration over its arrivals' span plus the p99 E2EL (which counts from the send, so no wait for a
    slot) by more than 1 / HELD_BACK. None otherwise, or for a failed run (its pace is not the cap's)."""
    cap = report.get("max_concurrency")
    if cap is None or offered is None or not math.isfinite(offered) or "failure" in report:
        return None
    unheld = report["num_prompts"] / offered + report["p99_e2el_ms"] / 1000
    if report["duration"] * HELD_BACK <= unheld:
        return None
    served = report["request_throughput"]
    return (
        f"the client's concurrency cap ({cap}) held the requests back: offered {offered:.2f} req/s, served "
        f"{served:.2f} req/s, so the TTFT does not include the wait for a slot (as vLLM's client measures "
        "it) and no verdict on keeping up is given (a closed loop has none)"
    )


def capped_run_note(workload: WorkloadSpec) -> str | None:
    """`run`'s note at start on a fixed load both timed and capped (None otherwise): its trials are
    closed loops, judged by their SLOs only, so a config that falls behind the arrivals can still pass."""
    cap = workload.max_concurrency
    if workload.load != "fixed" or cap is None:
        return None
    offered = offered_rate(workload.requests())
    if not math.isfinite(offered):
        return None  # every request at t=0: the cap is the whole load, nothing is held back from a rate
    return (
        f"max_concurrency {cap} caps the client: a trial serving under the offered {offered:.2f} req/s "
        "holds requests back, and their wait for a slot is in no TTFT (as vLLM's client measures it) nor "
        "judged as falling behind (a closed loop has no keep-up verdict)"
    )
