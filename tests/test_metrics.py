"""metrics.py against hand-computed records, with vllm bench serve's formulas (serve.py calculate_metrics).

Records (seconds):            ttft   itl gaps            latency  output  prompt
  A                           0.10   0.02 0.03 0.05      0.20     4       100
  B                           0.30   0.04 0.06           0.40     3       200
  C (one token)               0.50   -                   0.50     1        50
  D (failed)                                                      0        80
Duration 2 s. By hand: TPOT A = 0.1 / 3 s, B = 0.1 / 2 s, C excluded; pooled ITL = 20 30 50 40 60 ms.
"""

from __future__ import annotations

import math

import pytest

from autotune.measure.metrics import BenchmarkResult, RequestRecord, compute_metrics

A = RequestRecord(prompt_len=100, output_len=4, ttft=0.10, itl=[0.02, 0.03, 0.05], latency=0.20)
B = RequestRecord(prompt_len=200, output_len=3, ttft=0.30, itl=[0.04, 0.06], latency=0.40)
C = RequestRecord(prompt_len=50, output_len=1, ttft=0.50, itl=[], latency=0.50)
D = RequestRecord(prompt_len=80, output_len=0, success=False, error="HTTP 500: boom")
RECORDS = [A, B, C, D]


def approx(value: float):
    return pytest.approx(value, rel=1e-9, abs=1e-9)


@pytest.fixture
def result() -> BenchmarkResult:
    return compute_metrics(RECORDS, duration=2.0, server={"num_preemptions": 3, "kv_cache_blocks": 1000})


def test_counts_and_throughputs(result: BenchmarkResult):
    assert (result.completed, result.failed) == (3, 1)
    assert (result.total_input_tokens, result.total_output_tokens) == (350, 8)  # failed D excluded
    assert result.request_throughput == approx(1.5)
    assert result.output_throughput == approx(4.0)
    assert result.total_token_throughput == approx(179.0)
    assert result.errors == ["HTTP 500: boom"]
    assert result.request_goodput is None  # no goodput asked, like vLLM's result JSON


def test_ttft(result: BenchmarkResult):
    ttft = result.latency_ms["ttft"]  # 100, 300, 500 ms
    assert ttft["mean"] == approx(300.0) and ttft["median"] == approx(300.0)
    assert ttft["std"] == approx(math.sqrt(80000 / 3))  # population std, numpy's default
    assert ttft["p90"] == approx(300 + 0.8 * 200)  # linear interpolation at rank 0.9 * 2 = 1.8
    assert ttft["p99"] == approx(300 + 0.98 * 200)


def test_tpot_excludes_one_token_outputs(result: BenchmarkResult):
    a, b = 100 / 3, 50.0
    tpot = result.latency_ms["tpot"]
    assert tpot["mean"] == approx((a + b) / 2)  # C (1 token) is not a zero in the list
    assert tpot["median"] == approx((a + b) / 2)
    assert tpot["p99"] == approx(a + 0.99 * (b - a))
    assert A.tpot == approx(a / 1000) and C.tpot == 0.0


def test_itl_is_pooled_not_averaged_per_request(result: BenchmarkResult):
    itl = result.latency_ms["itl"]  # 20 30 40 50 60 ms pooled
    assert itl["mean"] == approx(40.0)  # per-request averages would give (33.3 + 50) / 2 = 41.7
    assert itl["median"] == approx(40.0)
    assert itl["p99"] == approx(50 + 0.96 * 10)  # rank 0.99 * 4 = 3.96
    assert itl["p50"] == itl["median"]


def test_e2el(result: BenchmarkResult):
    e2el = result.latency_ms["e2el"]  # 200, 400, 500 ms
    assert e2el["mean"] == approx(1100 / 3) and e2el["median"] == approx(400.0)
    assert e2el["p99"] == approx(400 + 0.98 * 100)


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        ({"ttft": 300}, 2),  # A, B (300 ms is within: <=)
        ({"tpot": 40}, 2),  # A (33.3) and C, whose TPOT counts as 0 like vLLM's all_tpots; B (50) misses
        ({"ttft": 300, "tpot": 40}, 1),  # every bound must hold: A only
        ({"e2el": 450}, 2),
        ({"ttft": 99}, 0),
    ],
)
def test_goodput(slos: dict[str, float], good: int):
    assert compute_metrics(RECORDS, duration=2.0, goodput_slos_ms=slos).request_goodput == approx(good / 2.0)


def test_goodput_boundary_compares_like_vllm():
    # vLLM checks bound / 1000 >= value in seconds; 2.007 * 1000 > 2007 in floating point would reject it
    record = RequestRecord(prompt_len=1, output_len=2, ttft=2.007, itl=[0.001], latency=2.008)
    assert compute_metrics([record], 1.0, goodput_slos_ms={"ttft": 2007}).request_goodput == 1.0


def test_goodput_rejects_unknown_metric():
    with pytest.raises(ValueError, match="goodput supports"):
        compute_metrics(RECORDS, 1.0, goodput_slos_ms={"itl": 50})


@pytest.mark.parametrize("records", [[], [D, D]])
def test_nothing_completed_gives_zeros_not_nan(records: list[RequestRecord]):
    result = compute_metrics(records, duration=5.0, goodput_slos_ms={"ttft": 100})
    assert (result.completed, result.failed) == (0, len(records))
    assert result.request_throughput == 0.0 and result.output_throughput == 0.0
    assert result.request_goodput == 0.0
    flat = result.to_dict()
    numbers = [v for v in flat.values() if isinstance(v, float)]
    assert numbers and not any(math.isnan(v) for v in numbers)
    assert flat["p99_ttft_ms"] == 0.0 and flat["mean_itl_ms"] == 0.0


def test_round_trip_and_get(result: BenchmarkResult):
    flat = result.to_dict()
    assert flat["p99_ttft_ms"] == approx(496.0) and flat["num_preemptions"] == 3
    assert {"mean_tpot_ms", "median_itl_ms", "std_e2el_ms", "p90_e2el_ms", "errors"} <= set(flat)
    assert BenchmarkResult.from_dict(flat) == result
    assert result.get("p99_ttft_ms") == approx(496.0)
    assert result.get("output_throughput") == approx(4.0)
    with pytest.raises(KeyError):
        result.get("p99_nothing_ms")
