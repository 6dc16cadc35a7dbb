"""A guided run stopped before its end and resumed: what a run ended by --n-trials or Ctrl-C writes, what
a resume rebuilds from the study, refuses (a resume unguided or without its budget) and counts against
the budget (the trials spent, one cut short)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import guided_runs
import optuna
import pytest
from cli import autotune
from guided_runs import guided_run, space_folder, study_of, with_tables
from study_db import counted_trials

# The shared fixtures, bound here for pytest to find (each test file runs its own module-scoped ones).
bare, folder, unbudgeted = guided_runs.bare, guided_runs.folder, guided_runs.unbudgeted


@pytest.fixture(scope="module")
def two_trials(tmp_path_factory: pytest.TempPathFactory, unbudgeted: tuple[Path, str]) -> Path:
    """A guided run stopped at two trials, for the tests that resume it (each on a copy), with its
    summary in summary.txt."""
    folder = with_tables(space_folder(tmp_path_factory.mktemp("two-trials")), unbudgeted)
    (folder / "summary.txt").write_text(guided_run(folder, "--n-trials", "2").stdout)
    return folder


def resumable(two_trials: Path, tmp_path: Path) -> Path:
    """A copy of the two-trial run's folder, to resume."""
    shutil.copytree(two_trials, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_a_guided_run_ended_by_n_trials_says_so_and_lists_every_file_it_wrote(two_trials: Path) -> None:
    """guide.json's stop_reason is what the summary says (it was null), and the closing "Results:"
    line names the guide's files too."""
    guide = json.loads((two_trials / "runs/g/guide.json").read_text())
    assert guide["stop_reason"] == "--n-trials reached"  # it said "stopped: n-trials"
    results = (two_trials / "summary.txt").read_text().splitlines()[-1]
    assert results.startswith("Results: runs/g/ (") and "report.html" in results
    assert all(f", {name}" in results for name in ("guide.json", "guide.png", "calibration.yaml"))


def test_resume_rebuilds_the_guide_from_the_study_and_measures_nothing_twice(
    two_trials: Path, tmp_path: Path
) -> None:
    folder = resumable(two_trials, tmp_path)
    guided_run(folder, "--n-trials", "4", "--resume")
    trials = [t for t in study_of(folder).trials if t.user_attrs.get("launched", True)]
    keys = [t.user_attrs["config_key"] for t in trials]
    assert len(keys) == len(set(keys)) >= 2


def test_ctrl_c_writes_the_guides_files_with_the_other_results(folder: Path) -> None:
    """An interrupted guided run writes guide.json and calibration.yaml beside best.json and report.html
    (the README lists them among a guided run's results; best.json quotes guide.json)."""
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--parallel", "1"]
    args += ["--sim-calibration", "reality.yaml", "--noise", "0.02", "--repeats", "2", "--study", "g"]
    command = [sys.executable, "-m", "autotune.cli", *args, "--guide-top", "0", "--n-trials", "20"]
    proc = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # two finished: the guide picked the second from the first, so it holds a measurement to write
    # (one finished may not be observed yet when the signal lands)
    db, deadline = folder / "runs/g/study.db", time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and counted_trials(db, "g")[0] < 2:
        time.sleep(0.3)
    assert proc.poll() is None and counted_trials(db, "g")[0] >= 2, "the run ended or measured too little"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    run = folder / "runs/g"
    guide = json.loads((run / "guide.json").read_text())
    assert guide["stop_reason"] == "interrupted" and guide["trials"]
    assert "speed constants scaled by the" in (run / "calibration.yaml").read_text()
    assert json.loads((run / "best.json").read_text())["guide"]["stop_reason"] == "interrupted"


def test_a_resumed_runs_estimate_counts_only_the_trials_left(two_trials: Path, tmp_path: Path) -> None:
    """The pre-run estimate (a guided budget's first charge) of a resumed run leaves out what the study
    holds: one trial of three is left, then none."""
    folder = resumable(two_trials, tmp_path)
    one = guided_run(folder, "--n-trials", "3", "--gpu-hours", "5", "--resume").stderr
    assert re.search(r"estimate: about [\d.]+ GPU-hours for 1 trial:", one), one
    none = guided_run(folder, "--n-trials", "3", "--gpu-hours", "5", "--resume").stderr
    assert "autotune: estimate: nothing left to run" in none


def test_a_guided_study_is_resumed_guided_with_its_budget(two_trials: Path, tmp_path: Path) -> None:
    """A resume that drops --guide sim (or, once given, --gpu-hours) is refused in one line: it ran
    unguided trials past the budget, and the results kept the interrupted guide's verdict."""
    folder = resumable(two_trials, tmp_path)
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--sim-calibration", "reality.yaml"]
    args += ["--noise", "0.02", "--repeats", "0", "--study", "g", "--n-trials", "4", "--resume"]
    unguided = autotune(folder, *args, check=False)
    assert unguided.returncode == 2, unguided.stderr
    assert unguided.stderr.strip() == "autotune run: error: study 'g' was run with --guide sim: pass it again"
    guided_run(folder, "--n-trials", "3", "--gpu-hours", "5", "--resume")
    no_budget = guided_run(folder, "--n-trials", "4", "--resume", check=False)
    for out in (no_budget, autotune(folder, *args, "--guide", "none", check=False)):
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "was run with --guide sim --gpu-hours 5: pass them again (a larger" in out.stderr
    assert counted_trials(folder / "runs/g/study.db", "g")[0] == 3


def test_a_resume_with_less_budget_than_the_study_spent_stops_by_the_budget(
    two_trials: Path, tmp_path: Path
) -> None:
    """The guide's budget line counts what the study spent (it said "at most N trials" of the whole
    budget), and the budget is why the run stops (it was the guide's stop rule)."""
    folder = resumable(two_trials, tmp_path)
    out = guided_run(folder, "--n-trials", "6", "--gpu-hours", "0.1", "--resume")
    assert (
        "guide: budget 0.1 GPU-h (0.00 GPU-h left after what the study spent) affords no trial" in out.stderr
    )
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    assert re.fullmatch(
        r"budget: 0\.\d\d GPU-h spent of --gpu-hours 0\.1, nothing left for a trial", guide["stop_reason"]
    )
    assert (
        json.loads((folder / "runs/g/best.json").read_text())["guide"]["stop_reason"] == guide["stop_reason"]
    )
    assert counted_trials(folder / "runs/g/study.db", "g")[0] == 2


def test_a_resume_interrupted_before_its_guide_says_so_in_the_guides_files(
    two_trials: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a resumed run predicts the space (before its guide exists): guide.json and best.json
    say this run was interrupted, at its budget (they kept the earlier run's stop and budget)."""
    import autotune.commands.run_guide as run_guide
    from autotune.cli import main

    folder = resumable(two_trials, tmp_path)
    assert not json.loads((folder / "runs/g/guide.json").read_text())["stop_reason"].startswith("interr")

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_guide, "make_guided", interrupt)
    monkeypatch.chdir(folder)
    args = ["run", "--space", "space.yaml", "--slo", "ttft_p99=2s", "--guide", "sim", "--parallel", "1"]
    args += ["--sim-calibration", "reality.yaml", "--noise", "0.02", "--repeats", "0", "--study", "g"]
    assert main([*args, "--n-trials", "4", "--gpu-hours", "5", "--resume"]) == 130
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    assert (guide["stop_reason"], guide["budget_gpu_hours"]) == ("interrupted", 5.0)
    assert json.loads((folder / "runs/g/best.json").read_text())["guide"]["stop_reason"] == "interrupted"
    assert len(guide["trials"]) == 2


def test_a_trial_cut_short_counts_against_the_budget_on_resume(two_trials: Path, tmp_path: Path) -> None:
    """A trial that Ctrl-C stopped on a real backend stores the GPU time it held (tune/tuner.py; the
    process backend's case: tests/test_hostile_faults.py). The resumed guided run counts it as spent and
    lists it as measuring nothing: here its half GPU-hour leaves no room for another trial."""
    folder = resumable(two_trials, tmp_path)
    study = study_of(folder)
    spent = sum(t.user_attrs["gpu_seconds"] for t in study.trials) / 3600
    assert 0.1 < spent < 0.4  # two trials of ~0.14 GPU-h: 0.9 would afford a third without the cut one
    first = study.trials[0]
    cut = optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL,
        params={"max_num_seqs": 32, "max_num_batched_tokens": 2048},
        distributions=first.distributions,
        user_attrs={"failure": "interrupted", "gpu_seconds": 1800.0},
    )
    study.add_trial(cut)
    out = guided_run(folder, "--n-trials", "4", "--gpu-hours", "0.9", "--resume")
    guide = json.loads((folder / "runs/g/guide.json").read_text())
    assert guide["stop_reason"].startswith("budget"), guide["stop_reason"]
    assert len(study_of(folder).get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2
    rows = [r for r in guide["trials"] if r.get("interrupted")]
    assert [(r["trial"], r["gpu_hours"], r["measured"]) for r in rows] == [(2, 0.5, None)]
    assert guide["gpu_hours"] == pytest.approx(spent + 0.5, abs=1e-3)
    assert "#2: predicted" in out.stderr and "nothing (interrupted)" in out.stderr
