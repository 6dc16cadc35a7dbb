"""Simulator fidelity: replay published vLLM measurements on the simulator and print the errors.

Reads benchmarks/fidelity_points.yaml (sources, setups, measured values, train/validation split) and
prints, per point and metric, the simulated value, the measured value and the signed error
(simulated / measured - 1), then the median |error| per split and metric class (throughput, latency,
memory). tests/test_fidelity.py bounds the validation medians. The points format and its replay are
autotune.calibrate.points (`autotune calibrate --points` fits a calibration to such a file).

    python benchmarks/fidelity.py [--points benchmarks/fidelity_points.yaml] [--split validation]
                                  [--sim-calibration FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.calibrate.points import CLASSES, Error, evaluate, load_points, medians
from autotune.sim.calibration import add_calibration_argument, calibration_option

POINTS = Path(__file__).with_name("fidelity_points.yaml")
__all__ = ["CLASSES", "POINTS", "Error", "evaluate", "load_points", "main", "medians"]


def main(argv: list[str] | None = None) -> int:
    """Print the per-point table and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=Path, default=POINTS)
    parser.add_argument("--split", choices=("train", "validation"), default=None)
    add_calibration_argument(parser)
    args = parser.parse_args(argv)
    points = [p for p in load_points(args.points) if args.split in (None, p.get("split", "train"))]
    errors = evaluate(points, calibration_option(args.sim_calibration))
    print(f"{'point':34} {'split':10} {'metric':20} {'simulated':>11} {'measured':>11} {'error':>8}")
    for e in errors:
        print(
            f"{e.point:34} {e.split:10} {e.metric:20} {e.simulated:11.2f} {e.measured:11.2f} {e.signed:+8.1%}"
        )
    print("\nmedian |error| (points within bound)")
    for (split, cls), value in sorted(medians(errors).items()):
        group = [e for e in errors if e.split == split and e.metric_class == cls]
        bound = 0.10 if cls == "throughput" else 0.20
        within = sum(abs(e.signed) <= bound for e in group)
        print(f"  {split:10} {cls:10} {value:6.1%}  ({within}/{len(group)} within {bound:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
