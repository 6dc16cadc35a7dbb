"""The guide's top refined by the full capacity search (autotune/tune/guide_refine.py), on the real
simulated engine, a small space."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from autotune.backends.sim import SimBackend
from autotune.measure.slo import parse_slos
from autotune.trial.capacity import find_capacity
from autotune.tune.guide import predict_space
from autotune.tune.guide_refine import refine_table
from autotune.tune.objectives import Objective
from autotune.tune.space import space_from_dict
from autotune.workloads.files import load_workload

SLOS = parse_slos(["ttft_p99=2s"])
OBJECTIVE = Objective("output_throughput", "maximize")
SPACE = space_from_dict(
    {
        "fixed": {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "gpu": "H100",
            "max_model_len": 8192,
            "enable_chunked_prefill": True,
            "gpu_memory_utilization": 0.9,
        },
        "params": {
            "max_num_seqs": {"type": "categorical", "choices": [16, 64, 256, 4096]},
            "max_num_batched_tokens": {"type": "categorical", "choices": [2048, 8192]},
        },
    }
)


def test_the_top_carries_the_full_search_and_the_rest_moves_by_the_median_ratio(tmp_path: Path) -> None:
    chat = load_workload("chat")
    fast = predict_space(SPACE, chat, SLOS, runs_dir=tmp_path, processes=1)
    refined = refine_table(fast, SPACE, chat, SLOS, OBJECTIVE, top=2, processes=2)
    assert refined.cache_path is not None and refined.cache_path.is_file() and not refined.from_cache
    top = fast.ranking(OBJECTIVE)[:2]
    ratios = []
    for p in top:  # what a trial's capacity search on the simulated engine finds, seed 0, noise off
        result = find_capacity(SimBackend("H100"), SPACE.config(p.params), chat, SLOS, seed=0)
        assert result.capacity is not None and result.benchmark is not None
        mine = refined.lookup(p.key)
        assert mine is not None and mine.capacity_rate == pytest.approx(result.capacity.rate, abs=1e-4)
        assert mine.output_throughput == pytest.approx(result.benchmark.output_throughput, abs=1e-3)
        ratios.append(math.log(mine.output_throughput / p.output_throughput))
        assert refined.scale_of(p.key) == pytest.approx(math.exp(ratios[-1]), rel=1e-3)  # its own
    ratio = math.exp(statistics.median(ratios))
    assert refined.estimate_scale == pytest.approx(ratio, rel=1e-3)
    rest = [p for p in fast.ranking(OBJECTIVE)[2:]]
    assert rest  # the small space has more configs that meet the SLO than the refined top
    for p in rest:
        moved = refined.lookup(p.key)
        assert moved is not None
        assert moved.output_throughput == pytest.approx(p.output_throughput * ratio, rel=1e-3)
        assert moved.capacity_rate == pytest.approx(p.capacity_rate * ratio, rel=1e-3)
        assert moved.p99_ttft_ms == p.p99_ttft_ms  # a latency is not a throughput: it stays
        assert refined.scale_of(p.key) == refined.estimate_scale
    failed = [p for p in fast.predictions if not p.starts]
    assert failed and all(refined.lookup(p.key) == p for p in failed)

    again = refine_table(fast, SPACE, chat, SLOS, OBJECTIVE, top=2, processes=1)
    assert again.from_cache and again.predictions == refined.predictions
    assert again.searched_scales == refined.searched_scales
    assert refine_table(fast, SPACE, chat, SLOS, OBJECTIVE, top=0) is fast
