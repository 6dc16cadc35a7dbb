"""The load generator against real sim-server subprocesses: timings, failures, early abort."""

from __future__ import annotations

import httpx
import pytest

from autotune.backends.server_metrics import scrape_metrics, server_figures
from autotune.measure.early_abort import SloGuard
from autotune.measure.loadgen import CHAT, run_load_sync
from autotune.measure.metrics import compute_metrics
from autotune.measure.slo import parse_slos
from autotune.sim_server.server import start_sim_server
from autotune.workloads.spec import Request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _requests(n: int, prompt_len: int = 64, output_len: int = 8, gap_s: float = 0.0) -> list[Request]:
    return [Request(i, prompt_len, output_len, arrival_time=i * gap_s) for i in range(n)]


def test_records_match_the_servers_own_view() -> None:
    requests = _requests(24, output_len=6, gap_s=0.01)
    with start_sim_server([MODEL, "--debug-timings"]) as proc:
        result = run_load_sync(proc.base_url, MODEL, requests, max_concurrency=8)
        rows = {int(r["id"]): r for r in httpx.get(proc.base_url + "/debug/requests").json()["requests"]}
    assert result.aborted is None and result.not_sent == 0
    assert len(result.records) == 24 and sorted(result.request_ids) == list(range(24))
    for rid, record in zip(result.request_ids, result.records, strict=True):
        row = rows[rid]
        assert record.success, record.error
        assert record.output_len == 6 == row["completion_tokens"]
        assert row["prompt_tokens"] == 64 == record.prompt_len
        assert len(record.itl) == 5
        # Same clock in both processes (CLOCK_MONOTONIC): the client sends before the server accepts and
        # sees the first token after the server sent it, so its TTFT is the server's plus transport.
        sent = result.t0 + record.start_time
        assert sent <= row["read"] <= row["received"] <= row["arrival"]  # socket, handler, engine
        assert sent + record.ttft >= row["first_sent"]
        assert record.ttft >= row["ttft"]
        assert record.latency >= record.ttft
    metrics = compute_metrics(result.records, result.duration)
    assert metrics.completed == 24 and metrics.total_output_tokens == 24 * 6


def test_a_new_salt_misses_the_prefix_cache_of_the_last_run() -> None:
    requests = _requests(8, prompt_len=256, output_len=4)
    hit_rates = []
    with start_sim_server([MODEL]) as proc:
        for salt in (0, 0, 1):
            before = scrape_metrics(proc.base_url)
            result = run_load_sync(proc.base_url, MODEL, requests, salt=salt)
            assert all(r.success for r in result.records)
            hit_rates.append(
                server_figures(before, scrape_metrics(proc.base_url), None)["prefix_cache_hit_rate"]
            )
    assert hit_rates[0] == 0 and hit_rates[1] > 0.9  # the same prompts again: served from the cache
    assert hit_rates[2] == 0  # salted: nothing reused


def test_concurrency_cap_is_respected() -> None:
    requests = _requests(12, output_len=20)
    with start_sim_server([MODEL, "--debug-timings"]) as proc:
        result = run_load_sync(proc.base_url, MODEL, requests, max_concurrency=3)
        rows = httpx.get(proc.base_url + "/debug/requests").json()["requests"]
    events = sorted([(r["arrival"], 1) for r in rows] + [(r["done"], -1) for r in rows])
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    assert peak <= 3
    assert all(r.success for r in result.records)


def test_chat_endpoint_and_text_prompts() -> None:
    """A text prompt's length is the server's count (its usage record: the chat template's tokens too),
    not the client's estimate without a tokenizer, for the run's input tokens as the server counts them."""
    requests = [Request(0, 30, 5), Request(1, 10, 4, prompt="Tell me about paged attention.")]
    with start_sim_server([MODEL, "--debug-timings"]) as proc:
        result = run_load_sync(proc.base_url, MODEL, requests, endpoint=CHAT)
        rows = {int(r["id"]): r for r in httpx.get(proc.base_url + "/debug/requests").json()["requests"]}
    assert [r.success for r in result.records] == [True, True]
    assert sorted(r.output_len for r in result.records) == [4, 5]
    counted = {rid: record.prompt_len for rid, record in zip(result.request_ids, result.records, strict=True)}
    assert counted == {rid: rows[rid]["prompt_tokens"] for rid in (0, 1)} and counted[1] != 10


def test_a_server_that_dies_gives_failed_records_not_lost_ones() -> None:
    requests = _requests(10, output_len=200)
    with start_sim_server([MODEL, "--die-after", "4"]) as proc:
        result = run_load_sync(proc.base_url, MODEL, requests, max_concurrency=4, request_timeout_s=10)
        proc.process.wait(timeout=5)
        assert proc.process.returncode == 1
    assert len(result.records) == 10
    assert not any(r.success for r in result.records)
    assert all(r.error for r in result.records)


def test_a_hung_server_times_out_requests() -> None:
    with start_sim_server([MODEL, "--hang-after", "1"]) as proc:
        result = run_load_sync(proc.base_url, MODEL, _requests(2, output_len=50), request_timeout_s=1.0)
        with pytest.raises(httpx.TimeoutException):
            httpx.get(proc.base_url + "/health", timeout=0.5)
    assert len(result.records) == 2
    assert all(not r.success and r.error.startswith("timeout") for r in result.records)


def test_early_abort_stops_a_hopeless_run_and_keeps_partial_records() -> None:
    # One request at a time (max_num_seqs=1), 80 output tokens each (~0.6 s on an 8B model on an H100)
    # but a new request every 0.2 s: the queue grows, and 40 requests would take half a minute.
    # The first requests finish in time; the TTFT SLO is lost after a few seconds at most.
    requests = _requests(40, prompt_len=32, output_len=80, gap_s=0.2)
    slos = parse_slos("ttft_p90=300ms")
    guard = SloGuard.for_requests(slos, [r.output_len for r in requests])
    with start_sim_server([MODEL, "--max-num-seqs", "1"]) as proc:
        result = run_load_sync(proc.base_url, MODEL, requests, guard=guard)
    assert result.aborted is not None and result.aborted.startswith("p90_ttft_ms cannot be met")
    assert result.duration < 6.0
    assert len(result.records) >= 1 and all(r.success for r in result.records)
    assert result.cancelled >= 1 and result.not_sent >= 1
    assert len(result.records) + result.cancelled + result.not_sent == 40
