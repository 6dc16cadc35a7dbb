"""The simulator's run-to-run noise: off by default, seeded, independent across configs."""

from __future__ import annotations

import pytest

from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.sim.noise import NoiseModel
from autotune.workloads.spec import LengthDist, WorkloadSpec

CONFIG = EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", max_num_seqs=64)
WORKLOAD = WorkloadSpec(
    name="noise", num_requests=200, prompt_len=LengthDist("fixed", 256), output_len=LengthDist("fixed", 64)
)


def throughput(backend: SimBackend, seed: int, config: EngineConfig = CONFIG) -> float:
    return backend.evaluate(config, WORKLOAD, seed=seed).benchmark.output_throughput


def test_without_noise_every_run_is_the_same() -> None:
    backend = SimBackend("H100")
    assert not backend.noisy
    assert throughput(backend, 0) == throughput(backend, 0)


def test_noise_is_seeded_and_of_the_size_asked_for() -> None:
    backend = SimBackend("H100", NoiseModel(0.02))
    assert backend.noisy
    assert throughput(backend, 3) == throughput(backend, 3)  # reproducible
    quiet = throughput(SimBackend("H100"), 0)
    ratios = [throughput(backend, seed) / quiet for seed in range(12)]
    assert len(set(ratios)) == 12  # every seed its own run
    spread = max(ratios) - min(ratios)
    assert 0.01 < spread < 0.2  # a few percent, as real runs differ


def test_two_configs_do_not_share_their_noise() -> None:
    """Configs run at different times on a real GPU: the same seed must not give them the same luck."""
    noisy, quiet = SimBackend("H100", NoiseModel(0.05)), SimBackend("H100")
    other = CONFIG.replace(max_num_seqs=128)
    luck = [throughput(noisy, 0, c) / throughput(quiet, 0, c) for c in (CONFIG, other)]
    assert luck[0] != pytest.approx(luck[1], rel=1e-3)


def test_noise_outside_its_range_is_refused() -> None:
    with pytest.raises(ValueError, match="noise must be in"):
        NoiseModel(1.5)
