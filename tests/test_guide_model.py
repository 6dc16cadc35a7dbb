"""The guide's model of its own error (autotune/tune/guide_residual.py, guide_refit.py): the residual
GP and the speed refit, on their own, without a run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from guided_runs import SPACE

from autotune.calibrate.fit import candidates
from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.sim.calibration import DEFAULT_CALIBRATION
from autotune.sim.costs import CostModel
from autotune.tune.guide_residual import BIAS, ResidualModel


def test_the_residual_model_learns_a_global_bias_and_is_surest_near_its_points() -> None:
    x = [[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1]]
    model = ResidualModel(noise=0.02).fit(x, [-0.3] * 4)
    posterior = model.predict(np.array([[0.05, 0.05], [1.0, 1.0]]))
    near, far = posterior.mean
    assert near == pytest.approx(-0.3, abs=0.03)  # the bias, where it was measured
    assert -0.3 < far < 0  # and shrunk toward it far away (the local part does not reach there)
    assert posterior.sd[0] < posterior.sd[1] < math.sqrt(BIAS**2 + model.scale**2)


def test_reality_only_mechanisms_are_off_by_default_and_never_fitted() -> None:
    model, gpu = get_model("meta-llama/Llama-3.1-8B-Instruct"), get_gpu("H100")
    kv = model.kv_bytes_per_token() if callable(getattr(model, "kv_bytes_per_token", None)) else 131072
    args = (4096, 256, 256, 256 * 1000, 0.0, 0)
    base = CostModel(model, gpu, 1, kv).step_time(*args)
    same = CostModel(model, gpu, 1, kv, DEFAULT_CALIBRATION.replace()).step_time(*args)
    busy = CostModel(model, gpu, 1, kv, DEFAULT_CALIBRATION.replace(reality_seq_pair_s=3e-8)).step_time(*args)
    assert same == base and busy == pytest.approx(base + 256 * 256 * 3e-8)
    points = [{"kind": "serve"}, {"kind": "step"}, {"kind": "memory"}]
    names = {i.name for i in candidates(points, DEFAULT_CALIBRATION.replace(reality_seq_pair_s=1e-8))}
    assert not any(name.startswith("reality_") for name in names)


def test_the_speed_refit_recovers_a_slower_gpu_from_a_few_measurements() -> None:
    """Measurements made at the guide's calibration scaled by 0.8 (a GPU 20 % slower in every speed
    constant) give back 0.8 within one grid step, from three configs."""
    import yaml

    from autotune.measure.slo import parse_slos
    from autotune.tune.guide import predict_points
    from autotune.tune.guide_refit import STEP, Refit, scaled_calibration
    from autotune.tune.objectives import Objective
    from autotune.tune.space import space_from_dict
    from autotune.workloads.files import load_workload

    space = space_from_dict(yaml.safe_load(SPACE))
    chat, slos = load_workload("chat"), parse_slos(["ttft_p99=2s"])
    objective = Objective("output_throughput", "maximize")
    points = [
        {"max_num_seqs": s, "max_num_batched_tokens": b} for s, b in ((32, 2048), (256, 8192), (1024, 2048))
    ]
    slower = predict_points(space, points, chat, slos, scaled_calibration(DEFAULT_CALIBRATION, 0.8))
    measured = [(p.key, p.params, p.value(objective)) for p in slower.predictions]
    calls = []

    def predict(calibration, params):  # noqa: ANN001, ANN202
        calls.append(calibration)
        return predict_points(space, params, chat, slos, calibration).predictions

    refit = Refit(lambda c: None, predict, objective)  # type: ignore[arg-type, return-value]
    index = refit.fit(measured)
    assert abs(refit.factor(index) - 0.8) <= math.exp(STEP) - 1 + 1e-9
    assert refit.fit([]) == 0  # nothing measured: the guide's own calibration
    refit.fit(measured)
    assert len(calls) <= 3 * 9  # a bisection over the grid, each point predicted once


def test_of_the_factors_that_fit_exactly_the_refit_keeps_the_one_nearest_the_guides_calibration() -> None:
    """The fast estimate's rates lie on a ladder, so neighbouring factors can predict the same value: a
    measurement equal to the guide's prediction (here, factors 0.93 to 1.04 all predict it) keeps the
    factor at 1; one on a plateau of other factors moves to that plateau's end nearest 1."""
    from autotune.tune.guide import Prediction
    from autotune.tune.guide_refit import LIMIT, Refit
    from autotune.tune.objectives import Objective

    objective = Objective("output_throughput", "maximize")

    def predict(calibration, params):  # noqa: ANN001, ANN202
        rung = math.floor(math.log(calibration.gemm_eff / DEFAULT_CALIBRATION.gemm_eff) / math.log(1.1) + 0.7)
        value = 100 * 1.1**rung  # 100 for factors 0.935-1.028, 90.9 below, 110 above
        return [
            Prediction(p["key"], p, starts=True, capacity_rate=1.0, metrics={"output_throughput": value})
            for p in params
        ]

    refit = Refit(lambda c: None, predict, objective)  # type: ignore[arg-type, return-value]
    assert refit.fit([("a", {"key": "a"}, 100.0)]) == 0
    slower = refit.fit([("a", {"key": "a"}, 100 / 1.1)])
    assert 0.85 < refit.factor(slower) < 0.935 and refit.factor(slower + 1) >= 0.935  # the plateau's top
    # Where the search starts (a run passes the last fit's point) changes its cost, not its answer.
    for value, answer in ((100.0, 0), (100 / 1.1, slower), (100 / 1.1**5, None), (1000.0, LIMIT)):
        fits = {refit.fit([("b", {"key": "b"}, value)], near=near) for near in range(-50, 51, 7)}
        assert len(fits) == 1 and (answer is None or fits == {answer})
    # A value that moves as the speed does is found in a few predictions (a bisection of the grid: nine).
    calls = []

    def proportional(calibration, params):  # noqa: ANN001, ANN202
        calls.append(calibration)
        value = 100 * calibration.gemm_eff / DEFAULT_CALIBRATION.gemm_eff
        return [
            Prediction(p["key"], p, starts=True, capacity_rate=1.0, metrics={"output_throughput": value})
            for p in params
        ]

    cold = Refit(lambda c: None, proportional, objective)  # type: ignore[arg-type, return-value]
    assert cold.factor(cold.fit([("a", {"key": "a"}, 80.0)])) == pytest.approx(0.8, rel=0.013)
    assert len(calls) <= 4


def test_the_refit_compares_measurements_on_the_refined_tables_scale() -> None:
    """The refined table's fast estimates are scaled by the full search's ratio to them (here 5 % for
    most, 10 % the other way for one config searched in full): a GPU that measures what that table
    predicts keeps the speed factor at 1, and what the refit hands out (the re-predicted space, extra
    points) is on that scale; measured against the raw estimate the same GPU reads as faster."""
    import yaml

    from autotune.measure.slo import parse_slos
    from autotune.tune.guide import GuideTable, predict_points
    from autotune.tune.guide_refit import Refit
    from autotune.tune.objectives import Objective
    from autotune.tune.space import space_from_dict
    from autotune.workloads.files import load_workload

    space = space_from_dict(yaml.safe_load(SPACE))
    chat, slos = load_workload("chat"), parse_slos(["ttft_p99=2s"])
    objective = Objective("output_throughput", "maximize")
    points = [
        {"max_num_seqs": s, "max_num_batched_tokens": b} for s, b in ((32, 2048), (256, 16384), (1024, 2048))
    ]

    def predict(calibration, params):  # noqa: ANN001, ANN202
        return predict_points(space, params, chat, slos, calibration).predictions

    fast = predict(DEFAULT_CALIBRATION, points)
    searched = GuideTable(fast, estimate_scale=1 / 0.95, searched_scales={fast[1].key: 0.9})
    measured = [(p.key, p.params, p.value(objective) * searched.scale_of(p.key)) for p in fast]
    raw = Refit(lambda c: GuideTable(predict(c, points)), predict, objective)
    refined = Refit(raw.predict_table, predict, objective, scale_of=searched.scale_of)
    assert refined.fit(measured) == 0
    assert refined.fit(measured[1:2]) == 0  # the config searched in full, on its own ratio
    assert raw.fit(measured) >= 1  # read as a faster GPU than the model, by the median scale
    table = refined.table(-4)
    for got, plain in zip(table.predictions, predict(refined.calibration(-4), points), strict=True):
        expected = plain.value(objective) * searched.scale_of(got.key)
        assert got.value(objective) == pytest.approx(expected, rel=1e-3)
    extra = refined.points(-4, points[1:2])[0]
    assert extra.value(objective) == pytest.approx(table.predictions[1].value(objective), rel=1e-6)


def test_the_residual_model_with_nothing_measured_is_its_prior() -> None:
    """No trial yet with both a prediction and a measurement (the defaults missed the SLOs, or the
    refitted guide predicts they meet none): the prior, not a crash."""
    posterior = ResidualModel(noise=0.02).fit([], []).predict(np.array([[0.0, 0.0], [1.0, 1.0]]))
    assert list(posterior.mean) == [0.0, 0.0]
    assert (
        posterior.sd[0] == posterior.sd[1] == pytest.approx(math.sqrt(BIAS**2 + ResidualModel().scale ** 2))
    )


def test_the_residual_model_learns_a_noisier_measurement_from_alike_configs_that_disagree() -> None:
    """Six configs at one place in the space measured 10 % apart are noise (a capacity search spreads
    that much under a tight ITL SLO): the model learns more than the 3 % floor and is less sure there
    than one held to the floor; six that agree keep the floor."""
    x = [[0.5, 0.5]] * 6
    residuals = [-0.2, -0.1, -0.25, -0.05, -0.15, -0.2]
    noisy = ResidualModel(noise=0.03).fit(x, residuals)
    assert noisy.noise_factor > 1
    floor = ResidualModel(noise=0.03, noise_factors=(1.0,)).fit(x, residuals)
    at = np.array([[0.5, 0.5]])
    assert noisy.predict(at).sd[0] > floor.predict(at).sd[0]
    calm = ResidualModel(noise=0.03).fit(x, [-0.15, -0.16, -0.14, -0.15, -0.15, -0.16])
    assert calm.noise_factor == 1
