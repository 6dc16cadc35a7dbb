"""The fit from priors at the edge of the constants' ranges (tests/test_calibration.py has its recovery
from the built-in prior)."""

from __future__ import annotations

import re
from typing import Any

from autotune.calibrate.design import ConfigUnderTest, designed_points
from autotune.calibrate.fit import fit_calibration
from autotune.calibrate.points import Replay
from autotune.sim.calibration import DEFAULT_CALIBRATION

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def _measured(runs: tuple[str, ...]) -> list[dict[str, Any]]:
    """Designed serve points with what the built-in calibration simulates as their measurements."""
    config = ConfigUnderTest("a", {"max_model_len": 8192}, 8192, runs)
    points = [p for p in designed_points(LLAMA_8B, "H100", [config]) if p["kind"] == "serve"]
    replay = Replay(points)
    for i, point in enumerate(points):
        simulated = replay.simulate(i)
        point["measured"] = {m: simulated[m] for m in point["measured"]}
    return points


def test_a_prior_on_its_range_bounds_is_fitted() -> None:
    """gemm_eff and per_seq_s starting on their bounds: the fit moved nothing (least_squares started
    on a bound), every error stayed at up to 48x."""
    points = _measured(("light-c1", "prefill-c1"))
    prior = DEFAULT_CALIBRATION.replace(gemm_eff=0.01, per_seq_s=0.001)
    said: list[str] = []
    result = fit_calibration(points, prior, progress=said.append)
    assert min(abs(e.signed) for e in result.before) > 5
    assert max(abs(e.signed) for e in result.after) < 0.05
    # each evaluation is said (a fit of many points took minutes in silence), its error falling
    steps = [
        re.fullmatch(r"evaluation (\d+) of at most 30: median error ([\d.]+)% \(\d+ s\)", s) for s in said
    ]
    errors = [float(m[2]) for m in steps if m]
    assert len(errors) >= 2 and errors[0] > 500 and errors[-1] < 5, said


def test_a_constant_flat_at_its_prior_is_still_one_the_points_depend_on() -> None:
    """At gemm_eff 1 a 256-token prefill streams weights: a small step moves nothing, yet at the
    built-in 0.6 it is the matmuls that set its TTFT (the report said no point depends on them)."""
    result = fit_calibration(_measured(("light-c1",)), DEFAULT_CALIBRATION.replace(gemm_eff=1.0))
    assert {"gemm_eff", "gemm_half_m"} <= set(result.free)
    assert "gemm_eff" not in result.unseen and "gemm_half_m" not in result.unseen
