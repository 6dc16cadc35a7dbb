"""Trace replay: the Azure LLM inference trace 2023 and user CSVs (times, lengths, windows, bad rows)."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import numpy as np
import pytest
from errors import one_line_error

from autotune.workloads.spec import WorkloadSpec
from autotune.workloads.traces import DATA_DIR, TraceSource


def csv_rows(name: str) -> list[dict[str, str]]:
    with (DATA_DIR / f"{name}.csv").open() as f:
        return list(csv.DictReader(f))


def trace_spec(n: int = 50, **trace_kw) -> WorkloadSpec:
    return WorkloadSpec(name="trace", num_requests=n, trace=TraceSource("conv", **trace_kw))


def test_trace_replay_times_and_lengths_match_csv():
    rows = csv_rows("conv")[:50]
    requests = trace_spec().requests()
    assert requests[0].arrival_time == 0.0
    assert [r.prompt_len for r in requests] == [int(row["ContextTokens"]) for row in rows]
    assert [r.output_len for r in requests] == [int(row["GeneratedTokens"]) for row in rows]
    stamps = np.array([row["TIMESTAMP"].replace(" ", "T") for row in rows], dtype="datetime64[ns]")
    expected = (stamps - stamps[0]) / np.timedelta64(1, "s")
    assert np.allclose([r.arrival_time for r in requests], expected)


def test_trace_time_scale_halves_times():
    normal = [r.arrival_time for r in trace_spec().requests()]
    fast = [r.arrival_time for r in trace_spec(time_scale=2).requests()]
    assert np.allclose(fast, np.array(normal) / 2) and normal[-1] > 0


def test_trace_start_window_and_rate_rescale():
    requests = trace_spec(start=600).requests()
    assert requests[0].arrival_time == 0.0
    full = trace_spec(n=3000).requests()
    # the window starts at the first row at or after 600 s into the trace
    first = next(r for r in full if r.arrival_time >= 600)
    assert (requests[0].prompt_len, requests[1].prompt_len) == (
        first.prompt_len,
        full[first.request_id + 1].prompt_len,
    )
    rescaled = trace_spec().with_load(request_rate=5.0).requests()
    assert rescaled[-1].arrival_time == pytest.approx(50 / 5.0)


def test_trace_max_len_skips_long_rows():
    requests = WorkloadSpec(name="c", num_requests=2000, trace=TraceSource("code", max_len=2048)).requests()
    assert max(r.prompt_len + r.output_len for r in requests) <= 2048


def test_trace_lengths_only_uses_rate_arrivals():
    spec = WorkloadSpec(
        name="l", num_requests=300, request_rate=3.0, trace=TraceSource("code", arrivals="rate")
    )
    requests = spec.requests()
    assert requests[-1].arrival_time == pytest.approx(100.0)
    pairs = {(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv_rows("code")}
    assert all((r.prompt_len, r.output_len) in pairs for r in requests)
    assert spec.requests(seed=1) != requests


def test_a_capacity_search_samples_the_rows_a_trace_replay_covers():
    """A trace replay at rate arrivals (capacity probes, saturation runs) draws lengths only from the
    stretch the replay covers, stratified: every block of 64 requests holds one of its longest rows."""
    replay = trace_spec(n=500, start=600)
    stretch = [(r.prompt_len, r.output_len) for r in replay.requests()]
    sampled = replay.with_rate_arrivals().with_load(request_rate=4.0, num_requests=5000).requests()
    assert all((r.prompt_len, r.output_len) in set(stretch) for r in sampled)
    assert sampled[-1].arrival_time == pytest.approx(5000 / 4.0, rel=0.1)  # Poisson at the rate
    longest = sorted(p + o for p, o in stretch)[-len(stretch) // 64 :]
    blocks = [sampled[i : i + 64] for i in range(0, 4992, 64)]
    assert all(max(r.prompt_len + r.output_len for r in b) >= longest[0] for b in blocks)
    assert replay.burst(100).trace.rows == 500  # the saturation run samples the same stretch


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("time,prompt,output\n1,2,3\n", "its header has no TIMESTAMP, ContextTokens, GeneratedTokens"),
        ("", "its header has no TIMESTAMP"),  # it said "(list index out of range)"
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n0,9,3\n\n1,9\n",
            "line 4: 2 fields, fewer than the header's 3",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n0,9,3\n1,9,lots\n",
            "line 3: GeneratedTokens 'lots' is not a whole",
        ),
    ],
)
def test_bad_trace_csv(tmp_path: Path, text: str, said: str):
    path = tmp_path / "t.csv"
    path.write_text(text)
    spec = WorkloadSpec(name="t", num_requests=1, trace=TraceSource(str(path)))
    assert said in one_line_error(spec.requests)


def write_trace(tmp_path: Path, stamps: list[str], encoding: str = "utf-8") -> WorkloadSpec:
    """A trace CSV with these timestamps (100-token prompts, 10-token outputs) and a workload replaying it."""
    rows = "".join(f"{stamp},100,10\n" for stamp in stamps)
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows, encoding=encoding)
    return WorkloadSpec(name="t", num_requests=len(stamps), trace=TraceSource(str(path)))


def test_trace_saved_with_a_byte_order_mark_reads(tmp_path: Path):
    """Excel's "CSV UTF-8" starts with a byte order mark: it must not join the first column's name."""
    spec = write_trace(tmp_path, ["2023-11-16 18:15:46", "2023-11-16 18:15:48.5"], encoding="utf-8-sig")
    assert [r.arrival_time for r in spec.requests()] == [0.0, 2.5]


@pytest.mark.parametrize(
    ("stamps", "arrivals"),
    [(["0", "1", "2"], [0.0, 1.0, 2.0]), (["10", "11", "12.5", "10.25"], [0.0, 0.25, 1.0, 2.5])],
)
def test_trace_numeric_timestamps_are_seconds(tmp_path: Path, stamps: list[str], arrivals: list[float]):
    """A TIMESTAMP column of numbers is seconds (numpy would read 2 as the year 2)."""
    assert [r.arrival_time for r in write_trace(tmp_path, stamps).requests()] == arrivals


def test_trace_timestamps_with_a_zone_are_converted_to_utc_without_a_warning(tmp_path: Path):
    stamps = [
        "2023-11-16T18:15:46Z",
        "2023-11-16T19:15:48+01:00",
        "2023-11-16 17:45:50-0030",
        "2023-11-16T20:15:51+02",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warned on each zoned timestamp it parsed
        requests = write_trace(tmp_path, [*stamps, "2023-11-16T18:15:47.5+00:00"]).requests()
    assert [r.arrival_time for r in requests] == [0.0, 1.5, 2.0, 4.0, 5.0]


@pytest.mark.parametrize(
    ("stamps", "expected"),
    [
        (["0", "soon"], "line 3: TIMESTAMP 'soon' is neither seconds (a number) nor an ISO date-time"),
        (["0", "nan"], "line 3: TIMESTAMP 'nan' is neither"),
        (
            ["2023-11-16 18:15:46", "2023-13-01 00:00:00"],
            "line 3: TIMESTAMP '2023-13-01 00:00:00' is neither",
        ),
        (["2023-11-16 18:15:46", "now"], "line 3: TIMESTAMP 'now' is neither"),
        (
            ["0", "2023-11-16 18:15:46"],
            "line 3: TIMESTAMP '2023-11-16 18:15:46' mixes formats: the first row's",
        ),
        (
            ["2023-11-16 18:15:46", "5"],
            "line 3: TIMESTAMP '5' mixes formats: the first row's TIMESTAMP is an ISO",
        ),
    ],
)
def test_bad_trace_timestamp_names_its_line(tmp_path: Path, stamps: list[str], expected: str):
    message = one_line_error(write_trace(tmp_path, stamps).requests)
    assert message.startswith(f"trace {tmp_path / 't.csv'} ") and expected in message


def test_a_trace_token_count_beyond_any_context_is_one_line(tmp_path: Path):
    """A count numpy's int64 cannot hold was an OverflowError traceback."""
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100000000000000000000,10\n")
    spec = WorkloadSpec(name="t", num_requests=1, trace=TraceSource(str(path)))
    assert "has a token count above 2,147,483,647" in one_line_error(spec.requests)


def test_a_negative_trace_token_count_names_its_line(tmp_path: Path):
    """A corrupt row was dropped as a 0-token one is, and the error that followed blamed the trace's
    length ("the trace has 1 requests after 0s, fewer than num_requests=2")."""
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,9,3\n\n1,-1,2\n")
    spec = WorkloadSpec(name="t", num_requests=2, trace=TraceSource(str(path)))
    assert one_line_error(spec.requests) == f"trace {path}:4: a negative token count"
