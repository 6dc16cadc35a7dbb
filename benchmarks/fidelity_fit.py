"""Refit the simulator's constants on the train split of fidelity_points.yaml (fitted sources only).

Minimises the soft-L1 loss of log(simulated / measured), each capped at 1, over every throughput and
latency metric of the train points whose source is not marked `fitted: false`, with scipy's
least_squares on the logs of the constants (bounded to [x/100, 100 x]). Prints the fitted values and
the medians before and after; it changes no file: copy the values into autotune/sim/costs.py and
frontend.py. Constants the kernel timings fix (efficiencies, the Hopper scale) are not fitted.
Needs scipy (`pip install scipy`). Several minutes on one core.

    python benchmarks/fidelity_fit.py [--max-nfev 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import fidelity
import numpy as np

import autotune.sim.costs as costs
import autotune.sim.engine as engine
from autotune.sim.frontend import FrontendModel

COST_CONSTANTS = ("PER_LAYER_S", "STEP_BASE_S", "PER_SEQ_S", "EAGER_PER_LAYER_S")
FRONTEND_FIELDS = (
    "fixed_s", "chat_extra_s", "per_request_s", "chat_intake_extra_s", "per_token_s", "per_chunk_s",
)  # fmt: skip
FRONTEND_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(FrontendModel) if f.name in FRONTEND_FIELDS
}


def _set(values: dict[str, float]) -> None:
    for name in COST_CONSTANTS:
        setattr(costs, name, values[name])
    frontend = {k: values[k] for k in FRONTEND_FIELDS}
    engine.FrontendModel = lambda: FrontendModel(**frontend)  # type: ignore[assignment,misc]


def _residuals(points: list[dict], values: dict[str, float]) -> np.ndarray:
    _set(values)
    out = []
    for e in fidelity.evaluate(points):
        if e.metric == "starts":
            continue
        ok = e.simulated > 0 and e.measured > 0
        out.append(max(-1.0, min(1.0, math.log(e.simulated / e.measured))) if ok else 1.0)
    return np.asarray(out)


def main() -> int:
    """Fit and print the constants."""
    try:
        from scipy.optimize import least_squares
    except ImportError:
        print("fidelity_fit needs scipy: pip install scipy", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-nfev", type=int, default=20)
    args = parser.parse_args()
    skip = fidelity.unfitted_points()
    points = [p for p in fidelity.load_points() if p["split"] == "train" and p["id"] not in skip]
    start = {name: getattr(costs, name) for name in COST_CONSTANTS} | FRONTEND_DEFAULTS
    names = list(start)
    x0 = np.log([start[n] for n in names])

    def f(x: np.ndarray) -> np.ndarray:
        return _residuals(points, dict(zip(names, np.exp(x), strict=True)))

    before = f(x0)
    fit = least_squares(
        f, x0, bounds=(x0 - math.log(100), x0 + math.log(100)), loss="soft_l1", f_scale=0.1,
        diff_step=0.05, max_nfev=args.max_nfev,
    )  # fmt: skip
    after = f(fit.x)
    for name, value in zip(names, np.exp(fit.x), strict=True):
        print(f"{name:22} {start[name]:.4g} -> {value:.4g}")
    print(f"median |log error| {np.median(np.abs(before)):.3f} -> {np.median(np.abs(after)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
