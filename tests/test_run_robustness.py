"""Faults around a real `autotune run` (subprocesses on one SQLite file): SIGTERM, a second driver,
a lost or corrupted study.db, a locked database mid-run, a moved run folder. Nothing finished is lost,
and each ends in one line that says how to continue."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from study_db import counted_trials

from autotune.cli import main

ENV = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
RAY_NOTICE = "Token authentication is enabled"  # Ray's own line at ray.init, not autotune's


TINY = "num_requests: 8\nload: fixed\nprompt_len: 64\noutput_len: 8\n"  # a trial takes milliseconds


def _cmd(runs: Path, study: str, n_trials: int, *extra: str, tiny: bool = True) -> list[str]:
    """The run's command (`tiny`: a workload whose trials take milliseconds; else the default chat
    workload at capacity, a second or two a trial)."""
    workload = runs / "tiny.yaml"
    workload.write_text(TINY)
    cmd = [sys.executable, "-m", "autotune.cli", "run", "--space", "small"]
    cmd += ["--workload", str(workload)] if tiny else []
    return [*cmd, "--runs-dir", str(runs), "--study", study, "--n-trials", str(n_trials), "--quiet", *extra]


def _start(runs: Path, study: str, at_least: int, session: bool = False) -> subprocess.Popen[str]:
    """A long run in the background (`session`: in a process group of its own, with trials long enough
    that one is always running), returned once `at_least` trials are COMPLETE."""
    proc = subprocess.Popen(
        _cmd(runs, study, 100_000, tiny=not session),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=session,
    )
    db, deadline = runs / study / "study.db", time.monotonic() + 120
    while counted_trials(db, study)[0] < at_least and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
    assert proc.poll() is None, proc.communicate()[1]
    return proc


def _lines(err: str) -> list[str]:
    """The error lines (not Ray's notice, nor the run's announcements)."""
    return [
        line
        for line in err.splitlines()
        if line.strip() and RAY_NOTICE not in line and not line.startswith("autotune: ")
    ]


def _trials(runs: Path, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{runs / study / 'study.db'}").trials


@pytest.mark.parametrize("group", [False, True], ids=["driver", "process-group"])
def test_sigterm_acts_like_ctrl_c(tmp_path: Path, group: bool) -> None:
    """SIGTERM to the driver, or to its whole process group as `timeout`, `kill -TERM -PGID` or a
    service manager sends it (the trials' worker processes get it too): the running trials are
    interrupted, not failed configs."""
    proc = _start(tmp_path, "term", at_least=2, session=group)
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    assert "finished trials kept" in err and "--resume continues" in err and "Traceback" not in err
    trials = _trials(tmp_path, "term")
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert all(t.user_attrs.get("failure") == "interrupted" for t in trials if t.state == TrialState.FAIL)
    assert not [t.number for t in trials if t.user_attrs.get("failure") == "error"], "no config failed"
    csv_rows = (tmp_path / "term" / "trials.csv").read_text().splitlines()[1:]
    assert len(csv_rows) == sum(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in trials)
    assert (tmp_path / "term" / "report.html").stat().st_size > 0


def test_one_driver_per_study_a_locked_database_and_a_moved_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _start(tmp_path, "one", at_least=2)
    db = tmp_path / "one" / "study.db"
    # A second driver on the same study is refused in one line, before it starts anything.
    second = subprocess.run(
        _cmd(tmp_path, "one", 100_000, "--resume"), capture_output=True, text=True, env=ENV, timeout=120
    )
    assert second.returncode == 2, second.stderr
    (line,) = _lines(second.stderr)
    assert "is being run by another autotune process" in line and "--resume continues" in line
    assert first.poll() is None, "the first run goes on"
    assert not [t for t in _trials(tmp_path, "one") if t.state == TrialState.FAIL], "no live trial failed"

    # Another program locks the database: the run stops with one line and the --resume hint.
    lock = sqlite3.connect(db, isolation_level=None, timeout=30)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        _, err = first.communicate(timeout=120)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert first.returncode == 1 and len(_lines(err)) == 1, err
    (line,) = _lines(err)
    assert "database is locked" in line and "--resume continues" in line, line
    assert "UpdateFinishedTrialError" not in err

    done = counted_trials(db, "one")[0]
    again = subprocess.run(
        _cmd(tmp_path, "one", done + 1, "--resume"), capture_output=True, text=True, env=ENV, timeout=180
    )
    assert again.returncode == 0, again.stderr
    assert counted_trials(db, "one") == (done + 1, 0)

    # run.json records the default study.db relative to the run folder: a moved folder still opens.
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    (tmp_path / "one").rename(moved)
    monkeypatch.chdir(moved.parent)
    capsys.readouterr()
    assert main(["export", "moved", "--trial", "0", "--format", "flags"]) == 0
    assert "--max-num-seqs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "needle"), [(b"", "is empty (0 bytes)"), (b"garbage" * 100, "not an SQLite")]
)
def test_a_lost_or_corrupted_study_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    run_dir = tmp_path / "lost"
    run_dir.mkdir()
    files = {"study.db": content, "trials.csv": b"trial,state\n0,COMPLETE\n", "report.html": b"<p>old</p>"}
    for name, data in files.items():
        (run_dir / name).write_bytes(data)
    args = ["run", "--space", "small", "--runs-dir", str(tmp_path), "--study", "lost", "--resume", "--quiet"]
    assert main(args) == 2
    (line,) = _lines(capsys.readouterr().err)
    assert needle in line and "nothing was changed" in line
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == files


def test_a_resume_removes_the_temporary_files_a_killed_run_left(tmp_path: Path) -> None:
    """kill -9 while the results are written leaves atomic writes' temporary files (0 bytes, named as
    core/atomic.py's mkstemp names them): the next run into the folder removes them, and nothing else."""
    assert main(_cmd(tmp_path, "killed", 1)[3:]) == 0
    run_dir = tmp_path / "killed"
    left = [tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=run_dir) for name in ("pareto.png", "x")]
    for fd, _ in left:
        os.close(fd)
    kept = [".pareto.png.tmp", "notes.tmp", ".x.ABCDEFGH.tmp", ".x.abcdefg.tmp", "pareto.png.abcdefgh.tmp"]
    for name in kept:
        (run_dir / name).write_text("mine")
    (run_dir / ".y.abcdefgh.tmp").mkdir()
    assert main(_cmd(tmp_path, "killed", 2, "--resume")[3:]) == 0
    assert not [path for _, path in left if Path(path).exists()]
    assert all((run_dir / name).read_text() == "mine" for name in kept)
    assert (run_dir / ".y.abcdefgh.tmp").is_dir()


def test_a_run_folder_removed_mid_run_is_not_said_to_keep_its_trials(tmp_path: Path) -> None:
    """`rm -rf runs/<study>` while the run goes: SQLite refuses the next write to the deleted file, and
    the run's one line says the trials went with it, not that they are kept for a --resume."""
    import shutil

    proc = _start(tmp_path, "gone", at_least=2)
    shutil.rmtree(tmp_path / "gone")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    (line,) = _lines(err)
    assert "study.db was removed during the run, and with it the study's finished trials" in line, line
    assert "without --resume starts again" in line and "kept in" not in line, line


def test_the_end_line_names_where_trials_are_kept(tmp_path: Path) -> None:
    """The run folder when the study file is in it, else the file, else the URL without its password."""
    from autotune.commands.run_end import kept
    from autotune.tune.study_open import sqlite_url

    study = optuna.create_study(storage=sqlite_url(tmp_path), study_name="s")
    study.enqueue_trial({})
    study.optimize(lambda t: 1.0, n_trials=1)
    assert kept(study, tmp_path, sqlite_url(tmp_path)).startswith(f"1 finished trials kept in {tmp_path}/ (")
    assert f"kept in {tmp_path}/study.db (" in kept(study, tmp_path / "elsewhere", sqlite_url(tmp_path))
    url = "postgresql://me:hunter2@db.example/optuna"
    assert kept(study, tmp_path, url).startswith("1 finished trials kept in postgresql://me:***@db.example")
