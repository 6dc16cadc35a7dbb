"""SimBackend: the simulated engine behind the Backend protocol."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.slo import parse_slos
from autotune.workloads.spec import Request

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class TinyWorkload:
    """What a backend uses of a WorkloadSpec (autotune.backends.base.Workload)."""

    n: int = 40
    max_concurrency: int | None = None
    measure_from: float = 0.0

    def requests(self, seed: int = 0) -> list[Request]:
        return [Request(i, 200 + 37 * ((i + seed) % 11), 30 + 7 * (i % 5)) for i in range(self.n)]


def test_evaluate_returns_vllm_bench_metrics_and_server_figures() -> None:
    backend = pickle.loads(pickle.dumps(SimBackend("H100")))
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192)
    # The 40 requests sent at once reach the engine as one intake wave (~150 ms), so first tokens come
    # at ~350-520 ms: a 400 ms bound keeps some and drops others.
    result = backend.evaluate(config, TinyWorkload(), parse_slos("ttft_p99=400ms,itl_p99=20ms"))
    assert result.ok and result.failure is None
    bench = result.benchmark
    assert bench is not None and bench.completed == 40 and bench.failed == 0
    assert 0 < bench.request_goodput < bench.request_throughput  # the ttft bound drops some requests
    assert bench.server["num_gpu_blocks"] == result.server.engine.num_gpu_blocks > 0
    assert {"num_preemptions", "peak_kv_cache_usage"} <= set(bench.server)
    assert result.server.resolved["max_num_seqs"] == 1024
    assert result.benchmark_s + result.saved_s == bench.duration and result.startup_s > 20
    assert "GPU KV cache size:" in result.log_tail


def test_gpu_time_stops_where_early_abort_would_stop_the_real_run() -> None:
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192)
    met = SimBackend("H100").evaluate(config, TinyWorkload(), parse_slos("ttft_p99=60s"))
    assert met.saved_s == 0 and met.benchmark_s == met.benchmark.duration
    lost = SimBackend("H100").evaluate(config, TinyWorkload(), parse_slos("ttft_p99=1ms"))
    assert lost.failure is None and lost.benchmark.completed == 40  # the sim keeps the whole run's metrics
    assert 0 < lost.benchmark_s < lost.benchmark.duration  # but charges the GPU time until the abort
    assert lost.benchmark_s + lost.saved_s == lost.benchmark.duration


def test_more_cuda_graphs_cost_more_startup_time() -> None:
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192)
    few = SimBackend("H100").evaluate(config.replace(max_num_seqs=4), TinyWorkload(4))
    many = SimBackend("H100").evaluate(config.replace(max_num_seqs=512), TinyWorkload(4))
    assert few.startup_s < many.startup_s


def test_concurrency_cap_comes_from_the_workload() -> None:
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192)
    free = SimBackend("H100").evaluate(config, TinyWorkload())
    capped = SimBackend("H100").evaluate(config, TinyWorkload(max_concurrency=2))
    assert capped.benchmark_s > free.benchmark_s


def test_startup_failures_become_trial_results_with_vllm_messages() -> None:
    backend = SimBackend("H100")
    bad = EngineConfig(model=LLAMA_8B, max_num_batched_tokens=64, max_num_seqs=128)
    result = backend.evaluate(bad, TinyWorkload())
    assert not result.ok and result.failure == FailureKind.INVALID_CONFIG
    assert (
        result.message == "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)."
    )
    assert result.log_tail.endswith("ValueError: " + result.message)
    oom = backend.evaluate(EngineConfig(model=LLAMA_8B, gpu_memory_utilization=0.985), TinyWorkload())
    assert oom.failure == FailureKind.STARTUP_OOM and oom.log_tail.endswith(oom.message)
    assert result.startup_s < oom.startup_s  # validation fails before weights are loaded
    assert result.benchmark_s == 0.0


def test_session_pays_the_startup_once_and_measures_like_evaluate() -> None:
    backend = SimBackend("H100")
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192)
    with backend.session(config) as session:
        first, second = session.measure(TinyWorkload(), seed=1), session.measure(TinyWorkload(), seed=1)
    alone = backend.evaluate(config, TinyWorkload(), seed=1)
    assert first == alone  # evaluate is one session with one measurement
    assert second.startup_s == 0 and second.benchmark == first.benchmark  # an idle server again
    bad = EngineConfig(model=LLAMA_8B, max_num_batched_tokens=64, max_num_seqs=128)
    with backend.session(bad) as session:
        assert not session.alive
        failed = [session.measure(TinyWorkload()) for _ in range(2)]
    assert [r.failure for r in failed] == [FailureKind.INVALID_CONFIG] * 2
    assert failed[0].startup_s > 0 and failed[1].startup_s == 0
