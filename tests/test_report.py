"""The report's content: the recommendation with its gain record, costs, sizing, flags to know."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import optuna
import pytest
from test_recommendation import capacity as bracketed
from test_study import OBJECTIVES, SLOS, build_run, ok

from autotune.measure.capacity_report import CapacityReport, ProbeSummary
from autotune.measure.load_report import LoadReport, SteadyState
from autotune.outputs import report, report_html
from autotune.outputs.cost import cost_view, sizing
from autotune.outputs.dashboard import note_markdown
from autotune.outputs.outcome import fmt_number, outcome
from autotune.tune.objectives import ObjectiveSet, load_objectives, objectives_from_dict
from autotune.tune.study import TrialRecord, records

MAXIMIZE = [o.maximize for o in OBJECTIVES.objectives]


def capacity(rate: float, probes: tuple[ProbeSummary, ...]) -> CapacityReport:
    """A capacity search's report: `rate` passed, with these probes (its other figures not known)."""
    return CapacityReport(
        rate=rate,
        kept_up=True,
        bracket=None,
        resolution=None,
        bound_measured=False,
        saturation_throughput=None,
        goodput=None,
        probes=probes,
    )


def three_trials(tmp_path: Path) -> optuna.Study:
    return build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, ok(4000, 2500, 20)),  # infeasible: TTFT > 2 s
            ({"max_num_seqs": 256}, ok(4800, 1700, 25)),
            ({"max_num_seqs": 8}, None),  # fails to start
        ],
    )


def test_outcome_shows_the_gain_and_says_what_to_know(tmp_path: Path) -> None:
    recs = records(three_trials(tmp_path / "a"))
    infeasible_base = outcome(recs, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert infeasible_base.best is not None and infeasible_base.best.number == 1
    assert "vLLM's default config is infeasible here (violates SLO)" in infeasible_base.flags()

    gain = build_run(
        tmp_path / "b",
        [
            ({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20)),
            ({"max_num_seqs": 256}, ok(4800, 1700, 25)),
        ],
    )
    out = outcome(records(gain), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert out.gain_text() == "output_throughput +20.0 % (interval +20.0 % to +20.0 %, one run each)"
    assert report.summary_text(out).count("+20.0 % (interval") == 1 and out.flags() == []  # said once

    tie = build_run(
        tmp_path / "c",
        [
            ({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20)),
            ({"max_num_seqs": 256}, ok(4020, 1400, 19)),
        ],
    )
    kept = outcome(records(tie), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert kept.best is not None and kept.best.number == 0  # a 0.5 % gain is a tie: keep the defaults
    assert kept.flags() == [  # named as the verdict names it: the tie rule picked #1, at +0.5 %
        "the lowest-latency near-tie (trial #1) differs by +0.5 %, not clearly beyond the measurement's "
        "margin of 1.0%: vLLM's defaults are kept"
    ]


def test_a_latency_objective_gives_one_figure_everywhere(tmp_path: Path) -> None:
    """Minimizing p99 TTFT alone, 250 ms against the defaults' 369 ms: the verdict, best.json's gain,
    report.html and the dashboard note all say 32.2 % lower, and the interval is not called capacity. The
    "vs baseline" columns (and the note's best) show the metric's signed change, -32.2 %, as the verdict's
    "vs the defaults" does: a "+" there read as the latency going up."""
    latency = objectives_from_dict({"objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]})
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, bracketed(5000, 0.03, ttft_ms=369)),
            ({"max_num_seqs": 256}, bracketed(5000, 0.03, ttft_ms=250)),
        ],
        latency,
    )
    out = outcome(records(study), latency.names, [False], ["ttft_p99=2s"])
    assert "#1     250          -32.2%" in report.front_table(out)
    verdict = out.verdict()
    assert verdict.startswith("Recommended: trial #1: p99_ttft_ms 32.2 % lower (one run each) vs vLLM")
    assert "+47.6" not in verdict and "capacity brackets" not in verdict
    assert verdict.endswith("Trial #1 vs the defaults: p99_ttft_ms -32.2%.")
    report.write_all(tmp_path, out)
    best = json.loads((tmp_path / "best.json").read_text())
    assert round(best["gain_vs_baseline"], 4) == best["gain"]["reduction"] == 0.3225
    assert best["gain"]["reduction_interval"] == [0.3225, 0.3225] and best["gain"]["how"] == "one run each"
    html = (tmp_path / "report.html").read_text()
    assert "32.2 % lower" in html and "<td>-32.2%</td>" in html and "+32.2%" not in html
    note = note_markdown("unit", out)
    assert "-32.2% vs the baseline #0" in note and "32.2 % lower" in note and "47.6" not in note


def test_vs_baseline_is_the_signed_change_whichever_way_the_objective_points(tmp_path: Path) -> None:
    """A minimized throughput 20 % lower than the defaults' is -20.0 % in the column (it was +20.0 %, the
    gain in the objective's direction), and a maximized one 20 % higher is +20.0 % as before."""
    for direction, sign in (("minimize", "-"), ("maximize", "+")):
        objectives = objectives_from_dict(
            {"objectives": [{"metric": "output_throughput", "direction": direction}]}
        )
        throughput = 3200 if direction == "minimize" else 4800
        study = build_run(
            tmp_path / direction,
            [
                ({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20)),
                ({"max_num_seqs": 256}, ok(throughput, 1500, 20)),
            ],
            objectives,
        )
        out = outcome(records(study), objectives.names, [direction == "maximize"], ["ttft_p99=2s"])
        assert f"#1     {fmt_number(throughput)}              {sign}20.0%" in report.front_table(out)
        assert out.verdict().endswith(f"Trial #1 vs the defaults: output_throughput {sign}20.0%.")


def test_cost_view_and_sizing(tmp_path: Path) -> None:
    recs = records(three_trials(tmp_path))
    recs[0].gpu_seconds, recs[0].gpu_seconds_saved = 3600.0, 1800.0
    recs[1].gpu_seconds = 1800.0
    recs[2].gpu_seconds = 120.0  # a launched config that failed to start
    screened = TrialRecord(**{**recs[2].__dict__, "number": 3, "gpu_seconds": 0.0})
    screened.screened, screened.launched = True, False
    view = cost_view([*recs, screened], simulated=False)
    assert (view.spent_h, view.saved_abort_h) == (5520 / 3600, 0.5)
    assert view.saved_screen_h == 120 / 3600  # the median launched startup failure, per screened config
    assert view.text() == (
        "GPU time spent 1.53 GPU-h; saved about 0.50 h by early abort (1 trial) and "
        "0.03 h by screening (1 config not launched)."
    )
    best = recs[1]  # 10 req/s served (fixed load), 480 output tokens per request, TP 1
    size = sizing(best, target_rate=35.0, gpu_price=2.0)
    assert size is not None and (size.replicas, size.gpus, size.capacity_known) == (4, 4, False)
    # 4 GPUs x $2/h for 35 req/s x 480 tokens x 3600 s = 60.48 Mtok/h
    assert abs(size.usd_per_mtok - 8.0 / 60.48) < 1e-9
    assert "4 replicas at most (measured at a fixed load" in size.text()
    one = sizing(best, target_rate=5.0, gpu_price=2.0)  # "1 replicas ... x 1 GPU = 1 GPUs"
    assert one is not None and "5 req/s: 1 replica at most (measured" in one.text()
    assert " x 1 GPU = 1 GPU (one replica" in one.text()
    # a replica of TP 2 x PP 2 takes four GPUs: 16 for the same four replicas
    wide = TrialRecord(**{**best.__dict__, "config": {**best.config, "tensor_parallel_size": 2}})
    wide.config["pipeline_parallel_size"] = 2
    size = sizing(wide, target_rate=35.0, gpu_price=2.0)
    assert size is not None and (size.replicas, size.gpus) == (4, 16)
    assert abs(size.usd_per_mtok - 32.0 / 60.48) < 1e-9
    # kept up with 12 req/s offered: one replica serves at least that, though its 10 req/s of completions
    # over the run count the drain after the last arrival (it sized 35 req/s at 4 replicas, not 3)
    kept = SteadyState(12.0, 11.6, 0.0, 0.02, 0.0, kept_up=True)
    held = TrialRecord(**{**best.__dict__, "load": LoadReport(steady=kept)})
    size = sizing(held, target_rate=35.0)
    assert size is not None and (size.per_replica_rate, size.replicas) == (12.0, 3)
    behind = TrialRecord(
        **{**best.__dict__, "load": LoadReport(steady=dataclasses.replace(kept, kept_up=False))}
    )
    assert sizing(behind, target_rate=35.0).replicas == 4  # its completions, as before


def test_numbers_are_written_for_people() -> None:
    assert [fmt_number(v) for v in (12571.3, 95.81, 0.8234, None, 3)] == [
        "12,571",
        "95.8",
        "0.823",
        "",
        "3",
    ]


def test_capacity_probes_are_plotted_when_trials_carry_them(tmp_path: Path) -> None:
    from autotune.outputs.plots import plot_probes, top_probed

    recs = records(three_trials(tmp_path))
    out = outcome(recs, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert plot_probes(tmp_path / "probes.png", out) is None  # no probes recorded: no figure, no error
    probes = [
        {
            "rate": r,
            "served_rate": r,
            "p99_ttft_ms": t,
            "p99_itl_ms": 20.0,
            "meets_slos": t <= 2000,
            "kept_up": True,
        }
        for r, t in ((8.0, 300.0), (16.0, 900.0), (32.0, 4000.0), (22.6, 1800.0))
    ]
    out.best.capacity = capacity(22.6, tuple(ProbeSummary(**p) for p in probes))
    assert top_probed(out) == [out.best]
    path = plot_probes(tmp_path / "probes.png", out)
    assert path is not None and path.stat().st_size > 10_000
    report.write_all(tmp_path, out)
    assert "capacity probes" in (tmp_path / "report.html").read_text()


def test_a_run_with_nothing_measured_plots_without_an_empty_legend_warning(tmp_path: Path) -> None:
    from autotune.outputs.plots import plot_pairs

    recs = records(build_run(tmp_path, [({"max_num_seqs": 8, "baseline": True}, None)]))  # fails to start
    out = outcome(recs, OBJECTIVES.names, MAXIMIZE, [])  # no SLO: no limit line to label either
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found to put in legend"
        path = plot_pairs(tmp_path / "pareto.png", out)
    assert path.stat().st_size > 0


def test_capacity_probes_survive_the_study_storage(tmp_path: Path) -> None:
    probes = (ProbeSummary(rate=8.0, p99_ttft_ms=300.0, meets_slos=True, failure=None),)
    result = ok(4000, 1500, 20)
    result.capacity = capacity(8.0, probes)
    (record,) = records(build_run(tmp_path, [({"max_num_seqs": 64, "baseline": True}, result)]))
    assert record.capacity.probes == probes  # stored as a list of dicts, not its str(), and read back
    assert record.info["capacity_probes"][0]["p99_ttft_ms"] == 300.0


def test_trials_csv_writes_whole_number_columns_with_gaps_as_integers(tmp_path: Path) -> None:
    import csv

    from autotune.tune.study import tell_duplicate

    study = build_run(
        tmp_path,
        [({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20)), ({"max_num_seqs": 256}, None)],
    )
    tell_duplicate(study, study.ask(), study.trials[0])
    recs = records(study)
    recs[0].params = {"max_num_seqs": 1024}  # a param some trials lack (a conditional one)
    report.write_all(tmp_path, outcome(recs, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"]))
    with (tmp_path / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["duplicate_of"] for r in rows] == ["", "", "0"]  # not 0.0
    assert [r["max_num_seqs"] for r in rows] == ["1024", "", ""]
    assert rows[0]["output_throughput"] == "4000.0"  # a float column stays one


def test_the_fronts_count_of_trials_leaves_duplicates_out_on_both_sides(tmp_path: Path) -> None:
    from autotune.tune.study import tell_duplicate

    study = build_run(tmp_path, [({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20))])
    tell_duplicate(study, study.ask(), study.trials[0])
    table = report.front_table(outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"]))
    assert table.startswith("Feasible Pareto front (1 point; 1 of 1 trials feasible (1 duplicate left out)):")


def test_best_json_and_the_dashboard_note_speak_of_latencies_only_when_there_are_some(tmp_path: Path) -> None:
    """Throughput alone: no latency breaks ties or is told for a failed config; the default objectives'
    texts are unchanged."""
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, bracketed(5000, 0.03)),
        ({"max_num_seqs": 256}, bracketed(6000, 0.03)),
    ]

    def texts(run_dir: Path, objectives: ObjectiveSet) -> tuple[str, str]:
        study = build_run(run_dir, outcomes, objectives)
        maximize = [o.maximize for o in objectives.objectives]
        out = outcome(records(study), objectives.names, maximize, ["ttft_p99=2s"])
        report.write_all(run_dir, out)
        return json.loads((run_dir / "best.json").read_text())["how"], note_markdown("s", out)

    how, note = texts(tmp_path / "a", load_objectives("throughput"))
    assert how.startswith("highest feasible output_throughput on the Pareto front; vLLM's defaults are kept")
    assert "is told throughput 0, so it sits in the worst corner" in note and "latenc" not in how + note
    how, note = texts(tmp_path / "b", OBJECTIVES)
    assert how.startswith(
        "highest feasible output_throughput on the Pareto front (ties within the capacity resolution go to "
        "the lowest latencies together); vLLM's defaults are kept"
    )
    assert "is told throughput 0 and latencies 10% past the worst measured (or its SLO limit), so" in note
    latency = objectives_from_dict({"objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]})
    how, _ = texts(tmp_path / "c", latency)
    assert how.startswith("lowest feasible p99_ttft_ms on the Pareto front; vLLM's")


def test_a_fixed_load_report_leaves_out_the_capacity_columns_as_the_summary_does(tmp_path: Path) -> None:
    """No trial searched its capacity: the front in report.html has no empty "capacity (req/s)" and
    "limited by" columns, as the printed front has none (a capacity run's keep them: test_capacity_limits)."""
    out = outcome(records(three_trials(tmp_path)), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    report.write_all(tmp_path, out)
    html = (tmp_path / "report.html").read_text()
    front = html[html.index("<h2>Feasible Pareto front</h2>") : html.index("<h2>Failures")]
    assert "capacity (req/s)" not in front and "limited by" not in front
    assert "limited by" not in report.summary_text(out).splitlines()[1]


def test_a_guided_notes_best_so_far_is_the_highest_measured_and_its_table_lists_the_defaults(
    tmp_path: Path,
) -> None:
    """The guide's pick #0 measured 4,828, vLLM's defaults #1 4,757: a tie, the defaults kept. The note's
    "best feasible so far" is #0 (the progress line's), not the kept defaults, and its guided table
    (guide.json's rows) lists the defaults too with guide.json's prediction of them (they are not the
    guide's pick, but it measured them)."""
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 512}, bracketed(4828, 0.028, ttft_ms=401, itl_ms=125)),
            ({"max_num_seqs": 1024, "baseline": True}, bracketed(4757, 0.028, ttft_ms=369, itl_ms=175)),
        ],
    )
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert out.decision.keeps_defaults and out.best.number == 1
    rows = [
        {"trial": 0, "predicted": 4828.4, "measured": 4828.0, "by": "best predicted"},
        {"trial": 1, "predicted": 4722.5, "measured": 4757.0, "by": "vLLM's defaults"},
    ]
    note = note_markdown("g", out, {"gpu_hours": 0.23, "trials": rows})
    assert "**Best feasible so far:** trial #0, output_throughput 4,828 (+1.5% vs the baseline #1)" in note
    assert "| #0 | best predicted | 4,828.4 | 4,828.0 |" in note
    assert "| #1 | vLLM's defaults | 4,722.5 | 4,757.0 |" in note


def test_the_failures_line_counts_the_benchmarks_early_abort_stopped(tmp_path: Path) -> None:
    """No config failed, but early abort stopped one benchmark once it had certainly missed the SLO:
    report.html says so, as the summary counts it, not that every config finished its benchmark."""
    aborted = ok(4000, 2500, 20)  # over ttft_p99=2s
    aborted.saved_s = 30.0
    trials = [({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20)), ({"max_num_seqs": 8}, aborted)]
    study = build_run(tmp_path, trials)
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    html = report_html.write_html(tmp_path / "report.html", out).read_text()
    assert "<h2>Failures</h2><p>None: every config started; early abort stopped 1 benchmark once" in html
    assert "finished its benchmark" not in html
    assert "by early abort (1 trial)" in out.cost.text()  # the run summary's line


def test_a_duplicate_ran_nowhere_so_trials_csv_gives_it_no_placement(tmp_path: Path) -> None:
    """A duplicate is told an earlier trial's result without launching anything: it copies that trial's
    measurements, not the node and devices the earlier trial ran on."""
    import csv

    from autotune.measure.placement import Placement
    from autotune.tune.result_attrs import placement_attrs
    from autotune.tune.study import config_key, tell_duplicate, tell_result

    measured = ok(4000, 1500, 20)
    measured.placement = Placement("ab12", "10.0.0.5", (0, 1), ran_at=(1.0, 2.0))
    study = build_run(tmp_path, [])
    trial = study.ask()
    for name, value in placement_attrs(measured.placement).items():  # as the tuner records it
        trial.set_user_attr(name, value)
    tell_result(study, trial, measured, OBJECTIVES, SLOS, config_key(measured.config))
    tell_duplicate(study, study.ask(), study.trials[0])
    recs = records(study)
    assert recs[0].placement is not None and recs[1].placement is None
    assert "ran_at" not in recs[1].info  # nor when the earlier trial ran
    report.write_all(tmp_path, outcome(recs, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"]))
    with (tmp_path / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["node_ip"], r["gpu_ids"]) for r in rows] == [("10.0.0.5", "0,1"), ("", "")]


def test_results_written_again_are_one_runs_set_never_two_runs_mixed(tmp_path: Path) -> None:
    """A resume whose report.html could not be written (a folder of that name) left trials.csv and
    pareto.csv of 8 trials beside best.json and best.sh of 6; a later set without a recommendation left
    the earlier best.sh. Now the earlier set goes first, and a blocked name stops the write untouched."""
    folder = tmp_path / "run"
    best = outcome(records(three_trials(folder)), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    report.write_all(folder, best)
    assert (folder / "best.sh").exists()
    failed = records(build_run(tmp_path / "other", [({"max_num_seqs": 8, "baseline": True}, None)]))
    report.write_all(folder, outcome(failed, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"]))
    assert not (folder / "best.sh").exists() and (folder / "trials.csv").read_text().count("\n") == 2
    report.write_all(folder, best)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.suffix != ".db"}
    (folder / "report.html").unlink()
    (folder / "report.html").mkdir()
    with pytest.raises(IsADirectoryError):
        report.write_all(folder, outcome(failed, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"]))
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.suffix != ".db"}
    assert after == {name: data for name, data in before.items() if name != "report.html"}
