"""The guided run's --gpu-hours as a cap (tune/guide_budget.py, trial_cap_s): each trial's capacity search
gets a share of what the budget has left and stops before a window that would pass it."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from cli import autotune
from guided_runs import REALITY, SPACE
from optuna.trial import TrialState

from autotune.tune.guide_budget import Budget, Observation

# A reality three times slower than the guide's model: its searches cost far more than the pre-run
# estimate (from the guide's calibration) charges the first trial.
SLOW = "gemm_eff: 0.2\nattn_eff: 0.2\nstep_base_s: 0.012\nbw_eff: 0.3\n"


def _run(
    folder: Path, gpu_hours: str, reality: str = REALITY
) -> tuple[str, list[optuna.trial.FrozenTrial], dict]:
    (folder / "space.yaml").write_text(SPACE)
    (folder / "reality.yaml").write_text(reality)
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--parallel", "2"]
    args += ["--sim-calibration", "reality.yaml", "--noise", "0.02", "--repeats", "0", "--study", "g"]
    out = autotune(folder, *args, "--guide-top", "0", "--n-trials", "6", "--gpu-hours", gpu_hours)
    study = optuna.load_study(study_name="g", storage=f"sqlite:///{folder}/runs/g/study.db")
    return out.stdout + out.stderr, study.trials, json.loads((folder / "runs/g/guide.json").read_text())


def test_a_search_dearer_than_what_the_budget_has_left_stops_at_its_share(tmp_path: Path) -> None:
    """The guide's first pick's search costs about 0.14 GPU-h on this reality; the pre-run estimate
    charges it about 0.1, so 0.12 GPU-h afford one trial, and it is given all of them (the second free
    GPU starts nothing the budget affords: it must not halve the share), stops before the window that
    would pass them, and reports the rate that passed as a lower bound; the run spends no more."""
    said, trials, guide = _run(tmp_path, "0.12")
    assert "autotune: estimate: about" in said  # the first trial's charge, from the guide's calibration
    first = trials[0]
    assert first.state == TrialState.COMPLETE and first.user_attrs["feasible"]
    assert first.user_attrs["gpu_seconds_cap"] == 432.0
    assert first.user_attrs["gpu_seconds"] <= 432.0
    assert first.user_attrs["info"]["capacity_stopped_by"].startswith("the GPU-hour budget")
    assert guide["gpu_hours"] <= 0.12
    assert "req/s per replica or more (its search stopped at its share of --gpu-hours)" in said


def test_a_search_cut_before_any_rate_passed_is_told_as_cut_short_and_the_run_stops(tmp_path: Path) -> None:
    """On a reality three times slower than the estimate, 0.11 GPU-h cannot hold the first search's second
    saturation burst (its pace in the first says so): that burst is not run, the trial is told FAIL (no
    verdict: the sampler learns nothing from it, the budget counts its startup and first burst, within
    its cap), and the run stops rather than charging the next trial nothing."""
    said, trials, guide = _run(tmp_path, "0.11", SLOW)
    assert [t.state for t in trials] == [TrialState.FAIL]
    cut = trials[0].user_attrs
    assert cut["failure"] == "budget_spent" and 0 < cut["gpu_seconds"] <= cut["gpu_seconds_cap"]
    assert cut["message"].startswith("the GPU-hour budget: a saturation burst of")
    assert guide["stop_reason"].startswith("budget: the next trial")
    assert "measured nothing (cut short at its share of --gpu-hours)" in said
    assert "0 configs measured" in said  # --n-trials counts trials with a verdict, as a resume does
    # The summary says why nothing is recommended, and lists only the files written (no best.sh).
    assert "No verdict: the trial was cut short by --gpu-hours before reaching one" in said
    assert "runs/g/ (trials.csv, pareto.csv, best.json, pareto.png, report.html, guide.json" in said
    assert not (tmp_path / "runs/g/best.sh").exists()


def test_a_resume_with_more_budget_measures_the_cut_config_again(tmp_path: Path) -> None:
    """A trial cut short has no verdict: a resume does not count it toward --n-trials nor answer its
    config from it, so the guide's pick is measured again; its GPU time stays spent."""
    _run(tmp_path, "0.11", SLOW)
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--resume"]
    args += ["--sim-calibration", "reality.yaml", "--noise", "0.02", "--repeats", "0", "--study", "g"]
    out = autotune(tmp_path, *args, "--guide-top", "0", "--n-trials", "2", "--gpu-hours", "0.6")
    study = optuna.load_study(study_name="g", storage=f"sqlite:///{tmp_path}/runs/g/study.db")
    cut, *resumed = study.trials
    again = [t for t in resumed if t.user_attrs["config"] == cut.user_attrs["config"]]
    assert [t.state for t in again] == [TrialState.COMPLETE] and "duplicate_of" not in again[0].user_attrs
    assert again[0].user_attrs["gpu_seconds"] > 0 and cut.user_attrs["gpu_seconds"] > 0
    assert "2 configs measured" in out.stdout + out.stderr


def test_the_budget_shares_what_is_left_and_waits_for_the_running_trials_caps() -> None:
    """Budget (tune/guide_budget.py): a trial's cap is its share of what the finished trials and the
    running trials' caps leave; while those caps hold what the next trial would be charged, the run waits
    for their costs (not stopping with budget they may hand back); a trial cut short is a floor under
    the next one's charge."""
    budget = Budget(gpu_hours=1.0)
    measured = [Observation(0, "a", {}, 100.0, 100.0, 900.0)]  # 900 GPU-s at 100 tok/s
    assert budget.trial_cap_s(900.0, 0.0, 3) == 900.0
    assert budget.trial_cap_s(900.0, 1800.0, 1) == 900.0
    assert budget.waits(measured, busy=1, reserved_s=2000.0)  # 2,700 left, 2,000 held: 700 < 900
    assert not budget.waits(measured, busy=1, reserved_s=1000.0)
    said = budget.stop(measured, 100.0, 1, reserved_s=2000.0)
    assert said is not None and "1 trial running with up to 0.56 GPU-h left to them" in said
    cut = Observation(1, "b", {}, 100.0, None, 1500.0, searched=False, interrupted=True)
    assert budget.next_cost_s([*measured, cut], 200.0) == 1500.0  # not 900 x 100 / 200
    assert budget.next_cost_s(measured, 200.0) == 450.0


def test_before_any_cost_is_known_a_pick_is_charged_the_estimate_scaled_to_its_predicted_value() -> None:
    """The pre-run estimate is vLLM's defaults' search: under an ITL SLO theirs cost 0.73 GPU-h for a
    predicted 608 tok/s, the guide's first pick's 0.17 for 2,618, and a 0.5 GPU-h budget launched
    nothing. A pick is charged the estimate scaled by the two predictions; unpredicted, the estimate."""
    budget = Budget(gpu_hours=0.5, first_trial_gpu_s=2628.0, first_trial_value=608.3)
    assert budget.next_cost_s([], 2618.4) == pytest.approx(2628.0 * 608.3 / 2618.4)
    assert budget.stop([], 2618.4, 0) is None
    assert budget.next_cost_s([], None) == 2628.0 and budget.stop([], None, 0) is not None
    assert Budget(gpu_hours=0.5, first_trial_gpu_s=2628.0).next_cost_s([], 2618.4) == 2628.0


def test_a_budget_the_study_spent_already_is_why_the_run_stops() -> None:
    """A resume with --gpu-hours below the study's spend: the budget, not the guide's stop rule, ends it."""
    measured = [Observation(0, "a", {}, 100.0, 100.0, 2400.0)]
    assert Budget(gpu_hours=1.0).spent_out(measured) is None and Budget().spent_out(measured) is None
    said = Budget(gpu_hours=0.5).spent_out(measured)
    assert said == "budget: 0.67 GPU-h spent of --gpu-hours 0.5, nothing left for a trial"


def test_a_budget_below_the_estimated_first_trial_launches_nothing(tmp_path: Path) -> None:
    """The simulated backend charges a guided run's first trial the pre-run estimate, as a real backend
    does: a budget below it starts no trial (the first's startup and first burst cannot be cut)."""
    said, trials, guide = _run(tmp_path, "0.05")
    assert "guide: budget 0.05 GPU-h affords no trial: one costs about 0.1" in said  # said before the run
    assert trials == [] and guide["gpu_hours"] == 0
    assert guide["stop_reason"].startswith("budget: the next trial, about 0.1")
    assert "No trial finished: nothing to recommend." in said
