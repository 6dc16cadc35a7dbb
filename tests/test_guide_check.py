"""The guide's check of its model against a trial's saturation bursts (autotune/tune/guide_check.py): the
bursts a capacity search records, stored in the study and read back, replayed on the simulated engine."""

from __future__ import annotations

import math

import pytest

from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.measure.capacity_report import BurstSummary
from autotune.measure.slo import parse_slos
from autotune.sim.calibration import DEFAULT_CALIBRATION
from autotune.sim.noise import NoiseModel
from autotune.trial.capacity import find_capacity
from autotune.tune.guide_budget import Observation
from autotune.tune.guide_check import OFFSET, SHAPE, SLOWER, Misfit, adequacy, misfit, replay_bursts
from autotune.tune.guide_refit import scaled_calibration
from autotune.tune.result_attrs import INFO_ATTR, info_attr, parse_info
from autotune.workloads.files import load_workload

CONFIG = EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192, max_num_seqs=64)
SLOS = parse_slos("ttft_p99=2s")


def _trial(calibration=DEFAULT_CALIBRATION, noise: float = 0.0, seed: int = 3):  # noqa: ANN001, ANN202
    backend = SimBackend("H100", NoiseModel(noise), calibration)
    return find_capacity(backend, CONFIG, load_workload("chat"), SLOS, seed=seed)


@pytest.fixture(scope="module")
def exact() -> tuple[BurstSummary, ...]:
    """The bursts of a trial on a GPU the guide's calibration describes exactly (noise off)."""
    result = _trial()
    assert result.capacity is not None
    return result.capacity.bursts


def test_a_capacity_search_records_its_bursts_and_the_study_keeps_them(exact: tuple) -> None:
    assert exact and all(b.seed == 3 and b.requests > 0 for b in exact)
    assert set(exact[-1].metrics) == set(SLOWER)
    result = _trial()
    stored = parse_info({INFO_ATTR: info_attr(result)}).capacity
    assert stored is not None and stored.bursts == exact  # written at tell, read back the same


def test_the_guide_replays_the_same_requests_exactly_at_its_own_calibration(exact: tuple) -> None:
    replayed = replay_bursts("H100", CONFIG, load_workload("chat"), exact, DEFAULT_CALIBRATION)
    found = misfit(exact, replayed)
    assert found is not None and found.shape < 1e-5 and abs(found.offset) < 1e-5  # the figures are rounded


def test_a_uniformly_slower_gpu_is_an_offset_and_other_mechanisms_a_shape(exact: tuple) -> None:
    workload = load_workload("chat")
    slower = replay_bursts("H100", CONFIG, workload, exact, scaled_calibration(DEFAULT_CALIBRATION, 1.1))
    found = misfit(exact, slower)  # measured: the guide's own; replayed: a guide that thinks it 10 % faster
    assert found is not None and found.offset == pytest.approx(math.log(1.1), abs=0.03)
    assert found.shape < SHAPE
    # an API server three times as dear: the prefill queue moves, the step does not
    names = ("intake_per_request_s", "chat_intake_extra_s", "output_per_token_s", "completions_fixed_s")
    api = DEFAULT_CALIBRATION.replace(**{n: 3 * getattr(DEFAULT_CALIBRATION, n) for n in names})
    measured = _trial(api).capacity
    assert measured is not None
    replayed = replay_bursts("H100", CONFIG, workload, measured.bursts, DEFAULT_CALIBRATION)
    found = misfit(measured.bursts, replayed)
    assert found is not None and found.shape > SHAPE


def test_session_noise_stays_adequate_and_the_verdict_needs_every_trial(exact: tuple) -> None:
    noisy = _trial(noise=0.02).capacity
    assert noisy is not None
    workload = load_workload("chat")
    found = misfit(noisy.bursts, replay_bursts("H100", CONFIG, workload, noisy.bursts, DEFAULT_CALIBRATION))
    assert found is not None and found.shape <= SHAPE and abs(found.offset) < OFFSET

    def observed(number: int, measured: float | None, bursts: tuple = exact) -> Observation:
        return Observation(number, f"k{number}", {}, 10.0, measured, 60.0, bursts=bursts)

    fits = {0: found, 1: misfit(exact, [b.metrics for b in exact]), 2: None}

    def fit_of(o: Observation):  # noqa: ANN202
        return fits[o.number]

    assert adequacy([observed(0, 9.0)], fit_of, 2) is None  # one trial cannot tell
    assert adequacy([observed(0, 9.0), observed(1, 10.0)], fit_of, 2) == found  # the worst shape
    # two sessions whose speeds differ by more than 2 x OFFSET: the model's speed differs by config
    fits[3] = Misfit(found.offset + 2.5 * OFFSET, found.shape)
    assert adequacy([observed(0, 9.0), observed(3, 10.0)], fit_of, 2) is None
    # a trial without bursts (a study from before them), or one predicted to meet the SLOs that did not
    assert adequacy([observed(0, 9.0), observed(1, 10.0, ())], fit_of, 2) is None
    assert adequacy([observed(0, 9.0), observed(1, 10.0), observed(2, None)], fit_of, 2) is None


def test_the_check_replays_each_measurement_once_and_keeps_them_apart(exact: tuple) -> None:
    """A misfit is kept per measurement, not per trial number: a benchmark or a second study reuses the
    numbers (tests the cache BurstCheck keeps; the replay counts its calls)."""
    from autotune.tune.guide_check import BurstCheck
    from autotune.tune.guide_refit import Refit
    from autotune.tune.objectives import Objective

    calls: list[int] = []

    def replay(calibration, params, bursts):  # noqa: ANN001, ANN202
        calls.append(len(bursts))
        return replay_bursts("H100", CONFIG, load_workload("chat"), bursts, calibration)

    def unused(*_):  # noqa: ANN002, ANN202
        raise AssertionError("the check predicts no table")

    refit = Refit(unused, unused, Objective("output_throughput", "maximize"), replay=replay)
    slower = _trial(DEFAULT_CALIBRATION.replace(step_base_s=2 * DEFAULT_CALIBRATION.step_base_s)).capacity
    assert slower is not None
    check = BurstCheck()
    first = Observation(0, "k", {}, 10.0, 9.0, 60.0, bursts=exact)
    again = Observation(0, "k", {}, 10.0, 7.0, 60.0, bursts=slower.bursts)  # trial #0 of another study
    assert check.misfit(first, refit, 0) == check.misfit(first, refit, 0)
    assert len(calls) == 1  # replayed once
    assert check.misfit(again, refit, 0) != check.misfit(first, refit, 0)
    assert check.misfit(first, None, 0) is None  # no refit: nothing to replay with
