"""Trends the simulator must share with vLLM (docs/vllm.md, "Scheduler" and "Published measurements").

Each can fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from autotune.core.config import EngineConfig
from autotune.core.errors import EngineStartupError
from autotune.measure.metrics import BenchmarkResult, compute_metrics
from autotune.sim.engine import SimEngine
from autotune.sim.replay import SimRun, simulate
from autotune.workloads.spec import Request

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def lognormal_requests(n: int, prompt: float, output: float, seed: int, rate: float | None = None,
                       max_prompt: int = 4000, max_output: int = 1024) -> list[Request]:  # fmt: skip
    """ShareGPT/chat-like lengths (lognormal, sigma 0.8) arriving at `rate` (Poisson) or all at t=0."""
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(np.log(prompt) - 0.32, 0.8, n), 4, max_prompt).astype(int)
    outputs = np.clip(rng.lognormal(np.log(output) - 0.32, 0.8, n), 4, max_output).astype(int)
    arrivals = np.cumsum(rng.exponential(1 / rate, n)) if rate else np.zeros(n)
    return [Request(i, int(prompts[i]), int(outputs[i]), float(arrivals[i])) for i in range(n)]


def bench(config: EngineConfig, gpu: str, requests: list[Request]) -> tuple[BenchmarkResult, SimRun]:
    run = simulate(config, gpu, requests)
    return compute_metrics(run.records, run.duration), run


def test_throughput_saturates_with_max_num_seqs_while_latency_grows() -> None:
    requests = lognormal_requests(1000, 250, 250, seed=1)
    config = EngineConfig(model=LLAMA_8B, max_model_len=4096, max_num_batched_tokens=4096)
    results = [bench(config.replace(max_num_seqs=s), "A100-80GB", requests)[0] for s in (64, 128, 256, 512)]
    throughput = [r.request_throughput for r in results]
    tpot = [r.latency_ms["tpot"]["median"] for r in results]
    assert throughput[0] < throughput[1] < throughput[2] * 1.02
    gains = [b / a for a, b in zip(throughput, throughput[1:], strict=False)]
    assert gains[0] > gains[2]  # diminishing returns: the curve flattens
    assert gains[2] < 1.15
    assert tpot[0] < tpot[1] < tpot[2] < tpot[3]  # every step carries more decodes


def test_smaller_budget_trades_ttft_for_itl_under_prefill_heavy_load() -> None:
    requests = lognormal_requests(300, 3000, 150, seed=2, rate=4.0, max_prompt=7000)
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192, max_num_seqs=256)
    small, _ = bench(config.replace(max_num_batched_tokens=512), "H100", requests)
    large, _ = bench(config.replace(max_num_batched_tokens=8192), "H100", requests)
    assert small.latency_ms["itl"]["p99"] < large.latency_ms["itl"]["p99"]
    assert small.latency_ms["ttft"]["mean"] > large.latency_ms["ttft"]["mean"]


def test_lower_memory_utilization_means_fewer_blocks_and_more_preemptions() -> None:
    requests = lognormal_requests(600, 1000, 400, seed=3)
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192)
    _, low = bench(config.replace(gpu_memory_utilization=0.35), "H100", requests)
    _, high = bench(config.replace(gpu_memory_utilization=0.9), "H100", requests)
    assert low.memory.num_gpu_blocks < high.memory.num_gpu_blocks
    assert low.stats.num_preemptions > high.stats.num_preemptions
    assert low.stats.peak_kv_cache_usage > 0.95


def test_chunked_prefill_off_with_budget_below_max_model_len_fails_to_start() -> None:
    config = EngineConfig(model=LLAMA_8B, enable_chunked_prefill=False, max_num_batched_tokens=2048)
    with pytest.raises(EngineStartupError, match=r"is smaller than max_model_len \(131072\)"):
        SimEngine(config, "H100")


def test_70b_tp2_on_a100_gains_from_the_small_defaults_but_tp4_does_not() -> None:
    """PR #17885: A100 went from the large-GPU defaults (1024 seqs, budget 8192) to the small ones
    (256, 2048): +36% at TP=2, -2% at TP=4. The profile's sampler peak grows with max_num_seqs and steals
    KV memory where it is tight (TP=2 at 0.95), which preempts."""
    requests = lognormal_requests(400, 220, 200, seed=4, max_prompt=1024)
    config = EngineConfig(model=LLAMA_70B, max_model_len=10000, gpu_memory_utilization=0.95)

    def throughput(tp: int, seqs: int, budget: int) -> float:
        cfg = config.replace(tensor_parallel_size=tp, max_num_seqs=seqs, max_num_batched_tokens=budget)
        return bench(cfg, "A100-80GB", requests)[0].output_throughput

    assert throughput(2, 256, 2048) > 1.08 * throughput(2, 1024, 8192)
    assert throughput(4, 256, 2048) == pytest.approx(throughput(4, 1024, 8192), rel=0.05)


def test_low_load_sanity_llama_8b_h100() -> None:
    """vLLM docs: ~8 ms per decode step at batch ~10; a 200-token prompt's TTFT well under 100 ms."""
    config = EngineConfig(model=LLAMA_8B)
    batch, _ = bench(config, "H100", [Request(i, 200, 100) for i in range(10)])
    assert 6.0 <= batch.latency_ms["itl"]["median"] <= 10.0
    single, _ = bench(config, "H100", [Request(0, 200, 20)])
    assert single.latency_ms["ttft"]["mean"] < 100.0
