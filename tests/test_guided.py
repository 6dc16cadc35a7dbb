"""Guided search (autotune/tune/guided.py, `autotune run --guide sim`): real studies on the simulated
backend playing a reality the guide does not know (`--sim-calibration`, `--noise`): what a guided run
picks, when it stops, what it spends and writes. Runs stopped and resumed: tests/test_guided_resume.py."""

from __future__ import annotations

import html
import json
import math
import re
import struct
from pathlib import Path

import guided_runs
import pytest
from cli import autotune
from guided_runs import SPACE, guided_run, study_of

from autotune.core.procs import usable_cpus
from autotune.sim.calibration import DEFAULT_CALIBRATION, load_calibration

# The shared fixtures, bound here for pytest to find (each test file runs its own module-scoped ones).
bare, folder, unbudgeted = guided_runs.bare, guided_runs.folder, guided_runs.unbudgeted


def test_a_guided_run_measures_the_guides_best_then_the_defaults_then_its_picks_and_says_what_it_spent(
    unbudgeted: tuple[Path, str],
) -> None:
    folder, stderr = unbudgeted
    trials = [t for t in study_of(folder).trials if t.user_attrs.get("launched", True)]
    assert trials[0].user_attrs["guide"]["by"] == "best predicted"  # trial #0: the guide's best
    assert not trials[0].user_attrs.get("baseline")
    assert trials[1].user_attrs.get("baseline") and "guide" not in trials[1].user_attrs  # vLLM's defaults
    picks = [trials[0], *trials[2:]]
    assert len(picks) >= 3
    # the others: chosen by the guide, by expected improvement (no budget to save the last ones for)
    assert all(t.user_attrs["guide"]["by"] == "expected improvement" for t in picks[1:])
    # The guide's corrected capacity rides with each pick (a bracketed search's hint, off by default).
    assert all(t.user_attrs["guide"]["rate"] > 0 for t in picks)
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    assert [r["trial"] for r in guide["trials"]] == [t.number for t in trials]
    spent = sum(t.user_attrs["gpu_seconds"] for t in trials) / 3600
    assert guide["gpu_hours"] == pytest.approx(spent, abs=1e-3)
    assert "GPU-h spent" in stderr and "predicted vs measured" in stderr
    assert f"simulated engine ({usable_cpus()} core(s), lowest CPU priority)" in stderr  # as a child
    assert f"  #{trials[1].number}: predicted" in stderr
    assert "GPU-h; vLLM's defaults; bursts vs guide: shape" in stderr  # each trial's check of the model
    # The report shows it: best.json's guide section, report.html's plot and table.
    best = json.loads((folder / "runs/g/best.json").read_text())
    assert best["guide"]["trials"] == guide["trials"] and best["guide"]["stop_reason"]
    html = (folder / "runs/g/report.html").read_text()
    assert "Guided search" in html and "guide: predicted vs measured" in html
    # guide.png: predicted vs measured, and beside it each trial's error in trial order (two panels)
    png = (folder / "runs/g/guide.png").read_bytes()
    width, height = struct.unpack(">II", png[16:24])
    assert png.startswith(b"\x89PNG") and width > 2 * height
    # The dashboard's figure and note: guide.json's prediction of each trial, vLLM's defaults' too (the
    # guide did not choose them: their trial has no `guide` attr), guide.png's points (all that met the SLOs).
    from optuna_dashboard import get_note
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    study = study_of(folder)
    figures = get_plotly_graph_objects(study._storage.get_study_system_attrs(study._study_id))
    figure = json.loads(figures["guide-predicted-vs-measured"])
    assert figure["layout"]["xaxis"]["title"]["text"] == "predicted output_throughput"
    points = figure["data"][-1]
    shown = [r for r in guide["trials"] if r["measured"] and r["predicted"]]
    assert f"#{trials[1].number}" in points["text"]
    assert points["text"] == [f"#{r['trial']}" for r in shown]
    assert points["x"] == [r["predicted"] for r in shown] and points["y"] == [r["measured"] for r in shown]
    note = get_note(study)
    for r in guide["trials"]:
        predicted = f"{r['predicted']:,.1f}" if r["predicted"] is not None else "-"
        measured = f"{r['measured']:,.1f}" if r["measured"] is not None else "infeasible"
        assert f"| #{r['trial']} | {r['by']} | {predicted} | {measured} |" in note, note
    # The reality is slower than the guide's model: the guide over-predicted, and the fitted
    # calibration it writes says so (a reusable file: --guide-calibration / --sim-calibration).
    assert guide["speed_factor"] < 0.95
    fitted = load_calibration(folder / "runs/g/calibration.yaml")
    assert fitted.gemm_eff < DEFAULT_CALIBRATION.gemm_eff
    # Its corrected predictions after two measurements are closer to what was measured than the raw ones.
    later = [r for r in guide["trials"][2:] if r["measured"]]
    assert later
    for r in later:
        assert abs(math.log(r["predicted"] / r["measured"])) < abs(math.log(r["raw"] / r["measured"]))


def test_the_budget_stops_the_run_before_a_trial_would_pass_it(folder: Path) -> None:
    guided_run(folder, "--n-trials", "6", "--gpu-hours", "0.5")
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    assert guide["stop_reason"].startswith("budget")
    # ... and says what more budget could buy: the untried configs' 95 % bound against the incumbent.
    outlook = re.search(
        r"is ([+-][0-9.]+)% against the best measured \(([0-9,.]+) vs ([0-9,.]+): "
        r"the best measured, ([0-9,.]+), counts as \3 after the measurement's noise\), (\w+)",
        guide["stop_reason"],
    )
    assert outlook is not None, guide["stop_reason"]
    gain, bound, best = (float(g.replace(",", "")) for g in outlook.groups()[:3])
    assert gain == pytest.approx(100 * (bound / best - 1), abs=0.1)
    assert outlook.group(5) == ("beyond" if gain > 3 else "within")
    measured = [r["measured"] for r in guide["trials"] if r["measured"]]
    assert float(outlook.group(4).replace(",", "")) == pytest.approx(max(measured), abs=0.06)
    # A trial was launched only when the spend so far plus the dearest trial so far fitted the budget
    # (a capacity search's cost is known only once it ran: a dearer one can pass it by the difference).
    costs = [r["gpu_hours"] for r in guide["trials"]]
    for i in range(1, len(costs)):
        assert sum(costs[:i]) + max(costs[:i]) <= 0.5 + 1e-3
    assert sum(costs) + max(costs) > 0.5  # and the next would not have fitted
    # Once the budget affords at most two more trials a pick is the best corrected prediction, not
    # expected improvement (without a budget: the first test): at 0.5 GPU-h, ~0.14 a trial, the third.
    picks = [t.user_attrs["guide"]["by"] for t in study_of(folder).trials if "guide" in t.user_attrs]
    assert picks == ["best predicted", "best predicted"]
    by = [r["by"] for r in guide["trials"]]
    assert by == [picks[0], "vLLM's defaults", picks[1]]  # guide.json says so
    assert "<th>chosen by</th>" in (folder / "runs/g/report.html").read_text()  # as does the report


def test_the_run_stops_when_the_guide_predicts_nothing_better_is_left(unbudgeted: tuple[Path, str]) -> None:
    folder, _ = unbudgeted
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    said = re.fullmatch(
        r"the guide predicts no untried config beats the best measured by more than 3% \(95 % bound "
        r"([0-9,.]+); the best measured, ([0-9,.]+), counts as ([0-9,.]+) after the measurement's noise\)",
        guide["stop_reason"],
    )
    assert said is not None, guide["stop_reason"]
    bound, top, counted = (float(g.replace(",", "")) for g in said.groups())
    assert bound < counted * 1.03  # the rule as it says
    assert top == pytest.approx(max(r["measured"] for r in guide["trials"] if r["measured"]), abs=0.06)
    assert len(guide["trials"]) < 6  # it ended before measuring every config


def test_defaults_the_budget_cannot_afford_are_left_out_and_the_run_goes_on(bare: Path) -> None:
    """Under a p99 ITL of 30 ms the guide predicts vLLM's defaults (1024 / 2048) at a seventh of its
    best's capacity: their search would cost about seven first trials. With 1.2 GPU-h for a 0.46 GPU-h
    first trial the run measures the next pick the budget affords instead of stopping with budget
    unspent, and says what the defaults would have cost and what the guide predicts for them."""
    space = SPACE.replace("[2048, 16384]", "[512, 2048]")
    (bare / "space.yaml").write_text(space)
    out = guided_run(bare, "--n-trials", "6", "--gpu-hours", "1.2", "--slo", "itl_p99=30ms")
    guide = json.loads((bare / "runs/g/guide.json").read_text())
    rows = guide["trials"]
    assert [r["by"] for r in rows] == ["best predicted", "best predicted"]  # no defaults among them
    spent = [r["gpu_hours"] for r in rows]
    defaults = guide["defaults"]
    # left out because their charge (the first trial's cost scaled to their predicted value) passed
    # what the budget had left, where the second pick's did not
    assert defaults["over_budget_gpu_hours"] > 1.2 - spent[0] > spent[1] * 0.5
    assert defaults["over_budget_gpu_hours"] == pytest.approx(
        spent[0] * rows[0]["measured"] / defaults["predicted"], rel=0.02
    )
    assert defaults["starts"] and 0 < defaults["raw"] < rows[0]["raw"] / 5
    said = f"vLLM's defaults: not measured (about {defaults['over_budget_gpu_hours']:.2f} GPU-h, more than "
    said += f"the budget had left); the guide predicts {defaults['predicted']:,.1f}"
    assert said in out.stderr
    assert html.escape(said) in (bare / "runs/g/report.html").read_text()
    assert json.loads((bare / "runs/g/best.json").read_text())["guide"]["defaults"] == defaults
    assert guide["gpu_hours"] <= 1.2


def test_where_the_guide_predicts_no_config_meets_the_slos_a_measurement_says_so(bare: Path) -> None:
    """A p99 TTFT of 20 ms, which the guide predicts no config meets: the run measures vLLM's defaults
    rather than stop on the guide's word, and stops once they miss it too."""
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=20ms", "--guide", "sim", "--parallel", "1"]
    args += ["--sim-calibration", "reality.yaml", "--noise", "0.02", "--repeats", "0", "--study", "g"]
    out = autotune(bare, *args, "--guide-top", "0", "--n-trials", "4", "--gpu-hours", "2")
    guide = json.loads((bare / "runs/g/guide.json").read_text())
    (trial,) = study_of(bare).trials
    assert trial.user_attrs.get("baseline") and trial.user_attrs["config_key"]
    assert [r["measured"] for r in guide["trials"]] == [None]  # measured: it missed the SLO
    said = "the guide predicts no config of the space meets the SLOs; vLLM's defaults, measured, meet none"
    assert guide["stop_reason"].startswith(said)
    assert "No feasible config" in out.stdout + out.stderr


def test_a_pick_the_startup_screen_rejects_is_not_picked_again(bare: Path) -> None:
    """The screen's memory model is the backend's (here a reality whose CUDA graphs take 7x the
    guide's memory: every config at 0.96 fails to start), the guide's its own: a config it picks and
    the screen rejects is told once, and the guide moves on to one that runs."""
    space = SPACE.replace(
        "  max_num_batched_tokens: {type: categorical, choices: [2048, 16384]}\n",
        "  gpu_memory_utilization: {type: categorical, choices: [0.8, 0.96]}\n",
    ).replace("[32, 256, 1024]", "[256, 1024]")
    (bare / "space.yaml").write_text(space)
    (bare / "reality.yaml").write_text("cuda_graph_mib_per_layer: 1.5\ngraph_mlp_factor: 60\n")
    guided_run(bare, "--n-trials", "3")
    trials = study_of(bare).trials
    screened = [t.user_attrs["config_key"] for t in trials if t.user_attrs.get("screened")]
    assert screened and len(set(screened)) == len(screened)  # each rejected once
    assert all(t.params["gpu_memory_utilization"] == 0.96 for t in trials if t.user_attrs.get("screened"))
    launched = [t for t in trials if t.user_attrs.get("launched", True)]
    assert len(launched) == 2 and all(t.params["gpu_memory_utilization"] == 0.8 for t in launched)


def test_two_trials_at_a_time_choose_the_second_before_anything_is_measured(folder: Path) -> None:
    """With --parallel 2 the defaults start while the guide's first pick runs, and the guide picks the
    third while one of them may still run."""
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--parallel", "2"]
    args += ["--sim-calibration", "reality.yaml", "--noise", "0.02", "--repeats", "0", "--study", "g"]
    autotune(folder, *args, "--n-trials", "4", "--guide-top", "0")
    trials = [t for t in study_of(folder).trials if t.user_attrs.get("launched", True)]
    keys = [t.user_attrs["config_key"] for t in trials]
    assert len(keys) == len(set(keys)) == 4
    assert trials[0].user_attrs["guide"]["sd"] > 0.3  # chosen on the prior: nothing measured yet
    assert trials[1].user_attrs.get("baseline") and "guide" in trials[2].user_attrs


def test_trials_still_running_count_against_the_budget(folder: Path) -> None:
    """Two at a time, ~0.14 GPU-h a trial, 0.5 budgeted: a third trial starts only while the spend,
    the running trial and itself fit; charging only finished trials launched a fourth (0.55 GPU-h).
    The pre-run estimate charges the first two (about 0.1 GPU-h each): they start side by side."""
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--parallel", "2"]
    args += ["--sim-calibration", "reality.yaml", "--noise", "0.02", "--repeats", "0", "--study", "g"]
    autotune(folder, *args, "--n-trials", "8", "--gpu-hours", "0.5", "--guide-top", "0")
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    assert guide["stop_reason"].startswith("budget")
    assert guide["gpu_hours"] <= 0.5
    first, second, *_ = trials = study_of(folder).trials
    assert second.datetime_start < first.datetime_complete
    assert all(t.user_attrs["gpu_seconds_cap"] <= 0.5 * 3600 / 2 for t in (first, second))  # shared
    assert sum(t.user_attrs["gpu_seconds"] for t in trials) <= 0.5 * 3600


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpu-hours", "0"], "--gpu-hours: value must be positive"),
        (["--gpu-hours", "abc"], "--gpu-hours"),
        (["--guide", "bogus"], "invalid choice"),
        (["--guide-calibration", "broken.yaml"], "calibration file"),
        (["--guide", "none", "--gpu-hours", "1"], "needs a guided run"),
        (["--guide-top", "-1"], "--guide-top: value must be >= 0"),
        (["--guide", "none", "--guide-top", "4"], "needs a guided run"),
        # it said "workload chat is at fixed load: pass --load capacity" of a workload at capacity load
        (["--load", "fixed"], "--guide sim needs capacity load; --load fixed asks for another"),
    ],
)
def test_bad_guide_inputs_give_one_line_exit_2_and_write_nothing(
    bare: Path, extra: list[str], message: str
) -> None:
    (bare / "broken.yaml").write_text("gemm_eff: [1\n")
    args = ["run", "--space", "space.yaml", "--guide", "sim", *extra]
    out = autotune(bare, *args, check=False)
    assert out.returncode == 2
    assert message in out.stderr
    assert not (bare / "runs").exists()


def test_the_first_pick_is_the_best_of_the_guides_top_searched_in_full(folder: Path) -> None:
    """By default the guide's best configs by its fast estimate are measured by the full simulated
    capacity search before the first trial (tune/guide_refine.py); the first pick is their best."""
    from autotune.tune.guide import GuideTable
    from autotune.tune.objectives import Objective

    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--repeats", "0"]
    out = autotune(folder, *args, "--study", "g", "--n-trials", "1", "--guide-top", "3")
    assert "the best 3 by the full capacity search" in out.stderr
    [cached] = (folder / "runs/guide").glob("*.top3-*.json")
    refined = GuideTable.from_json(cached.read_text())
    top = refined.ranking(Objective("output_throughput", "maximize"))[0]
    first = study_of(folder).trials[0]
    assert first.params == top.params
    assert first.user_attrs["guide"]["raw"] == pytest.approx(top.output_throughput, rel=1e-4)
    searched = [p for p in refined.predictions if p.knee_rate is None and p.capacity_rate > 0]
    assert len(searched) >= 3  # the full search reports no knee: the fast estimate's configs do


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_on_a_gpu_the_guide_describes_the_run_ends_after_its_pick_and_the_defaults(
    folder: Path, parallel: str
) -> None:
    """Where every trial's saturation bursts replay on the guide's model (tune/guide_check.py: the reality
    is the guide's calibration, with 2 % session noise), the guide's own predictions bound the untried
    configs and the run stops at two trials. Two at a time, a third starts when the first ends (one
    measurement decides no stop); the stop then holds while it runs, and is decided once it ends. On
    the slower reality the bursts miss: the residual model's bound stays, and the run measures more."""
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--parallel", parallel]
    args += ["--noise", "0.02", "--repeats", "0", "--guide-top", "3", "--n-trials", "6"]
    autotune(folder, *args, "--study", "same")
    guide = json.loads((folder / "runs/same/guide.json").read_text())
    by = [r["by"] for r in guide["trials"]]
    assert by[:2] == ["best predicted", "vLLM's defaults"] and len(by) <= int(parallel) + 1, by
    assert "fitting every trial's bursts" in guide["stop_reason"]
    assert all(r["bursts"]["shape"] <= 0.02 for r in guide["trials"])  # each trial's check, as it stood
    if parallel == "2":
        return  # the slower reality's run is the same with one at a time
    autotune(folder, *args, "--study", "slower", "--sim-calibration", "reality.yaml")
    guide = json.loads((folder / "runs/slower/guide.json").read_text())
    assert len(guide["trials"]) > 2 and "bursts" not in guide["stop_reason"]
    assert any(r["bursts"]["shape"] > 0.02 for r in guide["trials"])


def test_the_default_simulated_run_is_not_guided(bare: Path) -> None:
    args = ["run", "--space", "space.yaml", "--n-trials", "2", "--study", "g", "--repeats", "0"]
    out = autotune(bare, *args)
    assert "guide:" not in out.stderr
    assert not (bare / "runs/g/guide.json").exists()


def test_the_guide_is_on_by_default_on_real_backends_and_off_on_the_simulated_one() -> None:
    import argparse

    from autotune.commands.run_guide import guide_on

    for backend, guide, on in [("vllm", None, True), ("docker", None, True), ("sim", None, False)]:
        assert guide_on(argparse.Namespace(backend=backend, guide=guide)) is on
    assert guide_on(argparse.Namespace(backend="sim", guide="sim"))
    assert not guide_on(argparse.Namespace(backend="vllm", guide="none"))


def test_when_the_guides_best_is_vllms_defaults_they_are_measured_once(folder: Path) -> None:
    """The guide's first pick is the baseline too: one trial, marked both ways, not two."""
    one = SPACE.replace("[32, 256, 1024]", "[1024]").replace("[2048, 16384]", "[8192]")
    (folder / "space.yaml").write_text(one)
    guided_run(folder, "--n-trials", "3")
    trials = [t for t in study_of(folder).trials if t.user_attrs.get("launched", True)]
    assert len(trials) == 1
    assert trials[0].user_attrs.get("baseline") and trials[0].user_attrs["guide"]["by"] == "best predicted"
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    assert guide["stop_reason"].startswith("every config the guide predicts")


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_re_measuring_the_top_stays_within_the_budget(folder: Path, parallel: str) -> None:
    """Three trials (~0.14 GPU-h each) under 1 GPU-h leave room for some of their six repeats (two seeds
    each: the top and the defaults), not all: those that fit run, and guide.json's spend, the
    trials' and the repeats', stays within the budget. Two at a time, each running repeat holds its cap
    (its share of what is left): a repeat that does not fit beside them waits for them."""
    out = guided_run(folder, "--n-trials", "3", "--gpu-hours", "1", "--repeats", "2", "--parallel", parallel)
    assert "repeat(s) left out" in out.stderr and "more than the budget has left" in out.stderr
    study = study_of(folder)
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    trials_h = sum(t.user_attrs["gpu_seconds"] for t in study.trials if t.user_attrs.get("launched", True))
    repeats_h = study.user_attrs["remeasured_gpu_seconds"] / 3600
    ran = sum(len(v) for v in study.user_attrs["remeasured"].values())
    assert len(study.trials) == 3 and 0 < ran < 2 * 3  # some of the three configs' six repeats
    assert sorted(study.user_attrs["remeasure_targets"]) == [0, 1, 2]  # meant for all three
    assert guide["remeasure_gpu_hours"] == pytest.approx(repeats_h, abs=1e-3)
    assert guide["gpu_hours"] == pytest.approx(trials_h / 3600 + repeats_h, abs=1e-3)
    assert guide["gpu_hours"] <= 1.0


def test_a_trial_the_raw_guide_predicted_to_miss_the_slos_is_plotted_from_its_corrected_prediction(
    tmp_path: Path,
) -> None:
    """guide.json's "raw" is 0 for a config the guide at its own calibration predicted to miss the SLOs
    (its refit then predicted it to meet them): the plot shows its corrected error, and the report is
    written (a division by that 0 failed the run's results)."""
    from autotune.outputs.guide_view import plot_guide

    rows = [
        {"trial": 0, "predicted": 611.5, "raw": 611.5, "measured": 32.9, "gpu_hours": 1.9},
        {"trial": 2, "predicted": 274.2, "raw": 0.0, "measured": 242.3, "gpu_hours": 1.6},
    ]
    png = plot_guide(tmp_path / "guide.png", {"trials": rows}, "output_throughput")
    assert png is not None and png.read_bytes().startswith(b"\x89PNG")
