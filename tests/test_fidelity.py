"""The simulator's regression test against real vLLM measurements (benchmarks/fidelity_points.yaml).

The bounds are the validation-split medians measured when the model was last calibrated, with a
little headroom: a model change must not make them worse.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from autotune.calibrate.points import evaluate, load_points, medians
from autotune.calibrate.rankings import load_rankings, rankings

POINTS = Path(__file__).resolve().parents[1] / "benchmarks" / "fidelity_points.yaml"

# (split, metric class) -> median |error| bound. Measured at calibration on 88 validation metrics:
# throughput 6.6% (19: GPUStack's Qwen3-14B A100 runs within 2-18%, PR 17885's 70B within 8%, the
# Qwen3-32B runs of GPUStack's H100 +50-58% and issue 17788's +57-63%, both on Hopper machines running
# a 32B below its datasheet), latency 13.1% (66), memory 0.0% (3).
BOUNDS = {
    ("validation", "throughput"): 0.07,
    ("validation", "latency"): 0.14,
    ("validation", "memory"): 0.02,
}
# Ranking checks (gain of one config over another on the same model and GPU): at calibration 5 of 7
# pass (sign and within 10%), median |error| 4.8%; PR 17885's TP=2 budget gain is 1.18x for 1.36x.
RANKINGS_PASSING = 5
RANKING_MEDIAN = 0.06


def test_validation_medians_do_not_get_worse() -> None:
    errors = evaluate(p for p in load_points(POINTS) if p["split"] == "validation")
    found = medians(errors)
    for key, bound in BOUNDS.items():
        assert found[key] <= bound, (key, found[key])


def test_ranking_checks_do_not_get_worse() -> None:
    """Gains between configs a tuner compares: their sign and size, simulated against measured."""
    checks = load_rankings(POINTS)
    needed = {c[k] for c in checks for k in ("numerator", "denominator")}
    errors = evaluate(p for p in load_points(POINTS) if p["id"] in needed)
    ranks = [r for r in rankings(checks, errors) if r.split == "validation"]
    assert sum(r.passes for r in ranks) >= RANKINGS_PASSING, [(r.check, r.error) for r in ranks]
    assert statistics.median(abs(r.error) for r in ranks) <= RANKING_MEDIAN
    assert all(r.sign_agrees or abs(r.measured - 1) < 0.05 for r in ranks)  # no ranking flips


def test_real_starts_are_simulated_starts() -> None:
    """A false "cannot start" is the worst error: every startup outcome in the data must match."""
    memory = [p for p in load_points(POINTS) if p["kind"] == "memory"]
    starts = [e for e in evaluate(memory) if e.metric == "starts"]
    assert starts and all(e.simulated == e.measured for e in starts)
