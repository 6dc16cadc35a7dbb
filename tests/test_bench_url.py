"""`autotune bench --url`, a deployer's check of a running deployment: a real `autotune sim-server`
subprocess started with non-default flags, measured by the `autotune` command run as a process from the
folder that holds the workload file (a relative path).

It must show the server's own config (what /metrics and /v1/models say), never autotune's defaults; KV
usage from the server's metrics; the load asked for (--rate); a verdict per SLO; and with --capacity,
the capacity search a trial runs, against the live server, with a line per measurement.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from cli import autotune
from pytest import approx

from autotune.sim_server.process import start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WORKLOAD = """name: check
num_requests: 24
load: fixed
request_rate: 50
prompt_len: {dist: fixed, mean: 64}
output_len: {dist: fixed, mean: 48}
"""
# How the deployment was launched: none of these is autotune's (or vLLM's) default.
SERVER_FLAGS = ["--no-enable-chunked-prefill", "--block-size", "32", "--gpu-memory-utilization", "0.84"]
SERVER_FLAGS += ["--max-model-len", "4096"]


def bench(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`autotune bench ARGS` as a process in `folder` (a failed check is a result, not an error)."""
    return autotune(folder, "bench", *args, check=False, timeout=240)


def test_bench_url_reports_the_servers_config_its_kv_usage_and_a_verdict_per_slo(tmp_path: Path) -> None:
    # 80 requests: a fixed-load run is judged on keeping up only after its first 30 sends
    (tmp_path / "check.yaml").write_text(WORKLOAD.replace("num_requests: 24", "num_requests: 80"))
    with start_sim_server([MODEL, *SERVER_FLAGS, "--max-num-seqs", "64"]) as server:
        slos = ["--slo", "ttft_p99=30s", "--slo", "itl_p50=0.001ms"]
        args = ["--url", server.base_url, "--workload", "check.yaml", "--rate", "16", *slos, "--json"]
        done = bench(tmp_path, *args)
        assert server.process.poll() is None  # still running: a check does not own the server
    report = json.loads(done.stdout or "{}")
    assert "config" in report, done.stderr
    config = report["config"]
    assert config == {
        "block_size": 32,
        "gpu_memory_utilization": 0.84,
        "enable_prefix_caching": True,
        "kv_cache_dtype": "auto",
        "max_model_len": 4096,
    }
    # what no vLLM server reports is said to be unknown, not filled with defaults (chunked prefill on)
    assert set(report["config_unknown"]) == {
        "enable_chunked_prefill",
        "max_num_seqs",
        "max_num_batched_tokens",
        "tensor_parallel_size",
    }
    assert report["config_sources"]["block_size"] == "/metrics vllm:cache_config_info"
    assert report["peak_kv_cache_usage"] > 0  # sampled during the load, not read once it drained
    # --rate 16, not the file's 50: the last of 80 Poisson arrivals is at 80 / 16 s
    assert report["request_rate"] == 16 and report["duration"] >= 80 / 16
    # whether the server kept up with the rate is judged (on a starved 2-core machine it may not have)
    assert report["load_verdict"]["offered_rate"] > 0 and "kept_up" in report["load_verdict"]
    assert "backlog_growth" in report["load_verdict"]
    verdicts = {v["slo"]: v["met"] for v in report["slo_verdicts"]}
    assert verdicts == {"ttft_p99=30s": True, "itl_p50=0.001ms": False}
    assert done.returncode == 1, done.stderr  # a verdict failed: the check fails
    assert "time-scale" not in done.stderr  # a real-time server gets no note on its clock


def test_bench_url_says_when_the_server_is_a_time_scaled_sim_server(tmp_path: Path) -> None:
    """A sim-server with --time-scale 20 serves 20x faster than the GPU it simulates: bench measures
    wall-clock time, so its figures are 20x too good, and it says so (calibrate --url rescales). Its URL
    is given as an OpenAI client's base URL, ending in /v1 (it was "GET /v1/v1/models answered 404")."""
    (tmp_path / "check.yaml").write_text(WORKLOAD)
    with start_sim_server([MODEL, "--time-scale", "20"]) as server:
        # --rate 8, not the file's 50: a 2-core machine busy with other tests keeps up with it
        url = f"{server.base_url}/v1/"
        done = bench(tmp_path, "--url", url, "--workload", "check.yaml", "--rate", "8", "--json")
    assert done.returncode == 0, done.stderr
    assert (
        f"{server.base_url} is autotune sim-server at --time-scale 20: its latencies and rates" in done.stderr
    )


def test_a_workload_longer_than_the_servers_context_is_refused_before_a_request(tmp_path: Path) -> None:
    """The server's /v1/models says its max_model_len: a request past it would be answered 400 at any
    load, so bench stops in one line before sending anything (it sent them all and printed a table of
    zeros), as the in-process bench does."""
    (tmp_path / "long.yaml").write_text(WORKLOAD.replace("mean: 64}", "mean: 5000}"))
    with start_sim_server([MODEL, "--max-model-len", "4096", "--debug-timings"]) as server:
        done = bench(tmp_path, "--url", server.base_url, "--workload", "long.yaml")
        served = httpx.get(server.base_url + "/debug/requests", timeout=10).json()["requests"]
    assert done.returncode == 2 and served == [], done.stderr
    needs = "a request needs 5048 tokens (5000 prompt + 48 output), more than max_model_len 4096"
    assert needs in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_bench_url_capacity_searches_the_running_server(tmp_path: Path) -> None:
    (tmp_path / "check.yaml").write_text(WORKLOAD)
    # 16 sequences at a time: a capacity of a few dozen requests per second, probed in seconds (an ITL
    # SLO: a TTFT one would wait for the queue to settle near saturation, a minute per probe).
    quick = ["--max-probes", "3", "--min-window", "1.5", "--min-window-requests", "20"]
    with start_sim_server([MODEL, *SERVER_FLAGS, "--max-num-seqs", "16"]) as server:
        args = ["--url", server.base_url, "--workload", "check.yaml", "--capacity", "--slo", "itl_p99=1s"]
        done = bench(tmp_path, *args, *quick, "--json")
        assert server.process.poll() is None
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    capacity = report["capacity"]
    probes = capacity["probes"]
    assert 1 <= len(probes) <= 3 and capacity["saturation_throughput"] > 0
    assert capacity["rate"] in [p["rate"] for p in probes if p["verdict"] == "pass"]
    assert capacity["limited_by"]  # what keeps it from being higher (keeping up, with a 1 s ITL limit)
    assert report["request_rate"] == capacity["rate"]  # the window at that rate, as offered
    assert capacity["sustained"]["request_throughput"] == approx(capacity["rate"], rel=1e-4)
    assert report["slo_verdicts"][0]["met"] is True
    # progress: the saturation burst and each probe, as they ran
    assert "saturation:" in done.stderr and done.stderr.count("probe at") == sum(p["windows"] for p in probes)


def test_sigterm_stops_bench_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM (a service manager, `timeout`) to `bench --url` mid-run: it said nothing and exited 143,
    where `run` says "interrupted" and exits 130 (the CLI's promise for both)."""
    (tmp_path / "long.yaml").write_text(WORKLOAD.replace("num_requests: 24", "num_requests: 2000"))
    with start_sim_server([MODEL]) as server:
        command = [sys.executable, "-m", "autotune.cli", "bench", "--url", server.base_url]
        command += ["--workload", "long.yaml", "--rate", "20"]  # 100 s of arrivals
        proc = subprocess.Popen(
            command, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while not _metric_total(server.base_url) and time.monotonic() < deadline:
            time.sleep(0.2)  # until the load reaches the server
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    # one line: a stop raised inside the load's event loop had also printed "Task exception was never
    # retrieved" and its traceback, at times
    assert err.strip() == "autotune bench: interrupted", err


def _metric_total(base_url: str) -> float:
    """Requests the server has taken in (vllm:prompt_tokens_total > 0 once one was)."""
    import httpx

    text = httpx.get(base_url + "/metrics").text
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:prompt_tokens_total")
    )
