"""SLO strings -> Slo records, and their margins (<= 0 holds)."""

from __future__ import annotations

import pytest

from autotune.core.errors import AutotuneError
from autotune.measure.metrics import RequestRecord, compute_metrics
from autotune.measure.slo import parse_slos


def test_parse_units_stats_and_repeats() -> None:
    slos = parse_slos(["ttft_p99=2s,itl_p99=50ms", "tpot_mean=0.04s", "e2el_p90=1500ms"])
    assert [(s.metric, s.stat, s.limit_ms) for s in slos] == [
        ("ttft", "p99", 2000.0),
        ("itl", "p99", 50.0),
        ("tpot", "mean", 40.0),
        ("e2el", "p90", 1500.0),
    ]
    assert [s.key for s in slos] == ["p99_ttft_ms", "p99_itl_ms", "mean_tpot_ms", "p90_e2el_ms"]
    assert str(slos[0]) == "ttft_p99=2s" and str(slos[1]) == "itl_p99=50ms"
    # spaces and case are tolerated; the same SLO twice is an error (which limit was meant?)
    again = parse_slos("TTFT_P99 = 2s, itl_p99=1s")
    assert len(again) == 2 and again[0].limit_ms == 2000.0
    assert parse_slos([]) == []
    for bad in ("ttft_p99=2s,ttft_p99=1s", "ttft_p99=2s,", ""):
        with pytest.raises(AutotuneError):
            parse_slos(bad)


@pytest.mark.parametrize(
    "text",
    [
        "ttft_p99=2",
        "ttft=2s",
        "ttft_p98=2s",
        "latency_p99=2s",
        "ttft_p99=fast",
        "ttft_p99=0ms",
        "ttft_p99=-1s",
    ],
)
def test_bad_slo_strings(text: str) -> None:
    with pytest.raises(AutotuneError) as err:
        parse_slos(text)
    assert "bad SLO" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (
            ["ttft_p99=2s", "ttft_p99=2000ms"],
            "SLO ttft_p99 given twice (ttft_p99=2s and ttft_p99=2000ms): keep one",
        ),
        # median and p50 are one statistic: two limits on it are one SLO given twice
        (
            ["ttft_median=1s", "ttft_p50=2s"],
            "SLO ttft_median given twice (ttft_median=1s and ttft_p50=2s; median and p50 are one statistic)",
        ),
        (["itl_p50=5ms,itl_median=9ms"], "SLO itl_p50 given twice (itl_p50=5ms and itl_median=9ms;"),
    ],
)
def test_an_slo_given_twice_is_named_as_typed(texts: list[str], message: str) -> None:
    with pytest.raises(AutotuneError) as err:
        parse_slos(texts)
    assert message in str(err.value)


def test_median_and_p50_of_other_metrics_are_two_slos() -> None:
    assert [s.name for s in parse_slos("ttft_median=1s,itl_p50=5ms")] == ["ttft_median", "itl_p50"]


@pytest.mark.parametrize("text", ["ttft_p99=-2s", "itl_p99=-50ms", "ttft_p99=0s"])
def test_a_limit_not_above_zero_is_told_to_be_positive(text: str) -> None:
    with pytest.raises(AutotuneError, match="the limit must be positive"):
        parse_slos(text)


def test_margin_sign_follows_optuna_convention() -> None:
    # two requests: TTFTs 1.0 s and 3.0 s -> p99 ~2.98 s
    records = [
        RequestRecord(prompt_len=10, output_len=3, ttft=1.0, itl=[0.01, 0.01], latency=1.02),
        RequestRecord(prompt_len=10, output_len=3, ttft=3.0, itl=[0.02, 0.02], latency=3.04),
    ]
    result = compute_metrics(records, duration=4.0)
    loose, tight = parse_slos("ttft_p99=4s,ttft_p50=1s")
    assert loose.margin(result) == pytest.approx((result.get("p99_ttft_ms") - 4000) / 4000)
    assert loose.margin(result) < 0  # holds
    assert tight.margin(result) == pytest.approx(1.0)  # median 2 s vs 1 s: 100% over
