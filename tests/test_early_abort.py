"""SloGuard: aborts exactly when an SLO is lost for certain, never when the final statistic would pass."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from autotune.measure.early_abort import InFlight, SloGuard, percentile_lower_bound_exceeds, replay_abort_time
from autotune.measure.metrics import RequestRecord, compute_metrics
from autotune.measure.slo import Slo, parse_slos


def _record(ttft: float, itl: list[float] | None = None, success: bool = True) -> RequestRecord:
    itl = itl if itl is not None else [0.01]
    return RequestRecord(
        prompt_len=10,
        output_len=len(itl) + 1,
        ttft=ttft,
        itl=itl,
        latency=ttft + sum(itl),
        success=success,
        error="" if success else "boom",
    )


def test_p99_of_400_needs_five_violators_for_certain() -> None:
    guard = SloGuard(parse_slos("ttft_p99=2s"), num_requests=400)
    for _ in range(4):
        guard.add(_record(ttft=2.5))
    assert guard.check() is None  # 4 over: the other 396 could still pull p99 under 2 s
    guard.add(_record(ttft=2.5))
    reason = guard.check()
    assert reason is not None
    assert reason.startswith("p99_ttft_ms cannot be met: 5 of 400 requests already over 2000 ms")


def test_replay_finds_when_the_guard_would_have_stopped_the_run() -> None:
    slos = parse_slos("ttft_p99=2s")
    ok = [dataclasses.replace(_record(ttft=0.1), start_time=i * 0.01) for i in range(396)]
    late = [dataclasses.replace(_record(ttft=2.5), start_time=10.0 + i) for i in range(5)]
    lens = [r.output_len for r in ok + late[:4]]
    assert replay_abort_time(slos, ok + late[:4], lens) is None  # 4 of 400 over: p99 can still pass
    lens = [r.output_len for r in ok[:395] + late]
    # The fifth late request (started at 14 s, finished 2.51 s later) makes it certain.
    assert replay_abort_time(slos, late + ok[:395], lens) == pytest.approx(16.51)
    assert replay_abort_time([], late, [2] * 5) is None


def test_boundary_case_uses_interpolation_with_known_values() -> None:
    # N=400, p99: h=395.01, j=395. With 4 violators, x_395 is the largest other value and
    # x_396 the smallest violator: p99 = x_395 + 0.01 (x_396 - x_395).
    limit = 1.0
    assert not percentile_lower_bound_exceeds(400, 99, limit, 4, min_over=50.0, max_under=0.0)
    assert percentile_lower_bound_exceeds(400, 99, limit, 4, min_over=150.0, max_under=0.0)
    assert percentile_lower_bound_exceeds(400, 99, limit, 4, min_over=60.0, max_under=0.5)
    values = [0.0] * 395 + [0.5] + [60.0] * 4
    assert np.percentile(values, 99) > limit


def test_in_flight_request_without_first_token_counts_for_ttft() -> None:
    guard = SloGuard(parse_slos("ttft_p99=1s"), num_requests=100)  # h = 98.01: 2 over lose it
    guard.add(_record(ttft=3.0))
    assert guard.check([InFlight(start=0.0)], now=0.5) is None
    reason = guard.check([InFlight(start=0.0)], now=1.5)
    # ... and says so: the run's metrics show only finished requests (a stalled server's looked fine)
    assert reason is not None
    assert "2 of 100 requests already over 1000 ms, 1 of them still in flight" in reason
    # A request that already got its first token in time does not count, however long it runs.
    assert guard.check([InFlight(start=0.0, first_token=0.2, last_token=5.0)], now=9.0) is None


def test_failed_requests_drop_out_of_the_count() -> None:
    slos = parse_slos("ttft_p50=1s")
    guard = SloGuard(slos, num_requests=10)  # p50 of 10: h=4.5, j=4: 6 over lose it, 5 may not
    for _ in range(5):
        guard.add(_record(ttft=2.0))
    assert guard.check() is None
    guard.add(_record(ttft=0.0, success=False))  # now at most 9 values: h=4, 5 over lose it
    assert guard.check() is not None


def test_mean_slo_aborts_when_the_sum_is_already_too_large() -> None:
    guard = SloGuard(parse_slos("e2el_mean=1s"), num_requests=10)
    for _ in range(3):
        guard.add(_record(ttft=3.0))
    assert guard.check() is None  # sum about 9.03 s <= 10 s
    reason = guard.check([InFlight(start=0.0, first_token=0.1, tokens=1, expected_tokens=5)], now=1.0)
    assert reason is not None and reason.startswith("mean_e2el_ms cannot be met")


def test_itl_needs_the_number_of_gaps_and_counts_open_gaps() -> None:
    slo = parse_slos("itl_p99=50ms")
    assert SloGuard(slo, num_requests=2).check([InFlight(0.0, 0.1, 0.1, 1, 10)], now=99.0) is None
    guard = SloGuard.for_requests(slo, output_lens=[11, 11])  # at most 20 gaps: h=18.81, 2 over lose it
    guard.add(_record(ttft=0.1, itl=[0.055] + [0.01] * 9))  # p99 can still be ~0.048
    assert guard.check([InFlight(0.0, 0.1, 0.1, tokens=1, expected_tokens=11)], now=0.12) is None
    assert guard.check([InFlight(0.0, 0.1, 0.1, tokens=1, expected_tokens=11)], now=0.5) is not None
    # A stream that has all its tokens has no open gap.
    assert guard.check([InFlight(0.0, 0.1, 0.1, tokens=11, expected_tokens=11)], now=0.5) is None


def _random_run(rng: random.Random) -> tuple[list[RequestRecord], list[float], list[Slo]]:
    n = rng.randint(1, 60)
    heavy = rng.random() < 0.5
    records, starts = [], []
    for _ in range(n):
        out = rng.randint(1, 6)
        ttft = rng.expovariate(1.0) * (3.0 if heavy and rng.random() < 0.1 else 0.5)
        itl = [rng.expovariate(20.0) for _ in range(out - 1)]
        success = rng.random() > 0.05
        records.append(
            RequestRecord(
                prompt_len=5,
                output_len=out,
                ttft=ttft,
                itl=itl,
                latency=ttft + sum(itl),
                success=success,
                error="" if success else "x",
            )
        )
        starts.append(rng.uniform(0.0, 5.0))
    stats = ["mean", "median", "p90", "p95", "p99"]
    metrics = ["ttft", "tpot", "itl", "e2el"]
    slos = [Slo(metric=rng.choice(metrics), stat=rng.choice(stats), limit_ms=rng.uniform(20, 1500))]
    return records, starts, slos


def _in_flight_view(rec: RequestRecord, start: float, now: float) -> InFlight | None:
    """What the client knows at `now` about a request sent at `start`, or None if it finished."""
    if now >= start + rec.latency:
        return None
    times = [start + rec.ttft + sum(rec.itl[:i]) for i in range(rec.output_len)]
    seen = [t for t in times if t <= now]
    return InFlight(
        start=start,
        first_token=seen[0] if seen else None,
        last_token=seen[-1] if seen else None,
        tokens=len(seen),
        expected_tokens=rec.output_len,
    )


@pytest.mark.parametrize("seed", range(400))
def test_never_aborts_a_run_that_would_meet_its_slo(seed: int) -> None:
    rng = random.Random(seed)
    records, starts, slos = _random_run(rng)
    ok = [r for r in records if r.success]
    final = compute_metrics(records, duration=10.0)
    met = all(final.get(s.key) <= s.limit_ms for s in slos) if ok else True
    guard = SloGuard.for_requests(slos, [r.output_len for r in records])
    ends = [s + r.latency for s, r in zip(starts, records, strict=True)]
    added: set[int] = set()
    aborted = None
    for now in sorted({*np.linspace(0.0, 12.0, 40), *ends}):
        for i in range(len(records)):
            if ends[i] <= now and i not in added:
                guard.add(records[i])
                added.add(i)
        # Requests that will fail are left out of the in-flight view: the guard assumes outstanding
        # requests complete (a failure is a failure of the config anyway).
        pending = [
            view
            for i, (s, r) in enumerate(zip(starts, records, strict=True))
            if r.success and i not in added and s <= now and (view := _in_flight_view(r, s, now))
        ]
        aborted = aborted or guard.check(pending, now)
    if met:
        assert aborted is None, (aborted, [(s.key, final.get(s.key)) for s in slos])
    # Once everything is in, the guard sees what compute_metrics sees: it must then be exact
    # for percentiles and means of TTFT/E2EL/TPOT (ITL counts are only bounded).
    if not met and ok and slos[0].metric in ("ttft", "e2el"):
        assert guard.check() is not None


def test_abort_savings_follow_the_arrival_schedule_not_the_completion_pace() -> None:
    from autotune.measure.early_abort import abort_savings
    from autotune.measure.metrics import RequestRecord

    # 1,000 requests at 10 req/s, aborted at 12 s with 5 finished (each took 3 s): the old estimate
    # (elapsed x unfinished / finished) said 2,388 s; the run had ~88 s of arrivals left plus a tail.
    arrivals = [i / 10 for i in range(1000)]
    done = [RequestRecord(prompt_len=10, output_len=10, latency=3.0) for _ in range(5)]
    saved = abort_savings(done, arrivals, duration_s=12.0, unfinished=995, limit_s=1800.0)
    assert saved == pytest.approx(99.9 - 12.0 + 3.0)
    # never past the benchmark's own time limit, nothing when nothing was left
    assert abort_savings(done, arrivals, 12.0, 995, limit_s=50.0) == pytest.approx(38.0)
    assert abort_savings(done, arrivals, 12.0, 0, 1800.0) == 0.0
    # every request already arrived (a burst): the completion pace so far, 995 left at 5 per 12 s
    assert abort_savings(done, [0.0] * 1000, 12.0, 995, limit_s=1800.0) == pytest.approx(1788.0)
    assert abort_savings(done, [0.0] * 1000, 12.0, 10, limit_s=1800.0) == pytest.approx(24.0)


def test_a_reason_by_interpolation_says_so_rather_than_counting_too_few_violators() -> None:
    """p99 of 20 values reads 81 % of the way from the 19th to the 20th: one request far over the limit
    loses it, and the reason says how, not '1 over (>= 2 lose it for certain)'."""
    guard = SloGuard(parse_slos("ttft_p99=2s"), num_requests=20)
    guard.add(_record(ttft=0.3))
    guard.add(_record(ttft=9.5))
    reason = guard.check()
    assert reason is not None and "lose it for certain" not in reason
    assert reason.startswith(
        "p99_ttft_ms cannot be met: 1 of 20 requests already over 2000 ms, the least at 9,500"
    )
    assert "81% of the way to it from the largest other value (>= 300 ms)" in reason
    assert np.percentile([0.0] * 18 + [0.3, 9.5], 99) > 2.0  # what the reason claims
