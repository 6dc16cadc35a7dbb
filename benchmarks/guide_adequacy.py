"""Can one trial tell whether the guide's model is adequate? Its saturation bursts replayed, by reality.

A guided run trusts the guide's own predictions once its model replays every measured trial's saturation
bursts (tune/guide_check.py): the same requests (workload spec and seed) on the simulated engine, their
mean TTFT, median ITL, mean TPOT and throughput compared as log(measured / replayed), split into one
uniform speed offset per trial and the RMS of what it leaves (the shape). This benchmark asks whether
that separates a reality the model represents from one it does not.

For each reality (benchmarks/guided_search_realities.py), config and seed: the trial (the capacity
search, on the reality with 2 % noise), one speed factor fitted to its capacity (the refit's factor,
tune/guide_refit.py, bisected here per trial), then the trial's bursts replayed at that factor. Prints
each trial's offset, shape and verdict (adequate: shape <= SHAPE; the run also wants the trials'
offsets within OFFSET of their mean).

    python benchmarks/guide_adequacy.py [--case default-run] [--realities ...] [--seeds 3] [--processes 2]
"""

from __future__ import annotations

import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import Parser, add_names, whole  # noqa: E402
from guide_accuracy import Case, cases  # noqa: E402
from guided_search_realities import REALITIES, Reality  # noqa: E402

from autotune.backends.sim import SimBackend  # noqa: E402
from autotune.catalog.gpus import get_gpu  # noqa: E402
from autotune.catalog.models import get_model  # noqa: E402
from autotune.core.config import EngineConfig  # noqa: E402
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration  # noqa: E402
from autotune.sim.noise import NoiseModel  # noqa: E402
from autotune.trial.capacity import find_capacity  # noqa: E402
from autotune.tune.guide_check import OFFSET, SHAPE, Misfit, misfit, replay_bursts  # noqa: E402
from autotune.tune.guide_refit import scaled_calibration  # noqa: E402

# A high-batch config and a low-batch one: a missing mechanism that grows with the batch shows in one.
CONFIGS = (
    {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
)
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


def check(job: tuple[str, Reality, dict[str, Any], int]) -> tuple[float, float, Misfit | None]:
    """(measured capacity, fitted factor, the trial's bursts against the fitted guide's replay)."""
    case_name, reality, params, seed = job
    case = cases()[case_name]
    config = _config(case, params)
    backend = SimBackend(case.space().gpu, NoiseModel(NOISE), reality.calibration())
    result = find_capacity(backend, config, case.workload(), case.scenario.slo_list(), seed=seed)
    capacity = result.capacity.rate if result.capacity is not None else 0.0
    bursts = result.capacity.bursts if result.capacity is not None else ()
    factor = _fitted_factor(case, config, capacity)
    guide = scaled_calibration(DEFAULT_CALIBRATION, factor)
    replayed = replay_bursts(case.space().gpu, config, case.workload(), bursts, guide)
    return capacity, factor, misfit(bursts, replayed)


def main() -> None:
    parser = Parser(__doc__)
    about = "a case of benchmarks/guide_accuracy.py (default: %(default)s)"
    add_names(parser, "--case", cases(), about, nargs=None, default="default-run")
    add_names(parser, "--realities", [r.name for r in REALITIES], "default: all")
    parser.add_argument("--seeds", type=whole(1), default=3)
    parser.add_argument("--processes", type=whole(1), default=2)
    args = parser.parse_args()
    chosen = [r for r in REALITIES if not args.realities or r.name in args.realities]
    jobs = [(args.case, r, p, s) for r in chosen for p in CONFIGS for s in range(args.seeds)]
    print(f"case {args.case}; adequate: shape <= {SHAPE:.0%} (and offsets within {OFFSET:.0%} of their mean)")
    with ProcessPoolExecutor(args.processes) as pool:
        for (_, reality, params, seed), (capacity, factor, found) in zip(
            jobs, pool.map(check, jobs), strict=True
        ):
            label = f"seqs {params['max_num_seqs']} budget {params['max_num_batched_tokens']} seed {seed}"
            verdict = "no bursts" if found is None else "adequate" if found.shape <= SHAPE else "not adequate"
            figures = f"offset {found.offset:+6.1%}  shape {found.shape:5.1%}" if found else ""
            print(
                f"{reality.name:30} {label:29} capacity {capacity:6.2f} req/s  factor {factor:5.3f}  "
                f"{figures}  {verdict}"
            )


if __name__ == "__main__":
    main()
