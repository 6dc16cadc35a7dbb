"""One driver per study: a lease in the study's storage, renewed with Optuna's trial heartbeats.

The driver that runs a study writes a study system attr (`autotune:driver`: its id, pid, host and
the time it last renewed) and, every HEARTBEAT_S seconds from a daemon thread, renews it and records
Optuna's RDB heartbeat (`RDBStorage(heartbeat_interval, grace_period)`) of each RUNNING trial: they
are all its own, since a second driver is refused. A second `autotune run --resume` on the same study:

- refuses with one line while the first one lives (on this host: its pid still runs, even suspended;
  on another: its lease renewed within GRACE_S), so it can never fail a live trial of the first one;
- otherwise fails only the trials that are stale: Optuna's heartbeat-stale ones (`fail_stale_trials`),
  plus RUNNING ones of a driver known dead (its pid gone on this host) or without any heartbeat
  (written before heartbeats existed), then takes the lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from autotune.core.errors import AutotuneError
from autotune.core.procs import pid_alive

LEASE_KEY = "autotune:driver"
HEARTBEAT_S = 5  # Optuna's heartbeat_interval (an int) and how often the lease is renewed
GRACE_S = 30  # a lease or trial heartbeat older than this is stale (Optuna's grace_period)


@dataclass
class Driver:
    """Who holds a study's lease."""

    id: str
    pid: int
    host: str
    renewed: float  # time.time() of the last renewal; 0 once released

    def alive(self, grace_s: float = GRACE_S) -> bool:
        """Not released, and on this host its pid still runs (a driver suspended with Ctrl-Z stops
        renewing, yet its running trials are its own when it continues), elsewhere renewed within the
        grace period."""
        if not self.renewed:
            return False
        if self.host == socket.gethostname():
            return pid_alive(str(self.pid))
        return time.time() - self.renewed <= grace_s


def current_driver(study: optuna.Study) -> Driver | None:
    """The driver recorded on the study, or None."""
    return _driver_of(study._storage.get_study_system_attrs(study._study_id).get(LEASE_KEY))


def _driver_of(raw: object) -> Driver | None:
    """A lease record as a Driver (None when there is none or it is unreadable)."""
    if not isinstance(raw, dict):
        return None
    try:
        return Driver(
            id=str(raw["id"]), pid=int(raw["pid"]), host=str(raw["host"]), renewed=float(raw["renewed"])
        )
    except (KeyError, TypeError, ValueError):
        return None


def refuse_live_driver(study: optuna.Study, grace_s: float = GRACE_S, mine: str = "") -> None:
    """AutotuneError (one line) when another process (not driver `mine`) is driving `study` right now."""
    _refuse(current_driver(study), study.study_name, grace_s, mine)


def _refuse(driver: Driver | None, name: str, grace_s: float, mine: str) -> None:
    if driver is not None and driver.id != mine and driver.alive(grace_s):
        seen = max(0.0, time.time() - driver.renewed)
        # a lease gone stale while its pid runs here: a driver suspended (Ctrl-Z) or hung
        quiet = ", not renewing its lease: suspended?" if seen > grace_s else ""
        raise AutotuneError(
            f"study {name!r} is being run by another autotune process (pid {driver.pid} on "
            f"{driver.host}, alive {seen:.0f} s ago{quiet}): one driver per study; wait for it or stop "
            "it, then the same command with --resume continues"
        )


def claim(study: optuna.Study, driver: Driver, grace_s: float = GRACE_S) -> None:
    """Make `driver` the study's driver, or refuse (AutotuneError) while another one lives: checked and
    written in one transaction, so two runs started together cannot both take it.

    The transaction's first statement is an UPDATE of the study's own row: it takes SQLite's write
    lock (a second claimer waits for the commit, then reads the first one's lease) and the row's lock
    on PostgreSQL and MySQL. A storage that is not an RDB (tests' in-memory ones) is checked then written.
    """
    rdb = _rdb(study._storage)
    if rdb is None:
        refuse_live_driver(study, grace_s, mine=driver.id)
        study._storage.set_study_system_attr(study._study_id, LEASE_KEY, dict(driver.__dict__))
        return
    import sqlalchemy
    from optuna.storages._rdb import models

    study_id, session = study._study_id, rdb.scoped_session()
    try:
        row = models.StudyModel
        session.execute(
            sqlalchemy.update(row).where(row.study_id == study_id).values(study_name=row.study_name)
        )
        attrs = models.StudySystemAttributeModel
        record = session.query(attrs).filter_by(study_id=study_id, key=LEASE_KEY).one_or_none()
        _refuse(
            _driver_of(json.loads(record.value_json)) if record else None,
            study.study_name,
            grace_s,
            driver.id,
        )
        value = json.dumps(dict(driver.__dict__))
        if record is None:
            session.add(attrs(study_id=study_id, key=LEASE_KEY, value_json=value))
        else:
            record.value_json = value
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _rdb(storage: object) -> optuna.storages.RDBStorage | None:
    """The RDB storage behind a study's storage (Optuna wraps it in a cache), or None."""
    storage = getattr(storage, "_backend", storage)
    return storage if isinstance(storage, optuna.storages.RDBStorage) else None


def fail_stale(study: optuna.Study) -> int:
    """Fail the RUNNING trials nobody runs any more; call only once no driver is alive
    (`refuse_live_driver`). Returns how many.

    Each is marked "interrupted" first (a finished trial takes no attr). Then Optuna's heartbeat-stale
    trials (`fail_stale_trials`, which runs its failed-trial callbacks); then the other RUNNING ones: with
    no live driver their heartbeats are not renewed any more (a driver known dead, its pid gone on this
    host, or one from before heartbeats), so they are failed now rather than after the grace period.
    """
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in running:
        study._storage.set_trial_user_attr(trial._trial_id, "failure", "interrupted")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # heartbeat older than the grace period
    for trial in running:
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    return len(running)


def new_driver() -> Driver:
    """This process as a study's driver (a fresh id)."""
    return Driver(uuid.uuid4().hex, os.getpid(), socket.gethostname(), time.time())


@dataclass
class Lease:
    """This process's lease on a study; `release()` (or process death) ends it."""

    study: optuna.Study
    interval_s: float = HEARTBEAT_S
    driver: Driver = field(default_factory=new_driver)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Lease:
        """Take the lease (`claim`: AutotuneError while another driver lives), then renew it (plus the
        RUNNING trials' heartbeats) from a daemon thread."""
        claim(self.study, self.driver)
        self._renew()
        self._thread = threading.Thread(target=self._run, name="autotune-lease", daemon=True)
        self._thread.start()
        return self

    def release(self, write: bool = True) -> None:
        """Stop renewing and mark the lease released, so a --resume need not wait for it to go stale
        (`write=False` when the storage is failing: the lease then goes stale by itself)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5 if write else 0.1)
        self.driver.renewed = 0.0
        if write:
            with contextlib.suppress(Exception):  # a broken storage: the lease goes stale by itself
                self._write()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._renew()
            except Exception:  # noqa: BLE001  (a locked database: the next renewal tries again)
                continue

    def _renew(self) -> None:
        self.driver.renewed = time.time()
        self._write()
        storage = self.study._storage
        if hasattr(storage, "record_heartbeat"):
            for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                storage.record_heartbeat(trial._trial_id)

    def _write(self) -> None:
        self.study._storage.set_study_system_attr(self.study._study_id, LEASE_KEY, dict(self.driver.__dict__))
