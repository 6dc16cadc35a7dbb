"""Before a run on a real backend: its estimated GPU-hours and time (autotune/outputs/estimate.py), from
the baseline and a sample of the space run as trials on the simulated engine."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def print_estimate(args: argparse.Namespace, s: Any, gpus: int, calibration: Any) -> Any:
    """Print the estimate of the run set up in `s` (run._Setup) on `gpus` GPUs, simulated with
    `calibration`, and return it; a line saying why not (and None) when it cannot be made. It never
    stops the run."""
    from autotune.outputs.estimate import SAMPLE, estimate_run, remeasure_trials
    from autotune.tune.screen import make_screen

    print(
        f"autotune: estimating the run's GPU time: the baseline and {SAMPLE} configs of the space as trials "
        "on the simulated engine ...",
        file=sys.stderr,
        flush=True,
    )
    screen = None if args.no_screen else make_screen(s.space.model, s.space.gpu, calibration=calibration)
    repeats = remeasure_trials(args.repeats, s.backend.noisy, args.n_trials)
    try:
        estimate = estimate_run(
            s.space, s.workload, s.slos, args.n_trials, gpus, repeats, args.seed, screen,
            s.max_position_embeddings, calibration=calibration,
        )  # fmt: skip
    except Exception:  # noqa: BLE001  (an estimate must never stop the run)
        estimate = None
    if estimate is None:
        print("autotune: no estimate (the model or GPU is not in the simulator's catalogs)", file=sys.stderr)
    else:
        print(f"autotune: {estimate.text()}", file=sys.stderr)
    return estimate
