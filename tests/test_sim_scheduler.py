"""Scheduler invariants of the simulated V1 engine, step by step, and simulate()'s client semantics."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from autotune.core.config import EngineConfig
from autotune.measure.metrics import compute_metrics
from autotune.sim.engine import SimEngine
from autotune.sim.noise import StepNoise
from autotune.sim.replay import simulate
from autotune.workloads.spec import Request

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def mixed_requests(n: int, seed: int = 0, prefix: bool = False) -> list[Request]:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(16, 2000, n)
    outputs = rng.integers(1, 600, n)
    return [
        Request(
            request_id=i,
            prompt_len=int(prompts[i]) + (512 if prefix else 0),  # prefix + own tokens
            output_len=int(outputs[i]),
            prefix_id=(i % 4) if prefix else None,
            prefix_len=512 if prefix else 0,
        )
        for i in range(n)
    ]


def tight_engine(**flags: object) -> SimEngine:
    """Llama-3.1-8B on an L4: a few thousand KV blocks, so a burst of requests must preempt."""
    config = EngineConfig(model=LLAMA_8B, max_model_len=4096, gpu_memory_utilization=0.8).replace(**flags)
    return SimEngine(config, "L4")


@pytest.mark.parametrize("threshold", [0, 128])
def test_invariants_hold_every_step_under_kv_pressure(threshold: int) -> None:
    """Also with prefill chunks capped (`long_prefill_token_threshold`): many requests mid-prefill at once,
    preempted among themselves and the decodes."""
    engine = tight_engine(long_prefill_token_threshold=threshold)
    requests = mixed_requests(300)
    for r in requests:
        engine.add_request(r)
    emitted: Counter[int] = Counter()
    finished: list[int] = []
    last_now = 0.0
    while engine.has_unfinished():
        out = engine.step()
        assert out.duration >= 0 and engine.now >= last_now
        last_now = engine.now
        assert 0 <= engine.num_free_blocks <= engine.memory.num_gpu_blocks  # never over capacity
        assert engine.stats.num_running <= engine.config.max_num_seqs
        assert len(set(rid for rid, _ in out.new_tokens)) == len(out.new_tokens)  # one entry per request
        emitted.update({rid: n for rid, n in out.new_tokens})
        finished += out.finished
    assert sorted(finished) == [r.request_id for r in requests]  # none lost, none duplicated
    assert engine.stats.num_preemptions > 0  # the KV cache was short
    # Every request gets exactly its output tokens, preempted ones included.
    assert all(emitted[r.request_id] == r.output_len for r in requests)
    assert engine.stats.generation_tokens == sum(r.output_len for r in requests)
    assert engine.num_free_blocks == engine.memory.num_gpu_blocks  # everything released


@pytest.mark.parametrize(("tight", "threshold"), [(False, 0), (True, 0), (True, 256)])
def test_advance_runs_the_very_steps_of_step(tight: bool, threshold: int) -> None:
    """A replay's `advance` runs decode-only steps without the prefill and admission work and several
    steps a call: the same steps, clock and records as `step` one at a time, with noise and under
    preemption (the L4), and with prefill chunks capped."""
    rng = np.random.default_rng(3)
    requests = mixed_requests(150, seed=3)
    arrivals = np.cumsum(rng.exponential(1 / 1.5, len(requests)))  # light load: decode-only stretches
    config = EngineConfig(model=LLAMA_8B, max_model_len=4096, max_num_seqs=64)
    config = config.replace(long_prefill_token_threshold=threshold)
    engines = [
        SimEngine(config.replace(gpu_memory_utilization=0.8) if tight else config, "L4" if tight else "H100",
                  StepNoise(0.02, [7]))
        for _ in range(2)
    ]  # fmt: skip
    for engine in engines:
        for r, at in zip(requests, arrivals, strict=True):
            engine.add_request(r, send_time=float(at))
    stepped, advanced = engines
    while stepped.has_unfinished():
        stepped.step()
    calls = 0
    while advanced.has_unfinished():
        advanced.advance()
        calls += 1
    assert calls < advanced.num_steps  # several steps a call
    assert advanced.step_times == stepped.step_times
    assert advanced.finished_records() == stepped.finished_records()
    assert advanced.stats == stepped.stats
    assert (advanced.stats.num_preemptions > 0) == tight


@pytest.mark.parametrize("concurrency", [None, 8])
def test_a_replay_sends_each_request_before_the_step_it_may_join(
    concurrency: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """simulate() lets `advance` run several steps a call, up to the next send: the same run as a replay
    that takes one generic step a call (the reference, patched in)."""
    rng = np.random.default_rng(5)
    requests = [
        dataclasses.replace(r, arrival_time=float(at))
        for r, at in zip(mixed_requests(120, seed=5), np.cumsum(rng.exponential(0.5, 120)), strict=True)
    ]
    config = EngineConfig(model=LLAMA_8B, max_model_len=4096)
    fast = simulate(config, "H100", requests, max_concurrency=concurrency)
    monkeypatch.setattr(SimEngine, "advance", lambda engine, until=0.0: engine._step(emit=False))
    plain = simulate(config, "H100", requests, max_concurrency=concurrency)
    assert fast.records == plain.records and fast.num_steps == plain.num_steps


def test_no_preemption_when_kv_is_plentiful_and_decodes_run_every_step() -> None:
    run = simulate(EngineConfig(model=LLAMA_8B, max_model_len=8192), "H100", mixed_requests(100))
    assert run.stats.num_preemptions == 0
    for record, request in zip(run.records, mixed_requests(100), strict=True):
        assert record.success and record.output_len == request.output_len
        assert len(record.itl) == request.output_len - 1
        assert record.ttft > 0 and record.latency >= record.ttft
        assert abs(record.latency - record.ttft - sum(record.itl)) < 1e-9


def test_preempted_requests_still_produce_exact_records() -> None:
    engine_flags = {"model": LLAMA_8B, "max_model_len": 4096, "gpu_memory_utilization": 0.8}
    run = simulate(EngineConfig(**engine_flags), "L4", mixed_requests(300))
    assert run.stats.num_preemptions > 0
    assert [r.output_len for r in run.records] == [r.output_len for r in mixed_requests(300)]
    assert all(len(r.itl) == r.output_len - 1 for r in run.records)


def test_a_run_never_short_of_blocks_runs_the_same_on_any_pool_its_blocks_fit() -> None:
    """The guide shares a run between configs that differ only in their KV pool when no request waited
    for blocks and none was preempted (tune/guide_estimate.py): on the smallest pool that holds the most
    blocks it used, it runs step for step the same; with 0.1 % less of the GPU's memory, it does not."""
    requests = mixed_requests(200)
    roomy = simulate(EngineConfig(model=LLAMA_8B, max_model_len=8192), "H100", requests)
    assert not roomy.waited_for_blocks and roomy.stats.num_preemptions == 0
    held = roomy.memory.num_gpu_blocks - roomy.min_free_blocks

    def config(utilization: float) -> EngineConfig:
        return EngineConfig(model=LLAMA_8B, max_model_len=8192, gpu_memory_utilization=utilization)

    shares = [u / 1000 for u in range(400, 900)]
    fitting = next(u for u in shares if SimEngine(config(u), "H100").memory.num_gpu_blocks >= held)
    same = simulate(config(fitting), "H100", requests)
    assert same.memory.num_gpu_blocks - same.min_free_blocks == held  # the same blocks at its fullest
    assert not same.waited_for_blocks and same.stats.num_preemptions == 0
    assert [(r.ttft, list(r.itl)) for r in same.records] == [(r.ttft, list(r.itl)) for r in roomy.records]
    short = simulate(config(fitting - 0.001), "H100", requests)
    assert short.waited_for_blocks or short.stats.num_preemptions > 0
    assert [(r.ttft, list(r.itl)) for r in short.records] != [(r.ttft, list(r.itl)) for r in roomy.records]


def test_chunked_prefill_off_runs_whole_prompts() -> None:
    engine = tight_engine(enable_chunked_prefill=False, gpu_memory_utilization=0.9)
    assert engine.config.max_num_batched_tokens == 4096  # defaults to max_model_len
    for r in mixed_requests(50):
        engine.add_request(r)
    done = []
    while engine.has_unfinished():
        done += engine.step().finished
    assert len(done) == 50


def test_prefix_caching_hits_shared_prefixes_and_cuts_ttft() -> None:
    requests = mixed_requests(200, prefix=True)
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192)
    cached = simulate(config, "H100", requests)
    uncached = simulate(config.replace(enable_prefix_caching=False), "H100", requests)
    assert cached.stats.prefix_cache_hits >= (200 - 4) * 512 * 0.9  # all but the first of each prefix
    assert cached.stats.prefix_cache_queries >= sum(r.prompt_len for r in requests)
    assert uncached.stats.prefix_cache_hits == 0
    ttft = compute_metrics(cached.records, cached.duration).latency_ms["ttft"]["mean"]
    ttft_off = compute_metrics(uncached.records, uncached.duration).latency_ms["ttft"]["mean"]
    assert ttft < ttft_off


def test_max_concurrency_caps_requests_in_flight_and_send_time_is_the_slot_time() -> None:
    requests = mixed_requests(60)
    run = simulate(EngineConfig(model=LLAMA_8B, max_model_len=8192), "H100", requests, max_concurrency=8)
    events = sorted(
        # rounded: an end recomputed as start + latency may exceed the successor's send by one ulp
        [(round(r.start_time, 9), 1) for r in run.records]
        + [(round(r.start_time + r.latency, 9), -1) for r in run.records]
    )
    in_flight = peak = 0
    for _, delta in events:
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak <= 8
    assert sum(r.start_time > 0 for r in run.records) == 52  # all but the first 8 waited for a slot


def test_arrivals_are_respected_and_too_long_requests_fail() -> None:
    requests = [Request(0, 100, 10, arrival_time=0.0), Request(1, 100, 10, arrival_time=5.0),
                Request(2, 8000, 500, arrival_time=6.0)]  # fmt: skip
    run = simulate(EngineConfig(model=LLAMA_8B, max_model_len=8192), "H100", requests)
    assert run.records[1].start_time == 5.0 and run.duration > 5.0
    assert not run.records[2].success and "maximum context length is 8192 tokens" in run.records[2].error
    assert run.records[0].success and run.records[1].success


def _decode_durations(engine: SimEngine, request: Request) -> list[float]:
    engine.add_request(request)
    durations = []
    while engine.has_unfinished():
        durations.append(round(engine.step().duration, 12))  # idle wait: float rounding
    return durations


def test_abort_frees_every_state_and_the_rest_finish_exactly() -> None:
    engine = tight_engine(max_num_batched_tokens=512)  # small chunks: long prompts prefill over steps
    requests = mixed_requests(300)
    for r in requests:
        engine.add_request(r)
    emitted: Counter[int] = Counter()
    finished: set[int] = set()
    aborted: set[int] = set()
    kinds: Counter[str] = Counter()
    step = 0
    while engine.has_unfinished():
        out = engine.step()
        step += 1
        assert not {rid for rid, _ in out.new_tokens} & aborted  # an aborted request emits nothing more
        emitted.update({rid: n for rid, n in out.new_tokens})
        finished.update(out.finished)
        if step % 20:
            continue
        # In turn: a request anywhere (often waiting), the oldest not yet emitting (often mid-prefill),
        # the newest emitting one (decoding, or preempted).
        live = [r.request_id for r in requests if r.request_id not in finished | aborted]
        choices = ((step * 7) % len(requests), min((i for i in live if not emitted[i]), default=0),
                   max((i for i in live if emitted[i]), default=0))  # fmt: skip
        rid = choices[(step // 20) % 3]
        running, waiting = engine.stats.num_running, engine.stats.num_waiting
        if engine.abort_request(rid):
            aborted.add(rid)
            # The gauges move at once: an idle engine would run no step to refresh them.
            if engine.stats.num_running == running - 1:
                kinds["mid-prefill" if emitted[rid] == 0 else "decoding"] += 1
            else:
                assert engine.stats.num_waiting == waiting - 1
                kinds["waiting"] += 1
        else:
            assert rid in finished or rid in aborted
        assert 0 <= engine.num_free_blocks <= engine.memory.num_gpu_blocks
    assert set(kinds) == {"mid-prefill", "decoding", "waiting"}, kinds  # every state was aborted
    assert engine.stats.num_aborted == len(aborted)
    assert finished == {r.request_id for r in requests} - aborted  # none lost, none duplicated
    assert all(emitted[r.request_id] == r.output_len for r in requests if r.request_id not in aborted)
    assert engine.num_free_blocks == engine.memory.num_gpu_blocks  # every block released
    # No decode context leaked: a new request runs exactly as on a fresh engine.
    probe = Request(request_id=10_000, prompt_len=300, output_len=40)
    fresh = tight_engine(max_num_batched_tokens=512)
    used, new = _decode_durations(engine, probe), _decode_durations(fresh, probe)
    assert used[1:] == new[1:]
    # The first step (its idle wait included) may start later by the output work the API server still
    # had from the last step when the probe arrived (one process takes requests in and streams): well
    # under a millisecond.
    assert 0 <= used[0] - new[0] <= 1e-3


def test_abort_keeps_the_prefix_cache_and_drops_kv_usage() -> None:
    engine = SimEngine(EngineConfig(model=LLAMA_8B, max_model_len=8192), "H100")
    first = Request(request_id=0, prompt_len=1024 + 50, output_len=2000, prefix_id=7, prefix_len=1024)
    engine.add_request(first)
    for _ in range(20):
        engine.step()
    used = engine.stats.kv_cache_usage
    assert engine.stats.num_running == 1 and used > 0
    assert engine.abort_request(0)
    assert not engine.has_unfinished()
    assert engine.stats.num_running == 0 and engine.stats.kv_cache_usage == 0.0 < used
    assert not engine.abort_request(0) and not engine.abort_request(12345)  # gone or unknown: no-op
    assert engine.stats.num_aborted == 1
    hits = engine.stats.prefix_cache_hits
    engine.add_request(Request(request_id=1, prompt_len=1104, output_len=5, prefix_id=7, prefix_len=1024))
    engine.step()
    assert engine.stats.prefix_cache_hits - hits == 1024  # the aborted request's prefix stayed cached
