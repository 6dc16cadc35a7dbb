"""Re-measuring the top configs (tune/remeasure.py): which ones (the recommendation's pick, the runner-up
by throughput, the baseline), in what order under a budget, runs far apart flagged as sensitive to
noise, and nothing re-measured when nothing was measured."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from test_recommendation import MAXIMIZE, capacity
from test_study import OBJECTIVES, build_run

from autotune.tune.recommendation import decide
from autotune.tune.study import records


def test_the_config_the_recommendation_picks_is_re_measured(tmp_path: Path) -> None:
    """Ties on throughput go to the lowest latencies: that pick can be 4th by throughput, and it is the
    one whose gain needs repeats."""
    from autotune.tune.remeasure import TOP_CANDIDATES, targets

    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, capacity(4000, 0.03)),
            ({"max_num_seqs": 512}, capacity(5100, 0.03, ttft_ms=1900, itl_ms=90)),
            ({"max_num_seqs": 256}, capacity(5090, 0.03, ttft_ms=1800, itl_ms=80)),
            ({"max_num_seqs": 128}, capacity(5080, 0.03, ttft_ms=1700, itl_ms=70)),
            ({"max_num_seqs": 64}, capacity(5070, 0.03, ttft_ms=500, itl_ms=10)),
        ],
    )
    recs = records(study)
    pick = decide(recs, MAXIMIZE, OBJECTIVES.names).candidate
    assert pick is not None and pick.number == 4  # the lowest latencies among the tied
    chosen = [r.number for r in targets(recs, MAXIMIZE)]
    assert chosen[0] == 4 and len(chosen) == TOP_CANDIDATES + 1 and chosen[-1] == 0  # and the baseline


def test_the_runner_up_by_throughput_is_re_measured_even_off_the_pareto_front(tmp_path: Path) -> None:
    """Trial 2 measured 1 % below trial 1 with higher latencies (dominated), trial 3 far below with the
    lowest: the runner-up by throughput is the one that may truly be best, so it is re-measured."""
    from autotune.tune.remeasure import targets

    study = build_run(
        tmp_path,
        [
            ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
            ({"max_num_seqs": 512}, capacity(5600, 0.03, ttft_ms=900, itl_ms=20)),
            ({"max_num_seqs": 256}, capacity(5550, 0.03, ttft_ms=1500, itl_ms=60)),
            ({"max_num_seqs": 32}, capacity(4000, 0.03, ttft_ms=200, itl_ms=5)),
        ],
    )
    assert [r.number for r in targets(records(study), MAXIMIZE)] == [1, 2, 0]


def test_repeats_run_round_by_round_the_pick_and_baseline_first(tmp_path: Path) -> None:
    """A budget that stops the repeats early still leaves the gain a paired run and every candidate as
    many repeats as it affords."""
    from autotune.tune.remeasure import plan

    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(5000, 0.03)),
        ({"max_num_seqs": 256}, capacity(5600, 0.03)),
        ({"max_num_seqs": 128}, capacity(5500, 0.03)),
    ]
    recs = {r.number: r for r in records(build_run(tmp_path, outcomes))}
    chosen = [recs[1], recs[2], recs[0]]  # as remeasure.targets orders them: the baseline last
    order = [(r.trial.number, r.index) for r in plan(chosen, 2)]
    assert order == [(1, 1), (0, 1), (2, 1), (1, 2), (0, 2), (2, 2)]


def test_runs_of_the_pick_far_apart_are_flagged_as_sensitive_to_noise(tmp_path: Path) -> None:
    """The pick's three runs 24 % apart (a capacity near a flat p99 ITL SLO): the summary and the report's
    flags say so; the same config measured 2 % apart is not flagged."""
    from autotune.outputs.outcome import outcome
    from autotune.outputs.report import summary_text
    from autotune.tune.remeasure import StoredRepeats

    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(4000, 0.03)),
        ({"max_num_seqs": 256}, capacity(5300, 0.03)),
    ]
    recs = records(build_run(tmp_path, outcomes))

    def flagged(repeats: dict) -> str:
        out = outcome(recs, OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"], repeats=StoredRepeats(repeats))
        assert out.best is not None and out.best.number == 1
        note = out.spread_note()
        assert (note in out.flags()) if note else all("Sensitive" not in f for f in out.flags())
        assert ("Sensitive to noise" in summary_text(out)) == bool(note)
        return note

    note = flagged({"1": {"1": 4600, "2": 5700}, "0": {"1": 4050, "2": 3990}})
    assert "Sensitive to noise: trial #1's 3 runs measured 4,600 to 5,700 (24% apart)" in note
    assert "#0" not in note  # the defaults' runs agree within 2 %
    assert flagged({"1": {"1": 5250, "2": 5350}, "0": {"1": 4050, "2": 3990}}) == ""


def test_a_run_that_measured_nothing_says_so_and_re_measures_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget below one trial's cost launches nothing: there is nothing to recommend nor to repeat
    (no "re-measuring the top 3" line), and the verdict does not blame failed trials that never ran."""
    from autotune.tune.remeasure import remeasure
    from autotune.tune.run_records import TunerOptions

    study = build_run(tmp_path, [])
    assert (
        decide(records(study), MAXIMIZE, OBJECTIVES.names).text == "No trial finished: nothing to recommend."
    )
    assert remeasure(study, None, OBJECTIVES, TunerOptions(n_trials=1, repeats=2), budget_s=36.0) == 0  # type: ignore[arg-type]
    assert "re-measuring" not in capsys.readouterr().err


# A `--serve-cmd` wrapper: the sim-server, except that the launch numbered FAIL_AT exits before serving
# (as a container the engine lost, or a server that crashed, does): that repeat measures nothing.
FAILING_SERVER = """
import pathlib, sys
from autotune.cli import main
counter = pathlib.Path(sys.argv.pop(1))
launch = int(counter.read_text() or 0) + 1 if counter.exists() else 1
counter.write_text(str(launch))
if launch == int(sys.argv.pop(1)):
    sys.exit("NotFound: 404 Client Error: the server went away")
sys.exit(main(["sim-server", *sys.argv[1:]]))
"""


def test_a_failed_repeat_is_left_out_of_the_means_and_the_report_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The defaults' second repeat fails (its server exits at start): it was read as a 0 run, so their
    mean fell and the paired gain read "+inf %". Now it is kept out of the means and the pairs, a
    resumed run does not run it again, and the summary names it with its reason."""
    from test_backend_process import WORKLOAD
    from test_study import SLOS, ok

    from autotune.backends.process import ProcessBackend
    from autotune.dispatch.local import LocalExecutor
    from autotune.outputs.outcome import outcome
    from autotune.outputs.report import summary_text
    from autotune.tune.remeasure import StoredRepeats, remeasure
    from autotune.tune.run_records import TunerOptions

    # First runs near what the repeats measure (about 1,190 tok/s): trial 1 is the pick by its mean.
    outcomes = [
        ({"max_num_seqs": 1024, "max_model_len": 4096, "baseline": True}, ok(1190, 1500, 20)),
        ({"max_num_seqs": 256, "max_model_len": 4096}, ok(1300, 1500, 20)),
    ]
    study = build_run(tmp_path, outcomes)
    # Launch order: trial 1's repeat 1, the defaults' 1, trial 1's 2, the defaults' 2 (remeasure.plan).
    serve = (sys.executable, "-c", FAILING_SERVER, str(tmp_path / "launches"), "4")
    backend = ProcessBackend("H100", serve_cmd=serve, startup_timeout_s=60, benchmark_timeout_s=60)
    executor = LocalExecutor(backend, WORKLOAD, SLOS)
    options = TunerOptions(n_trials=2, repeats=2)
    assert remeasure(study, executor, OBJECTIVES, options) == 4  # type: ignore[arg-type]
    assert "a repeat of trial #0 failed (" in capsys.readouterr().err

    stored = StoredRepeats.of(study)
    assert sorted(stored.values["1"]) == ["1", "2"] and sorted(stored.values["0"]) == ["1"]
    assert list(stored.failed) == ["0"] and "the server went away" in stored.failed["0"]["2"]
    assert remeasure(study, executor, OBJECTIVES, options) == 0  # type: ignore[arg-type]
    out = outcome(records(study), OBJECTIVES.names, MAXIMIZE, ["ttft_p99=2s"], repeats=stored)
    gain = out.decision.gain
    assert gain is not None and gain.how == "2 paired runs" and math.isfinite(gain.high)
    assert [len(runs) for _, runs in out.remeasured()] in ([3, 2], [2, 3])
    summary = summary_text(out)
    assert "inf" not in summary
    assert "Re-measurement failed: trial #0 (the defaults) repeat 2 (" in summary


def test_a_run_of_the_defaults_stored_as_0_gives_no_infinite_gain(tmp_path: Path) -> None:
    """A study re-measured by an older autotune kept a failed repeat as 0: that pair has no ratio (it
    read "+inf %"), the others still give the gain its interval."""
    outcomes = [
        ({"max_num_seqs": 1024, "baseline": True}, capacity(4000, 0.03)),
        ({"max_num_seqs": 256}, capacity(4400, 0.03)),
    ]
    recs = records(build_run(tmp_path, outcomes))
    runs = {"1": {"1": 4450.0, "2": 4380.0}, "0": {"1": 4020.0, "2": 0.0}}
    gain = decide(recs, MAXIMIZE, OBJECTIVES.names, runs).gain
    assert gain is not None and gain.how == "2 paired runs"
    assert gain.high == pytest.approx(4450 / 4020) and math.isfinite(gain.ratio)
