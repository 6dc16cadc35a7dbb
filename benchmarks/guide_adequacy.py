"""Can one trial tell whether the guide's model is adequate? Per-load residuals of the guide, by reality.

A guided run stops when no untried config's 95 % bound beats the best measured (tune/guided.py). With
reality equal to the guide's calibration that takes 4-10 trials: two trial-level residuals cannot show
that the model's local error is small. A trial measures more than its capacity: latencies at several
loads. This benchmark asks whether those separate a reality the model represents from one it does not.

For each reality (benchmarks/guided_search_realities.py) and config: the trial (the capacity search, on
the reality with 2 % noise), then one speed factor fitted to its capacity (the refit's factor,
tune/guide_refit.py, bisected here per config), then the same 1,000 requests at 50, 80 and 95 % of the
measured capacity on the reality and on the fitted guide (noise off): log(reality / guide) of p99 and
mean TTFT, median and p99 ITL. Prints each config's RMS and max over those 12 residuals.

    python benchmarks/guide_adequacy.py [--case default-run] [--realities ...] [--processes 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from guide_accuracy import Case, cases  # noqa: E402
from guided_search_realities import REALITIES, Reality  # noqa: E402

from autotune.backends.sim import SimBackend  # noqa: E402
from autotune.catalog.gpus import get_gpu  # noqa: E402
from autotune.catalog.models import get_model  # noqa: E402
from autotune.core.config import EngineConfig  # noqa: E402
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration  # noqa: E402
from autotune.sim.noise import NoiseModel  # noqa: E402
from autotune.trial.capacity import find_capacity  # noqa: E402
from autotune.tune.guide_refit import scaled_calibration  # noqa: E402

# A high-batch config and a low-batch one: a missing mechanism that grows with the batch shows in one.
CONFIGS = (
    {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
)
LOADS = (0.5, 0.8, 0.95)  # fractions of the measured capacity
METRICS = ("p99_ttft_ms", "mean_ttft_ms", "median_itl_ms", "p99_itl_ms")
NOISE = 0.02  # the trial's, as in guided_search.py
FIT_STEPS = 7  # bisections of the factor on the log scale between 0.3x and 3x (~2 %)


def _config(case: Case, params: dict[str, Any]) -> EngineConfig:
    space = case.space()
    defaults = space.baseline_params(
        get_gpu(space.gpu).memory_gib, get_model(space.model).max_position_embeddings
    )
    return space.config({**defaults, **params})


def _capacity(case: Case, config: EngineConfig, calibration: Calibration, noise: float) -> float:
    backend = SimBackend(case.space().gpu, NoiseModel(noise), calibration)
    result = find_capacity(backend, config, case.workload(), case.scenario.slo_list(), seed=0)
    return result.capacity.rate if result.capacity is not None else 0.0


def _fitted_factor(case: Case, config: EngineConfig, measured: float) -> float:
    """The speed factor whose noise-free capacity search meets `measured` (bisected)."""
    lo, hi = 0.3, 3.0
    for _ in range(FIT_STEPS):
        mid = math.sqrt(lo * hi)
        if _capacity(case, config, scaled_calibration(DEFAULT_CALIBRATION, mid), 0.0) < measured:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def _metrics(case: Case, config: EngineConfig, calibration: Calibration, noise: float, rate: float) -> dict:
    spec = dataclasses.replace(case.workload(), request_rate=rate, num_requests=1000, load="fixed")
    with SimBackend(case.space().gpu, NoiseModel(noise), calibration).session(config) as session:
        result = session.measure(spec, case.scenario.slo_list(), seed=1)
    assert result.benchmark is not None, result.message
    return result.benchmark.to_dict()


def residuals(job: tuple[str, Reality, dict[str, Any]]) -> tuple[float, float, list[tuple[float, dict]]]:
    """(measured capacity, fitted factor, per load {metric: log(reality / fitted guide)})."""
    case_name, reality, params = job
    case = cases()[case_name]
    config = _config(case, params)
    truth = reality.calibration()
    capacity = _capacity(case, config, truth, NOISE)
    factor = _fitted_factor(case, config, capacity)
    guide = scaled_calibration(DEFAULT_CALIBRATION, factor)
    rows = []
    for load in LOADS:
        real = _metrics(case, config, truth, NOISE, load * capacity)
        predicted = _metrics(case, config, guide, 0.0, load * capacity)
        rows.append((load, {m: math.log(real[m] / predicted[m]) for m in METRICS}))
    return capacity, factor, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="default-run", help="a case of benchmarks/guide_accuracy.py")
    parser.add_argument("--realities", nargs="*", help="names (default: all)")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    chosen = [r for r in REALITIES if not args.realities or r.name in args.realities]
    jobs = [(args.case, r, p) for r in chosen for p in CONFIGS]
    shape = f"{len(LOADS)} loads x {len(METRICS)} metrics"
    print(f"case {args.case}; residual = log(reality / guide fitted to the trial), {shape}")
    with ProcessPoolExecutor(args.processes) as pool:
        for (_, reality, params), (capacity, factor, rows) in zip(
            jobs, pool.map(residuals, jobs), strict=True
        ):
            values = [v for _, d in rows for v in d.values()]
            rms = math.sqrt(sum(v * v for v in values) / len(values))
            label = f"seqs {params['max_num_seqs']} budget {params['max_num_batched_tokens']}"
            print(
                f"{reality.name:30} {label:22} capacity {capacity:6.2f} req/s  factor {factor:5.3f}  "
                f"rms {rms:6.1%}  max {max(map(abs, values)):6.1%}"
            )


if __name__ == "__main__":
    main()
