"""Steadiness: a server that keeps up, one that does not, and a run too short to tell."""

from __future__ import annotations

import numpy as np

from autotune.metrics import RequestRecord
from autotune.steady_state import Window, measure_window, plan_window, steadiness


def records(rate: float, service_rate: float, seconds: float, lifetime: float = 2.0, seed: int = 0) -> list:
    """Poisson arrivals served FIFO by a server of `service_rate` req/s, each taking `lifetime` to decode."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1 / rate, int(rate * seconds)))
    out, free = [], 0.0
    for t in starts:
        begin = max(t, free)  # the server admits one request per 1 / service_rate seconds
        free = begin + 1 / service_rate
        ttft = begin - t + 0.05
        out.append(
            RequestRecord(
                prompt_len=100, output_len=50, start_time=float(t), ttft=ttft, latency=ttft + lifetime
            )
        )
    return out


def test_a_server_below_its_capacity_keeps_up() -> None:
    s = steadiness(records(10, 12, 200), Window(20, 190))
    assert s.kept_up and abs(s.backlog_growth) < 0.02 and abs(s.served_rate / s.offered_rate - 1) < 0.05


def test_a_server_over_its_capacity_does_not() -> None:
    s = steadiness(records(10, 9, 200), Window(20, 190))
    assert not s.kept_up and s.backlog_growth > 0.05 and s.served_rate < 0.95 * s.offered_rate


def test_a_few_requests_of_noise_are_not_a_growing_backlog() -> None:
    s = steadiness(records(10, 12, 4, lifetime=0.3), Window(1, 3.9))  # ~30 requests: 2 more is noise
    assert s.allowed_growth > 0.05 and s.kept_up


def test_fixed_load_runs_are_judged_after_two_lifetimes_or_not_at_all() -> None:
    over = records(10, 8, 60)
    _, info = measure_window(over, 70.0, 0.0)
    assert info["kept_up"] is False  # judged from 4 s (two 2 s lifetimes) to the last arrival
    _, info = measure_window(records(10, 8, 6), 12.0, 0.0)
    assert info == {}  # 6 s of arrivals, the batch only full after 4: too short to tell


def test_window_follows_the_request_lifetime() -> None:
    assert plan_window(1.0) == Window(10.0, 40.0)  # the floors
    assert plan_window(20.0) == Window(40.0, 120.0)  # two lifetimes of warm-up, four of window
    assert plan_window(20.0, scale=10).length == 800.0
