"""One driver per study, on SQLite and on a real PostgreSQL server: a live driver's study is refused,
a dead driver's RUNNING trials are failed on resume and nothing else is."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.core.errors import AutotuneError
from autotune.store.lease import LEASE_KEY, Lease
from autotune.store.storage import connect_storage
from autotune.tune.study import StudySettings, fail_stale_trials
from autotune.tune.study_open import open_study, start_study

SETTINGS = StudySettings(
    objectives=["output_throughput"],
    directions=["maximize"],
    slos=[],
    model="m",
    gpu="H100",
    workload="w",
    backend="sim",
)


def _check_one_driver(url: str) -> None:
    first = open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=False)
    lease = Lease(first, interval_s=0.2).start()
    live = first.ask()
    time.sleep(0.5)  # a renewal: the live trial has a heartbeat
    with pytest.raises(AutotuneError, match="is being run by another autotune process"):
        open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=True)
    assert first.trials[live.number].state == TrialState.RUNNING  # untouched by the refused driver
    lease.release()
    # The driver is gone (its lease released): its RUNNING trial is stale, failed on resume.
    again = open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=True)
    (trial,) = again.trials
    assert trial.state == TrialState.FAIL and trial.user_attrs["failure"] == "interrupted"


def test_one_driver_on_sqlite(tmp_path: Path) -> None:
    _check_one_driver(f"sqlite:///{tmp_path / 'study.db'}")


def test_a_dead_drivers_trial_found_after_its_heartbeat_went_stale_is_interrupted(tmp_path: Path) -> None:
    """A driver killed outright (kill -9): resumed past the heartbeats' grace period, Optuna's own stale
    check failed its trial with no reason, and the report called it "violates SLO"."""
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    study = open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=False)
    trial = study.ask()
    connect_storage(url).record_heartbeat(trial._trial_id)
    with sqlite3.connect(db) as con:  # the heartbeat an hour old: the driver died long ago
        con.execute("UPDATE trial_heartbeats SET heartbeat = datetime('now', '-1 hour')")
    again = open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=True)
    (failed,) = again.trials
    assert failed.state == TrialState.FAIL and failed.user_attrs.get("failure") == "interrupted"


def test_a_dead_drivers_lease_does_not_block(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=False)
    storage = connect_storage(url)
    # A lease renewed just now by a pid that does not run on this host (above the kernel's pid_max).
    record = {"id": "x", "pid": 2**22 + 12345, "host": socket.gethostname(), "renewed": time.time()}
    storage.set_study_system_attr(study._study_id, LEASE_KEY, record)
    open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=True)  # not refused


def test_a_suspended_drivers_stale_lease_still_blocks(tmp_path: Path) -> None:
    """A driver stopped with Ctrl-Z stops renewing its lease; its pid still runs on this host, and its
    running trials are its own when it continues: a resume is refused, not handed its study."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=False)
    storage = connect_storage(url)
    stale = time.time() - 3600  # renewed an hour ago, by a process that runs (this one)
    record = {"id": "x", "pid": os.getpid(), "host": socket.gethostname(), "renewed": stale}
    storage.set_study_system_attr(study._study_id, LEASE_KEY, record)
    with pytest.raises(AutotuneError, match="not renewing its lease: suspended"):
        open_study("s", url, SETTINGS, optuna.samplers.RandomSampler(seed=0), resume=True)


def _postgres_program(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, or where Debian's postgresql package keeps it."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(candidates[0]) if candidates else None


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server on 127.0.0.1 (skipped where none can start here)."""
    pytest.importorskip("psycopg", reason="psycopg (PostgreSQL driver) is not installed")
    initdb, pg_ctl = _postgres_program("initdb"), _postgres_program("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this host (.ci/install-postgres.sh)")
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    base = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    if as_user:
        shutil.chown(base, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = base / "data"
    try:
        subprocess.run(
            [*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        options = f"-k {base} -p {port} -c listen_addresses=127.0.0.1"
        subprocess.run(
            [*as_user, pg_ctl, "-D", str(data), "-o", options, "-l", str(base / "log"), "-w", "start"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"PostgreSQL did not start here: {exc}")
    try:
        yield f"postgresql+psycopg://postgres:not-a-secret-1@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60
        )
        shutil.rmtree(base, ignore_errors=True)


def test_one_driver_on_postgresql(postgres: str) -> None:
    _check_one_driver(postgres)


def test_an_interrupted_baseline_is_measured_again_on_resume(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    sampler = optuna.samplers.RandomSampler(seed=0)
    study = start_study("s", url, SETTINGS, sampler, resume=False, baseline={"max_num_seqs": 256})
    assert study.ask().user_attrs["baseline"] is True  # the run is stopped while it is measured
    fail_stale_trials(study)
    again = start_study("s", url, SETTINGS, sampler, resume=True, baseline={"max_num_seqs": 256})
    states = [(t.state, t.user_attrs.get("baseline")) for t in again.trials]
    assert states == [(TrialState.FAIL, True), (TrialState.WAITING, True)]
