"""The progress line's "best" and the final verdict agree, and where they cannot (the tie rule gives
another trial, re-measurements change the gain) the summary says why in one line.

The case from the issue: an ITL-bound run whose progress line showed "best 986 tok/s (+4.9 %)" for
minutes, then a verdict naming another trial at +1.0 % and keeping the defaults, with nothing saying why.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
from test_study import OBJECTIVES, build_run, ok

from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.capacity_report import CapacityReport
from autotune.measure.result import TrialResult
from autotune.outputs import report
from autotune.outputs.dashboard import note_markdown
from autotune.outputs.outcome import outcome
from autotune.tune.objectives import objectives_from_dict
from autotune.tune.progress import ProgressState, render
from autotune.tune.remeasure import StoredRepeats
from autotune.tune.study import records
from autotune.tune.tally import Tally

MAXIMIZE = [o.maximize for o in OBJECTIVES.objectives]


def searched(throughput: float, ttft_ms: float, itl_ms: float, resolution: float) -> TrialResult:
    """A capacity trial whose value is known to within `resolution` (its bracket's width)."""
    result = ok(throughput, ttft_ms, itl_ms)
    rate = throughput / 250
    result.capacity = CapacityReport(
        rate=rate,
        kept_up=True,
        bracket=(rate, rate * (1 + resolution)),
        resolution=resolution,
        bound_measured=True,
        saturation_throughput=None,
        goodput=None,
    )
    return result


def progress_line(study) -> str:  # noqa: ANN001
    """The line `autotune run` showed once every trial was told."""
    tally = Tally(maximize=True)
    for trial in study.trials:
        tally.record(trial)
    state = ProgressState(done=tally.done, total=3, feasible=tally.feasible, best=tally.best)
    state.baseline = tally.baseline
    return render(state, bar=False)


def test_a_tie_rule_verdict_says_why_it_is_not_the_progress_lines_best(tmp_path: Path) -> None:
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, searched(940, 500, 40, 0.03)),
            ({"max_num_seqs": 512}, searched(986, 900, 48, 0.01)),  # the highest value measured
            ({"max_num_seqs": 256}, searched(950, 450, 35, 0.04)),  # its bracket reaches 986
        ],
    )
    assert "best 986 tok/s (+4.9% vs baseline)" in progress_line(study)
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert out.decision.candidate.number == 2 and out.decision.keeps_defaults
    summary = report.summary_text(out).splitlines()
    verdict = next(i for i, line in enumerate(summary) if line.startswith("Keep vLLM's defaults"))
    # the next line, right under the verdict: which trial the progress line showed, and why not it
    assert summary[verdict + 1] == (
        "  The progress line's best, trial #1 (986 output_throughput, +4.9% vs the defaults), ties with "
        "trial #2: #2's capacity bracket, 4.0%, reaches it, and a tie goes to the lowest latencies, #2's."
    )


def test_no_note_when_the_kept_defaults_are_the_progress_lines_best(tmp_path: Path) -> None:
    """The defaults measured highest and a lower-latency config ties with them: the verdict keeps the
    defaults, the trial the progress line showed, so there is nothing to reconcile."""
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, searched(986, 900, 48, 0.03)),
            ({"max_num_seqs": 256}, searched(960, 450, 35, 0.04)),
        ],
    )
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert out.decision.keeps_defaults and out.decision.candidate.number == 1
    assert out.highest().number == 0 and out.progress_note() == ""
    assert "progress line" not in report.summary_text(out)


def test_a_re_measured_gain_says_the_progress_line_showed_a_first_measurement(tmp_path: Path) -> None:
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, searched(940, 500, 40, 0.01)),
            ({"max_num_seqs": 512}, searched(986, 450, 35, 0.01)),
        ],
    )
    assert "best 986 tok/s (+4.9% vs baseline)" in progress_line(study)
    repeats = {"0": {"1": 1000.0, "2": 990.0}, "1": {"1": 1005.0, "2": 995.0}}  # +0.5 % each
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"], repeats=StoredRepeats(repeats))
    assert out.decision.keeps_defaults
    note = out.progress_note()
    assert note.startswith(
        "The progress line's best, trial #1 (986 output_throughput, +4.9% vs the defaults)"
    )
    assert "3 paired runs" in note and out.decision.gain.percent() in note
    assert note in report.summary_text(out)


def test_a_pick_by_the_mean_of_repeats_says_so_and_shows_the_runs(tmp_path: Path) -> None:
    """The case from the issue (--noise): #1 measured highest once, #2 has the higher latencies and won
    on the mean of its 3 runs. The verdict says the means decided (not "the lowest-latency near-tie"),
    labels the single-run figures as such, and best.json, trials.csv and report.html show the runs."""
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, searched(4537, 381, 189, 0.028)),
            ({"max_num_seqs": 152}, searched(4630, 252, 94, 0.028)),
            ({"max_num_seqs": 792}, searched(4605, 480, 81, 0.028)),
        ],
    )
    repeats = {
        "1": {"1": 4449.0, "2": 4131.0},
        "0": {"1": 4845.0, "2": 4561.0},
        "2": {"1": 4652.0, "2": 4748.0},
    }
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"], repeats=StoredRepeats(repeats))
    verdict, note = out.verdict(), out.progress_note()
    assert out.decision.keeps_defaults and out.decision.candidate.number == 2
    assert "Mean output_throughput of 3 runs each: #2 4,668, #0 (the defaults) 4,648, #1 4,403." in verdict
    assert "The best config by the mean of its runs (trial #2) differs by +0.5 %" in verdict
    assert "near-tie" not in verdict and "Trial #2 vs the defaults in their first runs:" in verdict
    assert note.endswith("was its first run; the mean of its 3 runs, 4,403, is below trial #2's, 4,668.")
    assert "lowest latencies" not in note
    report.write_all(tmp_path / "out", out)
    best = json.loads((tmp_path / "out" / "best.json").read_text())
    assert best["remeasured"]["trials"]["2"] == {"runs": [4605.0, 4652.0, 4748.0], "mean": 4668.333333333333}
    rows = {r["trial"]: r for r in csv.DictReader((tmp_path / "out" / "trials.csv").open())}
    assert (rows["1"]["remeasured_runs"], rows["1"]["remeasured_mean"][:7]) == ("3", "4403.33")
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Re-measured</h2>" in html and "<td>4,605, 4,652, 4,748</td><td>4,668</td>" in html


def test_nothing_is_added_when_they_agree(tmp_path: Path) -> None:
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, searched(940, 500, 40, 0.01)),
            ({"max_num_seqs": 512}, searched(1200, 450, 35, 0.01)),
        ],
    )
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    assert out.decision.trial.number == 1 and out.progress_note() == ""


def test_a_switch_the_budget_left_unconfirmed_says_it_rests_on_one_run_of_each(tmp_path: Path) -> None:
    """A run that meant to re-measure its pick and the defaults (a noisy backend) and had no budget left
    for it: a recommended switch by +5.3 % says that its gain rests on single searches; once
    re-measured, in a run that planned no repeats, or for a gain beyond one search's spread (+28 %),
    nothing is added."""
    base = ({"max_num_seqs": 1024, "baseline": True}, searched(940, 500, 40, 0.01))
    study = build_run(tmp_path / "a", [base, ({"max_num_seqs": 512}, searched(990, 450, 35, 0.01))])
    recs, args = records(study), (OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"])
    out = outcome(recs, *args, repeats=StoredRepeats(planned=(1, 0)))
    note = out.once_note()
    assert not out.decision.keeps_defaults
    assert note.startswith("Measured once: trial #1 and trial #0 (the defaults) could not be re-measured")
    assert note in report.summary_text(out) and note in out.flags()
    assert note in note_markdown("s", out)  # the dashboard's note says it too
    repeated = {"0": {"1": 950.0}, "1": {"1": 1000.0}}
    assert outcome(recs, *args, repeats=StoredRepeats(repeated, planned=(1, 0))).once_note() == ""
    assert outcome(recs, *args).once_note() == ""
    far = build_run(tmp_path / "b", [base, ({"max_num_seqs": 512}, searched(1200, 450, 35, 0.01))])
    assert outcome(records(far), *args, repeats=StoredRepeats(planned=(1, 0))).once_note() == ""


def test_a_minimized_objectives_progress_line_and_note_both_read_its_reduction(tmp_path: Path) -> None:
    """p99 TTFT alone, 400 ms -> 300 ms: the progress line and the verdict's note on it both say "25.0%
    lower", as the verdict does, not -25.0 % in one and +25.0 % in the other."""
    latency = objectives_from_dict({"objectives": [{"metric": "p99_ttft_ms", "direction": "minimize"}]})
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, searched(940, 400, 40, 0.01)),
            ({"max_num_seqs": 512}, searched(940, 300, 40, 0.01)),
        ],
        latency,
    )
    tally = Tally(maximize=False)
    for trial in study.trials:
        tally.record(trial)
    line = render(tally.state(2, guided=False, unit="ms"), bar=False)
    assert "best 300 ms (25.0% lower than baseline)" in line
    repeats = {"1": {"1": 320.0, "2": 280.0}, "0": {"1": 400.0, "2": 400.0}}
    out = outcome(records(study), latency.names, [False], ["ttft_p99=2s"], repeats=StoredRepeats(repeats))
    assert out.progress_note().startswith(
        "The progress line's best, trial #1 (300 p99_ttft_ms, 25.0% lower than the defaults), was its first "
        "measurement; with the re-measurements (3 paired runs) its gain is 25.0 % lower"
    )


def test_a_tie_the_progress_note_explains_names_the_objective_that_broke_it(tmp_path: Path) -> None:
    """p99 TTFT first, output throughput breaking its ties: the tie goes to the higher throughput, not
    "the lowest latencies"."""
    objectives = objectives_from_dict(
        {
            "objectives": [
                {"metric": "p99_ttft_ms", "direction": "minimize"},
                {"metric": "output_throughput", "direction": "maximize"},
            ]
        }
    )
    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, searched(3000, 1500, 40, 0.0)),
            ({"max_num_seqs": 512}, searched(4000, 900, 40, 0.0)),  # the lowest TTFT measured
            ({"max_num_seqs": 256}, searched(5000, 905, 40, 0.0)),  # within 1 % of it, more throughput
        ],
        objectives,
    )
    out = outcome(records(study), objectives.names, [False, True], ["ttft_p99=2s"])
    assert out.decision.candidate.number == 2
    assert out.progress_note() == (
        "The progress line's best, trial #1 (900 p99_ttft_ms, 40.0% lower than the defaults), ties with "
        "trial #2: they are within 1%, and a tie goes to the best output_throughput, #2's."
    )


def test_a_crashed_trial_reads_as_crashed_not_as_one_that_did_not_keep_up() -> None:
    """A server that died mid-load served less than it was offered: the crash is the cause, and the
    progress line says so; a trial that ran to the end behind its load still reads "did not keep up"."""
    behind = {"info": {"offered_rate": 14.5, "served_rate": 2.9, "kept_up": False}}
    for attrs, said in (({**behind, "failure": "crashed"}, "crashed"), (behind, "did not keep up")):
        tally = Tally(maximize=True)
        tally.record(optuna.trial.create_trial(values=[100.0, 9000.0, 900.0], user_attrs=attrs))
        assert tally.last.split(" ", 1)[1].startswith(said)
    assert tally.last.endswith("did not keep up (served 2.9 of 14.5 req/s)")


def test_nothing_is_re_measured_when_nothing_met_the_slos_nor_a_baseline_that_failed(tmp_path: Path) -> None:
    """Repeats of a crashed or unstartable config fail the same way (on a GPU: up to a startup timeout
    each); with no config that met the SLOs there is no gain to measure."""
    from autotune.tune.remeasure import targets

    crashed = TrialResult(config=EngineConfig(model="m"), failure=FailureKind.CRASHED, message="exit 3")
    crashed.benchmark = ok(100, 9000, 900).benchmark
    base = ({"max_num_seqs": 1024, "baseline": True}, crashed)
    failed = build_run(tmp_path / "a", [base, ({"max_num_seqs": 512}, None)])
    assert records(failed)[0].values and targets(records(failed), MAXIMIZE) == []
    one = build_run(tmp_path / "b", [base, ({"max_num_seqs": 512}, ok(990, 450, 35))])
    assert [r.number for r in targets(records(one), MAXIMIZE)] == [1]
