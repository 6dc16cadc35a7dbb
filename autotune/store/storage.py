"""The study's storage (an Optuna RDB URL): checked before a run starts, opened with trial heartbeats,
and its errors as one line (never with a password of the URL)."""

from __future__ import annotations

import time
import warnings

import optuna

from autotune.core.errors import AutotuneError
from autotune.core.secrets import masked
from autotune.store.lease import GRACE_S, HEARTBEAT_S
from autotune.store.urls import sqlite_path

STORAGE_ATTEMPTS = 3
STORAGE_RETRY_S = 0.2


def connect_storage(
    storage: str | optuna.storages.BaseStorage,
    attempts: int = STORAGE_ATTEMPTS,
    heartbeat_s: int = HEARTBEAT_S,
    grace_s: int = GRACE_S,
) -> optuna.storages.BaseStorage:
    """The storage behind an Optuna storage URL (an object passes through), with trial heartbeats.

    A new SQLite file is given its schema by whoever opens it first; a second process opening it at
    that moment (a dashboard, a monitoring script) can make that fail once ("UNIQUE constraint failed:
    alembic_version"), so it is retried before any error counts as a bad --storage. The error line
    never shows a password of the URL.
    """
    # Heartbeats are recorded by autotune.store.lease for the ask/tell loop: Optuna's warning that they are
    # meant for Study.optimize (printed at the first ask) does not apply.
    warnings.filterwarnings(
        "ignore", message="Heartbeat of storage is supposed to be used with Study.optimize"
    )
    if not isinstance(storage, str):
        return storage
    error: Exception | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(STORAGE_RETRY_S)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    storage, heartbeat_interval=heartbeat_s, grace_period=grace_s
                )
        except Exception as exc:  # noqa: BLE001  (any storage error is a bad --storage for the user)
            error = exc
    raise AutotuneError(f"cannot open storage {masked(storage)}: {storage_error(error)}") from None


def open_study(name: str, storage: str) -> optuna.Study:
    """The existing study `name` in `storage`; one AutotuneError line when it is missing or unreachable."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except Exception as exc:  # noqa: BLE001  (missing study or unreachable storage)
        raise AutotuneError(
            f"cannot open study {name!r} in {masked(storage)}: {storage_error(exc)}"
        ) from None


def STORAGE_ERRORS() -> tuple[type[BaseException], ...]:  # noqa: N802  (a constant, imported late)
    """What a failing study storage raises (locked, full, corrupted, unreachable database)."""
    import sqlalchemy.exc

    return (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError)


def storage_error(error: BaseException | None) -> str:
    """One line for a storage exception (SQLAlchemy's carry the SQL and a link on further lines).

    Optuna's StorageInternalError only says that a commit failed: the cause (database is locked,
    disk full...) is the exception it was raised from.
    """
    if isinstance(error, optuna.exceptions.StorageInternalError):
        error = error.__cause__ or error.__context__ or error
    text = str(getattr(error, "orig", None) or error or "unknown error").strip().splitlines()
    return masked(f"{type(error).__name__}: {text[0] if text else ''}")


def preflight_storage(storage: str, resume: bool) -> None:
    """Check --storage before anything starts: a URL SQLAlchemy knows; an SQLite file that can be
    this study's (not created yet: a run refused later leaves nothing); any other database reachable."""
    import sqlalchemy

    authority = storage.partition("://")[2].partition("?")[0]
    if authority.count("@") > 1:
        # SQLAlchemy would end the password at its first '@' and take the rest for the host, and the
        # driver's error would then show that part of the password: refused, the URL not shown.
        raise AutotuneError("bad --storage: the password (or user) contains '@': write it URL-encoded (%40)")
    if storage in ("sqlite://", "sqlite:///:memory:") or storage.startswith("sqlite:///:memory:?"):
        raise AutotuneError(
            "bad --storage: an in-memory SQLite database ends with the run, and the study with it: give a "
            "file (sqlite:///path/study.db) or a database server"
        )
    try:
        sqlalchemy.engine.make_url(storage).get_dialect()
    except Exception as exc:  # noqa: BLE001  (ArgumentError, NoSuchModuleError, a missing driver)
        raise AutotuneError(f"bad --storage {masked(storage)}: {storage_error(exc)}") from None
    path = sqlite_path(storage)
    if path is None:
        if storage.startswith("sqlite"):
            return
        connect_storage(storage, attempts=1)
        return
    check_sqlite_file(storage, resume)
    if not path.parent.is_dir():
        raise AutotuneError(f"bad --storage: folder {path.parent} does not exist")


def check_sqlite_file(storage: str, resume: bool) -> None:
    """An SQLite file that cannot be this study's: refused before SQLAlchemy writes a schema into it.

    A zero-byte file with --resume is a study that was lost (a full disk, a bad copy): starting a new
    one there would overwrite the run folder's results. A file that is not SQLite is refused too.
    """
    path = sqlite_path(storage)
    if path is None or not path.exists():
        return
    if path.is_dir():
        raise AutotuneError(f"storage {path} is a folder, not an SQLite file")
    size = path.stat().st_size
    if size == 0 and resume:
        raise AutotuneError(
            f"{path} is empty (0 bytes): no study to resume there; nothing was changed (move the file "
            "away to start over)"
        )
    if size:
        with path.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise AutotuneError(f"{path} is not an SQLite database (corrupted?); nothing was changed")
