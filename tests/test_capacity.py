"""Capacity search: one server (one session) per trial, on the simulator and over real HTTP: the rates
it probes, how long it measures each, and the capacity it reports. How a probe's windows are judged:
tests/test_probe_verdicts.py."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
from pytest import approx

from autotune.backends.process import ProcessBackend
from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.slo import parse_slos
from autotune.measure.steady_state import relaxation_s
from autotune.trial.capacity import (
    RELAXATIONS,
    CapacitySearch,
    find_capacity,
    window_requests,
)
from autotune.trial.probe import meets
from autotune.trial.saturation import saturation_runs
from autotune.trial.task import SearchPlan, evaluate_trial
from autotune.workloads.files import load_workload
from autotune.workloads.spec import LengthDist, WorkloadSpec

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
    # The first capacity probe plans ~1,000 requests at ~15.6 req/s (0.9 x the burst throughput of
    # max_num_seqs 2): over a minute when early abort comes late on a busy machine.
    options = {"startup_timeout_s": 60.0, "benchmark_timeout_s": 120.0, "stop_grace_s": 3.0}
    return ProcessBackend("H100", serve_cmd=serve_cmd, **options), launches


# Lower floors for the derived warm-up and window: the tiny workload's requests live ~0.1 s (windows
# still hold >= 400 requests: the sim runs them in milliseconds).
QUICK = CapacitySearch(min_warmup_s=1.0, min_window_s=10.0)


def test_sim_capacity_pays_one_startup_and_every_run() -> None:
    backend = SimBackend("H100")
    result = find_capacity(backend, CONFIG, WORKLOAD, SLOS, search=QUICK)
    assert result.ok and result.capacity.rate > 0
    probes = result.capacity.probes
    assert len(probes) >= 2
    alone = backend.evaluate(CONFIG, WORKLOAD, SLOS)
    assert result.startup_s == alone.startup_s > 0  # one startup for the saturation run and every probe
    # every run is accounted for: spent, or saved by the early abort of a probe that was lost; a probe
    # measured again ran a warm-up and a window each time
    warmup, window = result.capacity.window_s
    runs = sum(p.windows for p in probes)
    assert runs > len(probes)  # some probe was measured again (see the test below)
    assert result.benchmark_s + result.saved_s > runs * (warmup + window) * 0.9
    assert result.saved_s > 0


def test_a_probe_too_close_to_call_is_measured_longer_and_counts_as_a_miss() -> None:
    """Near the threshold a window's p99 cannot tell pass from fail: a second window is measured and
    pooled with the first; still unsure, the rate is not reported (another run at it could miss the SLO)."""
    result = find_capacity(SimBackend("H100"), CONFIG, WORKLOAD, SLOS, search=QUICK)
    probes = result.capacity.probes
    unsure = [p for p in probes if p.verdict == "unsure"]
    assert unsure and all(p.windows == QUICK.max_windows for p in unsure)
    assert all(not p.meets_slos for p in unsure)
    assert all(p.rate > result.capacity.rate for p in unsure)
    sure = [p for p in probes if p.verdict != "unsure"]
    assert any(p.windows == 1 for p in sure)  # clear verdicts are not measured again


def test_capacity_is_a_rate_the_config_sustains() -> None:
    """At the reported rate a 4x longer run keeps up and meets the SLO; at the bracket's top it does not."""
    backend = SimBackend("H100")
    result = find_capacity(backend, CONFIG, WORKLOAD, SLOS, search=QUICK)
    low, high = result.capacity.bracket
    top = [p for p in result.capacity.probes if p.rate == high]
    # within the resolution, or twice that when the rate above was too close to call
    fine = QUICK.resolution if top[0].verdict != "unsure" else (1 + QUICK.resolution) ** 2 - 1
    assert low == result.capacity.rate and high / low - 1 <= fine + 1e-9
    assert result.capacity.bound_measured  # the top was a probe that failed, not the estimate
    long_run = WORKLOAD.with_load(request_rate=low, num_requests=int(low * 4 * sum(result.capacity.window_s)))
    check = backend.evaluate(CONFIG, long_run, SLOS)
    assert check.kept_up and meets(check, SLOS)
    failing = [p for p in result.capacity.probes if not p.meets_slos]
    assert failing and min(p.rate for p in failing) == high
    # the result's throughputs are the capacity's, and goodput with them: it never passes throughput
    bench = result.benchmark
    assert bench.request_throughput == pytest.approx(result.capacity.rate, abs=1e-4)
    assert bench.request_goodput is not None and 0 < bench.request_goodput <= bench.request_throughput


@pytest.mark.parametrize("off", [1.0, 1.1])
def test_a_hinted_search_brackets_the_hint_and_finds_the_same_capacity_with_fewer_probes(off: float) -> None:
    """Started from a predicted capacity (the guide's; here the unhinted search's answer x `off`), the
    search probes the hint first, finds a capacity within the unhinted search's bracket widened by the
    resolution (twice it: near the threshold windows are unsure and verdicts vary), and measures fewer
    rates for less GPU time. (A hint 10-20 % low costs more than the plain search here: passing probes
    near the threshold need more windows; docs/guided-search-experiments.md.)"""
    backend = SimBackend("H100")
    plain = find_capacity(backend, CONFIG, WORKLOAD, SLOS, search=QUICK)
    hint = plain.capacity.rate * off
    hinted = find_capacity(backend, CONFIG, WORKLOAD, SLOS, search=dataclasses.replace(QUICK, hint_rate=hint))
    assert hinted.capacity.probes[0].rate == approx(hint, rel=1e-3)
    low, high = plain.capacity.bracket
    slack = (1 + QUICK.resolution) ** 2
    assert low / slack <= hinted.capacity.rate <= high * slack
    assert len(hinted.capacity.probes) < len(plain.capacity.probes)
    assert hinted.benchmark_s + hinted.saved_s < plain.benchmark_s + plain.saved_s
    low, high = hinted.capacity.bracket
    assert hinted.capacity.bound_measured and high / low <= slack + 1e-9


def test_a_trial_passes_its_hint_to_the_capacity_search() -> None:
    """The executors' plan (the guided run's corrected capacity) reaches the search: its first probe."""
    result = evaluate_trial(
        SimBackend("H100"), CONFIG, WORKLOAD, SLOS, 0, (), None, SearchPlan(hint_rate=5.0)
    )
    assert result.capacity.probes[0].rate == approx(5.0)
    plain = evaluate_trial(SimBackend("H100"), CONFIG, WORKLOAD, SLOS, 0, (), None)
    assert plain.capacity.probes[0].rate != approx(5.0)


@pytest.mark.parametrize("slo", ["itl_p99=1s", ""])
def test_capacity_is_bounded_without_a_ttft_slo(slo: str) -> None:
    """ITL-only or no SLO: the rate is bounded by what the server keeps up with, not by a probe limit."""
    slos = parse_slos(slo) if slo else []
    result = find_capacity(SimBackend("H100"), CONFIG, WORKLOAD, slos, search=QUICK)
    saturation = result.capacity.saturation_throughput
    assert 0 < result.capacity.rate <= 1.1 * saturation
    over = [p for p in result.capacity.probes if not p.meets_slos]
    # what failed was keeping up: a growing backlog, or less than 96 % of the offered rate served
    assert over and all(p.kept_up is False or p.served_rate < 0.96 * p.rate for p in over)


def test_sim_capacity_of_a_config_that_cannot_start() -> None:
    bad = CONFIG.replace(max_num_batched_tokens=64, max_num_seqs=128)
    result = find_capacity(SimBackend("H100"), bad, WORKLOAD, SLOS)
    assert result.failure is FailureKind.INVALID_CONFIG and result.benchmark is None
    assert result.startup_s == SimBackend("H100").evaluate(bad, WORKLOAD, SLOS).startup_s > 0


def test_capacity_over_http_starts_the_server_once(tmp_path: Path) -> None:
    backend, launches = counting_backend(tmp_path)
    search = CapacitySearch(
        max_probes=3, min_warmup_s=0.5, min_window_s=1.5, min_window_requests=20, min_served=0.0
    )
    # A loose SLO: over real HTTP on a busy machine a 300 ms p99 can fail at every rate; a median, which a
    # window of a few dozen requests can be sure of (a p99 needs 1,000: too slow over HTTP here); and an
    # ITL one, whose windows need no queue relaxation time (a TTFT's take a minute near saturation).
    slos = parse_slos("itl_p50=3s")
    result = find_capacity(backend, CONFIG, WORKLOAD, slos, trial_dir=tmp_path / "trial", search=search)
    assert result.ok, (result.failure, result.message, result.log_tail)
    assert launches.read_text().splitlines() == ["launch"]
    probes = result.capacity.probes
    assert len(probes) == 3 and result.capacity.saturation_throughput > 0
    assert all(p.served_rate is not None for p in probes)  # steadiness measured over HTTP too
    assert result.capacity.rate in [p.rate for p in probes]
    assert result.benchmark.latency_ms["itl"]["p50"] <= 3000
    assert 0 < result.startup_s < result.benchmark_s


def test_a_server_that_dies_mid_search_ends_it_without_a_relaunch(tmp_path: Path) -> None:
    # The warm-up request and the saturation run's 12 requests go through; it dies in the first probe.
    backend, launches = counting_backend(tmp_path, "--die-after", "16")
    search = CapacitySearch(
        min_warmup_s=0.5, min_window_s=1.5, min_window_requests=20, tail_samples=0, min_served=0.0
    )
    result = find_capacity(backend, CONFIG, WORKLOAD, SLOS, trial_dir=tmp_path / "trial", search=search)
    assert launches.read_text().splitlines() == ["launch"]
    assert len(result.capacity.probes) == 1
    assert result.failure is FailureKind.CRASHED and "server exited with code 1" in result.message
    # The probe's warm-up alone is ~20 s: the load ended when a warm-up request found the server gone,
    # not once measuring began (it took 22 s so), and the trial's GPU time says so.
    assert result.benchmark_s < 10


@pytest.mark.parametrize(
    ("slo", "requests"),
    [
        ("ttft_p99=2s", 1000),
        ("ttft_p99=2s,itl_p99=50ms", 1000),
        ("e2el_p90=9s", 400),
        ("itl_p99=50ms", 400),
        ("", 400),
    ],
)
def test_a_window_holds_enough_requests_to_see_the_tail_it_judges(slo: str, requests: int) -> None:
    """p99 of a per-request metric: 1,000 requests (10 over the limit at the threshold); ITL pools every
    token gap, so 400 requests already hold thousands of them."""
    assert window_requests(parse_slos(slo) if slo else []) == requests


def test_far_below_saturation_a_ttft_tail_needs_no_long_window() -> None:
    """Queueing episodes, which make a TTFT tail rare, need a loaded server; a length-driven tail (E2EL,
    TPOT) is as rare at any load."""
    assert window_requests(parse_slos("ttft_p99=2s,itl_p99=50ms"), queued=False) == 400
    assert window_requests(parse_slos("ttft_p99=2s,e2el_p99=20s"), queued=False) == 1000
    result = find_capacity(SimBackend("H100"), CONFIG, WORKLOAD, SLOS, search=QUICK)  # p99 TTFT 300 ms
    loaded_from = QUICK.queue_free_below * result.capacity.saturation_throughput
    probes = result.capacity.probes
    loaded = [p.requests for p in probes if p.rate >= loaded_from]
    light = [p.requests for p in probes if p.rate < loaded_from]
    assert loaded and light  # the search probed on both sides
    # windows are sized for 1,000 or 400 arrivals; Poisson arrivals make the count a little off
    assert min(loaded) >= 900 and max(light) < 600 and min(light) >= 350


def test_the_saturation_burst_is_sized_by_the_batch_the_kv_cache_holds() -> None:
    """4 x the batch: max_num_seqs when the KV cache holds that many requests, fewer when it does not."""
    config = EngineConfig(model=LLAMA_8B, max_model_len=4096, max_num_seqs=128)
    with SimBackend("H100").session(config) as session:
        runs = saturation_runs(session, config, WORKLOAD, 0)
    assert [r.benchmark.completed for r in runs] == [256, 512]  # 80-token requests: KV holds 128
    # An L4 holds ~3.5 GB of KV: about a dozen requests of 2,064 tokens, so the first burst is enough.
    long = dataclasses.replace(WORKLOAD, prompt_len=LengthDist("fixed", 2048))
    with SimBackend("L4").session(config) as session:
        runs = saturation_runs(session, config, long, 0)
    assert [r.benchmark.completed for r in runs] == [256]


def test_a_queued_slo_is_judged_over_the_queues_relaxation_time() -> None:
    """Near saturation a TTFT tail keeps growing for about 1 / (mu (1 - sqrt(rho))^2): every probe's
    window lasts `relaxations` of that, and rates whose relaxation would not fit a probe are not tried.
    (Llama 8B with 64 sequences on an H100, chat: 1,000 requests passed 99.5 % of its saturation rate
    with p99 TTFT 1.1 s; 10,000 gave 4.9 s.)"""
    assert relaxation_s(8.1, 10.0) == approx(1 / (10 * 0.1**2))
    assert relaxation_s(10.0, 10.0) == relaxation_s(11.0, 10.0) == math.inf
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=2048)
    result = find_capacity(SimBackend("H100"), config, load_workload("chat"), parse_slos("ttft_p99=2s"))
    sat = result.capacity.saturation_throughput
    probes = result.capacity.probes
    assert max(p.rate for p in probes) < 0.96 * sat  # a queued SLO cannot be confirmed at saturation
    settle = {p.rate: RELAXATIONS * p.rate * relaxation_s(p.rate, sat) for p in probes}
    near = [p for p in probes if settle[p.rate] > 1000]
    assert near  # the search went where the relaxation time, not 1,000 requests, sets the window
    assert all(p.requests >= 0.9 * settle[p.rate] for p in near)
