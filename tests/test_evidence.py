"""Evidence: an SLO judged with its standard error, so a rate passes only when another run would agree."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autotune.measure.evidence import (
    FAIL,
    PASS,
    UNSURE,
    Criterion,
    Z,
    judge,
    pool,
    sequential_z,
    slo_criteria,
)
from autotune.measure.metrics import RequestRecord, compute_metrics
from autotune.measure.slo import parse_slos

TTFT_P99 = parse_slos("ttft_p99=2s")


def records(slow: list[int], n: int = 1000, itl: float = 0.01) -> list[RequestRecord]:
    """`n` requests one per 0.1 s with a 0.1 s TTFT, except those in `slow` (5 s)."""
    out = []
    for i in range(n):
        ttft = 5.0 if i in slow else 0.1
        out.append(
            RequestRecord(
                prompt_len=100,
                output_len=3,
                start_time=i * 0.1,
                ttft=ttft,
                itl=[itl, itl],
                latency=ttft + 2 * itl,
            )
        )
    return out


def verdict(recs: list[RequestRecord], slos=TTFT_P99) -> str:
    return judge(slo_criteria(recs, slos))


def test_far_under_the_limit_passes_far_over_fails() -> None:
    assert verdict(records([])) == PASS
    assert verdict(records(list(range(0, 1000, 10)))) == FAIL  # 10 % over 2 s: p99 is 5 s


def test_misses_in_one_stretch_are_less_certain_than_spread_ones() -> None:
    """0.4 % over the limit meets p99 either way; spread evenly that is sure, bunched (a queue that built
    up once) another window may see none or several such stretches, so it is unsure."""
    spread = records(list(range(50, 2000, 250)), n=2000)
    bunched = records(list(range(300, 308)), n=2000)
    for recs in (spread, bunched):
        assert compute_metrics(recs, 200.0).latency_ms["ttft"]["p99"] < 2000
    assert verdict(spread) == PASS
    assert verdict(bunched) == UNSURE


def test_the_share_over_the_limit_agrees_with_the_percentile() -> None:
    """The margin's sign is the point verdict: <= 0 exactly when p99 TTFT <= the limit."""
    rng = np.random.default_rng(3)
    for k in (0, 5, 9, 12, 30):
        recs = records(list(rng.choice(1000, size=k, replace=False)))
        (criterion,) = slo_criteria(recs, TTFT_P99)
        p99 = compute_metrics(recs, 100.0).latency_ms["ttft"]["p99"]
        assert (criterion.margin <= 0) == (p99 <= 2000), k


@pytest.mark.parametrize(
    ("slo", "itl", "expected"), [("itl_p99=50ms", 0.01, PASS), ("itl_p99=5ms", 0.01, FAIL)]
)
def test_itl_pools_every_gap(slo: str, itl: float, expected: str) -> None:
    assert verdict(records([], itl=itl), parse_slos(slo)) == expected


def test_a_mean_slo_is_judged_on_the_mean() -> None:
    slow = list(range(0, 1000, 10))  # mean TTFT 0.1 + 10 % x 4.9 s = 0.59 s
    assert verdict(records(slow), parse_slos("ttft_mean=1s")) == PASS
    assert verdict(records(slow), parse_slos("ttft_mean=400ms")) == FAIL


def test_a_window_is_never_surer_than_its_size_allows() -> None:
    """No request over the limit in 200: the groups agree (error 0), yet 200 requests cannot tell a
    0.5 % share from a 1 % one; in 3,000 they can."""
    assert verdict(records([], n=200)) == UNSURE
    assert verdict(records([], n=3000)) == PASS


def test_no_data_is_no_evidence() -> None:
    (criterion,) = slo_criteria([], TTFT_P99)
    assert criterion.verdict() == UNSURE
    assert judge([Criterion("a", -1, 0.1), Criterion("b", 1, 0.1)]) == FAIL


def test_two_windows_pooled_tell_what_one_twice_as_long_does() -> None:
    """A second window at the same load, pooled, settles what one window could not."""
    slow = list(range(5, 1000, 100))  # 1 % over the limit in each window: right at the threshold
    first, second = slo_criteria(records(slow), TTFT_P99), slo_criteria(records([]), TTFT_P99)
    both = pool([first, second])[0]
    assert both.samples == 2000 and both.margin == pytest.approx((first[0].margin + second[0].margin) / 2)
    assert both.error < min(first[0].error, second[0].error)
    assert judge(first) == UNSURE and judge(pool([first, second])) == PASS  # 10 of 2,000: 0.5 %


def test_a_ttft_tail_that_comes_in_episodes_is_worth_fewer_samples() -> None:
    """No request over 2 s in 1,000, and 30 between 1 and 2 s. Spread out, they say the tail is thin
    (pass); all in one stretch, they are one queueing episode, and a window that happened to hold
    no episode over the limit cannot tell a long run's share from 1 %."""

    def with_near_misses(near: list[int]) -> list[RequestRecord]:
        recs = records([])
        for i in near:
            recs[i] = dataclasses.replace(recs[i], ttft=1.5, latency=1.5 + 0.02)
        return recs

    spread = list(range(0, 1000, 33))[:30]
    assert verdict(with_near_misses(spread)) == PASS
    assert verdict(with_near_misses(list(range(400, 430)))) == UNSURE


def test_repeated_looks_clear_pococks_bar() -> None:
    """One look keeps z; k equal looks need Pocock's boundary (his published constants for a two-sided
    10 % test, one-sided 5 %: 1.875, 1.992, 2.067), and a random walk of pooled windows crosses it at
    any look as rarely as one window crosses z."""
    assert sequential_z(1) == pytest.approx(Z, abs=1e-3)
    for looks, published in ((2, 1.875), (3, 1.992), (4, 2.067)):
        assert sequential_z(looks) == pytest.approx(published, abs=0.005)
    walks = np.cumsum(np.random.default_rng(0).standard_normal((200_000, 3)), axis=1) / np.sqrt([1, 2, 3])
    crossed = (walks.max(axis=1) > sequential_z(3)).mean()
    assert crossed == pytest.approx(0.05, abs=0.003)
    assert (walks.max(axis=1) > Z).mean() > 0.09  # z at every look: twice the false passes


def test_a_miss_can_ask_for_less_than_a_pass() -> None:
    """A pass needs z errors; a miss only fail_z (a false miss costs capacity, a false pass a promise)."""
    c = Criterion("ttft_p99", 0.0018, 0.001, 1000)
    assert c.verdict(2.0) == UNSURE and c.verdict(2.0, fail_z=1.645) == FAIL
    assert judge([c], 2.0, fail_z=1.645) == FAIL
