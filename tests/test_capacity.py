"""Capacity search: one server (one session) per trial, on the simulator and over real HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.backends.base import FailureKind
from autotune.backends.process import ProcessBackend
from autotune.backends.sim import SimBackend
from autotune.capacity import CapacitySearch, find_capacity
from autotune.config import EngineConfig
from autotune.slo import parse_slos
from autotune.workload import LengthDist, WorkloadSpec

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
# Short requests and two sequences at a time: the capacity is a few dozen req/s, found in seconds.
CONFIG = EngineConfig(model=LLAMA_8B, max_model_len=4096, max_num_seqs=2)
WORKLOAD = WorkloadSpec(
    name="tiny-capacity",
    num_requests=12,
    request_rate=8.0,
    load="capacity",
    prompt_len=LengthDist("fixed", 64),
    output_len=LengthDist("fixed", 16),
)
SLOS = parse_slos("ttft_p99=300ms")
# Appends a line to the file argv[1] at every launch, then becomes `autotune sim-server` (argv[2:]).
LAUNCHER = """import os, sys
with open(sys.argv[1], "a") as f:
    f.write("launch\\n")
os.execv(sys.executable, [sys.executable, "-m", "autotune.cli", "sim-server", *sys.argv[2:]])
"""


def counting_backend(tmp_path: Path, *extra_args: str) -> tuple[ProcessBackend, Path]:
    """A `vllm` backend on sim-server that counts its launches in the returned file."""
    script, launches = tmp_path / "launcher.py", tmp_path / "launches"
    script.write_text(LAUNCHER)
    launches.write_text("")
    serve_cmd = (sys.executable, str(script), str(launches), *extra_args)
    options = {"startup_timeout_s": 60.0, "benchmark_timeout_s": 60.0, "stop_grace_s": 3.0}
    return ProcessBackend("H100", serve_cmd=serve_cmd, **options), launches


def test_sim_capacity_pays_one_startup_and_every_benchmark() -> None:
    backend = SimBackend("H100")
    result = find_capacity(backend, CONFIG, WORKLOAD, SLOS)
    assert result.ok and result.info["capacity_rate"] > 0
    rates = result.info["capacity_rates_tried"]
    assert len(rates) >= 3
    # Each rate on its own server, as before sessions: the same benchmarks, but one startup per rate.
    alone = [backend.evaluate(CONFIG, WORKLOAD.with_load(request_rate=r), SLOS) for r in rates]
    assert result.startup_s == alone[0].startup_s > 0  # one startup, not len(rates)
    # (the rates in info are rounded, so their benchmarks differ in the last digits)
    assert result.benchmark_s == pytest.approx(sum(r.benchmark_s for r in alone), rel=1e-3)


def test_sim_capacity_of_a_config_that_cannot_start() -> None:
    bad = CONFIG.replace(max_num_batched_tokens=64, max_num_seqs=128)
    result = find_capacity(SimBackend("H100"), bad, WORKLOAD, SLOS)
    assert result.failure is FailureKind.INVALID_CONFIG and result.benchmark is None
    assert result.startup_s == SimBackend("H100").evaluate(bad, WORKLOAD, SLOS).startup_s > 0


def test_capacity_over_http_starts_the_server_once(tmp_path: Path) -> None:
    backend, launches = counting_backend(tmp_path)
    result = find_capacity(
        backend, CONFIG, WORKLOAD, SLOS, trial_dir=tmp_path / "trial", search=CapacitySearch(4)
    )
    assert result.ok, (result.failure, result.message, result.log_tail)
    assert launches.read_text().splitlines() == ["launch"]
    rates = result.info["capacity_rates_tried"]
    assert len(rates) == 4 and rates[:2] == [8.0, 16.0]
    assert result.info["capacity_rate"] in rates and result.benchmark.latency_ms["ttft"]["p99"] <= 300
    assert 0 < result.startup_s < result.benchmark_s


def test_a_server_that_dies_mid_search_ends_it_without_a_relaunch(tmp_path: Path) -> None:
    # The warm-up and the first load's 12 requests go through; the server dies in the second load.
    backend, launches = counting_backend(tmp_path, "--die-after", "16")
    result = find_capacity(backend, CONFIG, WORKLOAD, SLOS, trial_dir=tmp_path / "trial")
    assert launches.read_text().splitlines() == ["launch"]
    assert result.info["capacity_rates_tried"] == [8.0, 16.0]
    assert result.ok and result.info["capacity_rate"] == 8.0  # the rate that met the SLOs still counts
    assert result.info["capacity_stopped_by"].startswith("crashed: server exited with code 1")
