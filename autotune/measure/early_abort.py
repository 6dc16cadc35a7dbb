"""Early abort: stop a benchmark as soon as its latency SLOs can no longer be met.

A config that already broke its p99 TTFT on enough requests cannot recover, however fast the
remaining requests are, so measuring them only burns GPU time. `SloGuard` decides this exactly,
from what is known so far, with pure functions on records and times (no HTTP), so the load
generator and the simulated backend can both use it.

The rule: every final statistic (numpy's linear-interpolation percentile, or the mean) is
non-decreasing in each of its values and only falls when zeros are added. So the smallest value
the final statistic can still take is the statistic of the *lower bounds*: finished requests at
their measured values, in-flight requests at what they have already waited, and every request
not yet measured at 0, padded to the largest count the final list can have. When even that lower
bound is over the limit, the SLO is lost for certain, and the guard never aborts a run whose final
statistic would have met it (the property tests check this).

For a percentile over N values sorted x_0 <= ... <= x_{N-1}, numpy reads h = (N-1)q, j = floor(h),
f = h - j and returns x_j + f (x_{j+1} - x_j). With c values over the limit L (the top c):
  - c >= N - j: x_j is itself over L, so the statistic is over L whatever the rest is;
  - c == N - j - 1: x_{j+1} is the smallest violator and x_j the largest other value; the statistic
    is over L only if x_j + f (x_{j+1} - x_j) > L, which the guard evaluates with the bounds;
  - fewer: x_{j+1} <= L, so the statistic can still be <= L.
So for p99 of 400 requests (h = 395.01), 5 requests over the limit lose the SLO for certain, 4 can.

Assumptions (documented in the abort reason's spirit, checked by the tests): requests still
outstanding complete successfully (a request that fails instead is itself a failure of the config);
output lengths are exact (the load generator sends `ignore_eos`), so a stream that has fewer tokens
than it asked for will produce another one, making its open gap a lower bound on one ITL value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from autotune.measure.metrics import RequestRecord
from autotune.measure.slo import Slo

_PERCENTILE_OF_STAT = {"median": 50.0, "p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}
_UNIT = {"ttft": "requests", "e2el": "requests", "tpot": "requests", "itl": "token gaps"}


@dataclass(frozen=True)
class InFlight:
    """A request that has been sent and not finished. Times are on the same clock as `now`."""

    start: float  # when it was sent
    first_token: float | None = None  # when its first token chunk arrived
    last_token: float | None = None  # when its latest token chunk arrived
    tokens: int = 0  # token chunks received so far
    expected_tokens: int = 0  # output length asked for (max_tokens with ignore_eos); 0 if unknown


@dataclass
class _Tally:
    """What finished values contribute to one metric: only the counts and extremes the rule needs."""

    count: int = 0  # finished values
    over: int = 0  # finished values over the limit
    min_over: float = math.inf  # smallest finished value over the limit
    max_under: float = 0.0  # largest finished value at or under the limit
    total: float = 0.0  # sum of finished values (for mean SLOs)

    def add(self, value: float, limit: float) -> None:
        self.count += 1
        self.total += value
        if value > limit:
            self.over += 1
            self.min_over = min(self.min_over, value)
        else:
            self.max_under = max(self.max_under, value)


def percentile_lower_bound_exceeds(
    n_total: int, q: float, limit: float, over: int, min_over: float, max_under: float
) -> bool:
    """True when numpy's percentile `q` (0-100) of `n_total` values must exceed `limit`.

    `over` values are known to be at least their bounds and over `limit` (the smallest bound is
    `min_over`); every other value is at least 0 and the largest known one is `max_under` (<= limit).
    """
    if over == 0 or n_total <= 0:
        return False
    h = (n_total - 1) * q / 100.0
    j = math.floor(h)
    if over >= n_total - j:
        return True
    if over == n_total - j - 1:
        frac = h - j
        return max_under + frac * (min_over - max_under) > limit
    return False


def _violations_needed(n_total: int, q: float) -> int:
    """How many values over the limit lose percentile q of n_total values for certain."""
    return n_total - math.floor((n_total - 1) * q / 100.0)


class LoadGuard(Protocol):
    """What the load generator asks while a load runs (SloGuard, or a backend's wrapper of it)."""

    def add(self, record: RequestRecord) -> None:
        """A measured request finished."""

    def warmup(self, record: RequestRecord) -> None:
        """A warm-up request finished (it counts toward no SLO)."""

    def check(self, in_flight: Iterable[InFlight] = (), now: float = 0.0) -> str | None:
        """Why the load must stop now, or None."""


class SloGuard:
    """Decides, from the records so far and the requests in flight, when an SLO is lost for certain.

    `num_requests` is the number of requests in the run; `expected_output_lens` (one per request,
    optional) bounds how many ITL gaps the run can produce, which ITL percentiles need.
    Feed finished requests with `add(record)` and ask `check(in_flight, now)`; it returns a reason
    string once some SLO cannot be met, else None.
    """

    def __init__(
        self, slos: Sequence[Slo], num_requests: int, expected_output_lens: Sequence[int] | None = None
    ) -> None:
        self.slos = list(slos)
        self.num_requests = num_requests
        self.failed = 0
        # An upper bound on the final number of ITL gaps (each token chunk carries >= 1 token).
        self.max_gaps = (
            sum(max(n - 1, 0) for n in expected_output_lens) if expected_output_lens is not None else None
        )
        self._tallies = {slo: _Tally() for slo in self.slos}

    @classmethod
    def for_requests(cls, slos: Sequence[Slo], output_lens: Sequence[int]) -> SloGuard:
        """A guard for a run of requests with these (exact) output lengths."""
        return cls(slos, len(output_lens), expected_output_lens=output_lens)

    def warmup(self, record: RequestRecord) -> None:
        """Warm-up requests count toward no SLO."""

    def add(self, record: RequestRecord) -> None:
        """Account for one finished request (successful or not)."""
        if not record.success:
            self.failed += 1  # failed requests drop out of every statistic, as in compute_metrics
            return
        for slo, tally in self._tallies.items():
            limit = slo.limit_ms / 1000.0
            for value in _finished_values(slo.metric, record):
                tally.add(value, limit)

    def check(self, in_flight: Iterable[InFlight] = (), now: float = 0.0) -> str | None:
        """A reason ("p99_ttft_ms cannot be met: ...") when an SLO is lost for certain, else None."""
        pending = list(in_flight)
        for slo in self.slos:
            reason = self._check_one(slo, pending, now)
            if reason:
                return reason
        return None

    def _check_one(self, slo: Slo, pending: list[InFlight], now: float) -> str | None:
        limit = slo.limit_ms / 1000.0
        tally = self._tallies[slo]
        bounds = [b for p in pending if (b := _in_flight_bound(slo.metric, p, now)) > 0]
        n_total = self._max_count(slo.metric)
        if n_total is None:
            return None
        over_bounds = [b for b in bounds if b > limit]
        over = tally.over + len(over_bounds)
        if slo.stat == "mean":
            total = tally.total + sum(bounds)
            if n_total > 0 and total > limit * n_total:
                return (
                    f"{slo.key} cannot be met: the {_UNIT[slo.metric]} so far already sum to "
                    f"{total * 1000:.0f} ms, over {slo.limit_ms:g} ms x {n_total}"
                )
            return None
        q = _PERCENTILE_OF_STAT[slo.stat]
        min_over = min([tally.min_over, *over_bounds])
        max_under = max([tally.max_under, *(b for b in bounds if b <= limit)])
        if not percentile_lower_bound_exceeds(n_total, q, limit, over, min_over, max_under):
            return None
        unit = _UNIT[slo.metric]
        # in flight, not finished: the run's metrics never show them (a server that stopped answering)
        waiting = f", {len(over_bounds)} of them still in flight" if over_bounds else ""
        reason = (
            f"{slo.key} cannot be met: {over} of {n_total} {unit} already over {slo.limit_ms:g} ms{waiting}"
        )
        needed = _violations_needed(n_total, q)
        if over >= needed:
            return f"{reason} (>= {needed} lose it for certain)"
        # One fewer: the percentile interpolates between the largest other value and the least violator.
        frac = (n_total - 1) * q / 100.0 % 1
        return (
            f"{reason}, the least at {min_over * 1000:,.0f} ms; the {slo.stat} lies {frac:.0%} of the way to "
            f"it from the largest other value (>= {max_under * 1000:,.0f} ms): over {slo.limit_ms:g} ms "
            "whatever the rest"
        )

    def _max_count(self, metric: str) -> int | None:
        """The largest number of values the final statistic can be taken over (None: unbounded)."""
        if metric == "itl":
            return self.max_gaps
        return self.num_requests - self.failed


def _finished_values(metric: str, record: RequestRecord) -> Sequence[float]:
    if metric == "ttft":
        return (record.ttft,)
    if metric == "e2el":
        return (record.latency,)
    if metric == "tpot":
        return (record.tpot,) if record.output_len > 1 else ()
    return record.itl


def _in_flight_bound(metric: str, req: InFlight, now: float) -> float:
    """A lower bound on the final value this in-flight request adds (0 when nothing is known).

    ITL and TPOT bounds from in-flight requests count only their open gap / elapsed decode time;
    gaps already seen are counted when the request finishes (a lower bound in the meantime).
    """
    more_tokens = req.tokens < req.expected_tokens
    if metric == "ttft":
        return (req.first_token if req.first_token is not None else now) - req.start
    if metric == "e2el":
        if req.first_token is None or more_tokens:
            return now - req.start
        return (req.last_token or req.start) - req.start
    if req.first_token is None or not more_tokens:
        return 0.0
    if metric == "itl":
        return now - (req.last_token or req.first_token)
    # tpot = (E2EL - TTFT) / (n - 1) with E2EL >= now - start and n <= expected_tokens
    if req.expected_tokens > 1:
        return (now - req.first_token) / (req.expected_tokens - 1)
    return 0.0


def replay_abort_time(
    slos: Sequence[Slo], records: Sequence[RequestRecord], output_lens: Sequence[int]
) -> float | None:
    """When a guard fed `records` in the order they finished first declares an SLO lost (seconds on
    the run's clock), or None if it never does.

    The live guard also counts what in-flight requests have already waited, so it stops no later
    than this: the time after it is a lower bound on what early abort saves on that run.
    """
    if not slos:
        return None
    guard = SloGuard.for_requests(slos, output_lens)
    for record in sorted(records, key=lambda r: r.start_time + r.latency):
        guard.add(record)
        if guard.check():
            return record.start_time + record.latency
    return None


def abort_savings(
    records: Sequence[RequestRecord],
    arrivals: Sequence[float],
    duration_s: float,
    unfinished: int,
    limit_s: float,
) -> float:
    """Load time an early abort spared: an estimate, never past the benchmark's time limit.

    While requests are still due (a Poisson or trace schedule), the run would have gone on at least
    until the last one arrived, and that one would have taken about as long as a typical finished
    request (their median E2EL). Once every request has arrived (a burst, or a concurrency-bound
    load), the unfinished ones would have taken the completion pace so far. Applying that pace to a
    schedule, as before, claimed 20x the time a Poisson run had left: completions come slowly at
    first, arrivals do not.
    """
    if unfinished <= 0:
        return 0.0
    schedule_left = max(0.0, max(arrivals, default=0.0) - duration_s)
    if schedule_left > 0:
        latencies = sorted(r.latency for r in records if r.success)
        remaining = schedule_left + (latencies[len(latencies) // 2] if latencies else 0.0)
    else:
        remaining = duration_s * unfinished / max(len(records), 1)
    return max(0.0, min(remaining, limit_s - duration_s))
