"""Simulator fidelity: replay published vLLM measurements on the simulator and print the errors.

Reads benchmarks/fidelity_points.yaml (sources, setups, measured values, train/validation split) and
prints, per point and metric, the simulated value, the measured value and the signed error
(simulated / measured - 1), then the median |error| per split and metric class (throughput, latency,
memory), then the ranking checks: the gain between two points that differ in the flags a tuner searches
(TP, token budget, max_num_seqs), simulated against measured. tests/test_fidelity.py bounds the
validation medians and the ranking checks. The points format and its replay are
autotune.calibrate.points (`autotune calibrate --points` fits a calibration to such a file; it leaves
out the sources marked `fitted: false`).

    python benchmarks/fidelity.py [--points benchmarks/fidelity_points.yaml] [--split validation]
                                  [--sim-calibration FILE]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from arguments import Parser, user_errors

from autotune.calibrate.points import CLASSES, Error, evaluate, load_points, medians
from autotune.calibrate.rankings import (
    RANKING_BOUND,
    Ranking,
    load_rankings,
    rankings,
    unfitted_points,
)
from autotune.sim.calibration import add_calibration_argument, calibration_option

POINTS = Path(__file__).with_name("fidelity_points.yaml")
__all__ = [
    "CLASSES",
    "POINTS",
    "Error",
    "evaluate",
    "load_points",
    "load_rankings",
    "main",
    "medians",
    "rankings",
    "unfitted_points",
]


def main(argv: list[str] | None = None) -> int:
    """Print the per-point table and the medians."""
    parser = Parser(__doc__)
    parser.add_argument("--points", type=Path, default=POINTS)
    parser.add_argument("--split", choices=("train", "validation"), default=None)
    add_calibration_argument(parser)
    args = parser.parse_args(argv)
    with user_errors(parser):  # a missing or malformed file: one line, as `autotune calibrate` says it
        checks, every, calibration = (
            load_rankings(args.points),
            load_points(args.points),
            calibration_option(args.sim_calibration),
        )
    needed = {c[k] for c in checks for k in ("numerator", "denominator")}
    points = [p for p in every if args.split in (None, p.get("split", "train")) or p["id"] in needed]
    errors = evaluate(points, calibration)
    ranks = [r for r in rankings(checks, errors) if args.split in (None, r.split)]
    errors = [e for e in errors if args.split in (None, e.split)]
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
    unfitted = unfitted_points(args.points)
    fitted = [e for e in errors if e.split == "train" and e.point not in unfitted]
    for (_, cls), value in sorted(medians(fitted).items()):
        print(f"  {'train fit':10} {cls:10} {value:6.1%}  (train points of fitted sources only)")
    print_rankings(ranks)
    return 0


def print_rankings(ranks: list[Ranking]) -> None:
    """The ranking checks: simulated and measured gain, the ratio's error, pass/fail."""
    if not ranks:
        return
    print(f"\n{'ranking check':34} {'split':10} {'simulated':>9} {'measured':>9} {'error':>8}  flags")
    for r in ranks:
        mark = "ok" if r.passes else ("SIGN" if not r.sign_agrees else "FAIL")
        gains = f"{r.simulated:9.3f} {r.measured:9.3f} {r.error:+8.1%}"
        print(f"{r.check:34} {r.split:10} {gains}  {mark:4} {r.flags}")
    for split in ("train", "validation"):
        group = [r for r in ranks if r.split == split]
        if group:
            med = statistics.median(abs(r.error) for r in group)
            verdict = (
                f"({sum(r.passes for r in group)}/{len(group)} pass: sign and within {RANKING_BOUND:.0%})"
            )
            print(f"  {split:10} ranking  median |error| {med:6.1%}  {verdict}")


if __name__ == "__main__":
    sys.exit(main())
