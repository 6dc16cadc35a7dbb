"""Where a run's study lives and what is checked about it before anything starts: its default name and
SQLite file, no other live driver (--resume), no results of a study the storage lost, whether a study
of an older default name is this run's to resume."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

import optuna

from autotune.core.errors import AutotuneError
from autotune.core.secrets import masked
from autotune.core.values import MAX_NAME_CHARS
from autotune.store.lease import refuse_live_driver
from autotune.store.storage import check_sqlite_file, connect_storage
from autotune.store.urls import sqlite_path
from autotune.tune.study import StudySettings
from autotune.tune.study_open import check_resume

MAX_LISTED = 5  # studies a refused --resume names; past that, it counts them


def default_study_name(model: str, gpu: str, workload: str, slos: Sequence[str] = ()) -> str:
    """A readable study name, e.g. "llama-3.1-8b-instruct-h100-chat-ttft-p99-2s".

    The SLOs are part of it (and, from `autotune run`, a load other than capacity, objectives other
    than the default, a search space other than the default and a guided run: commands/run_study.py): a
    study keeps them, so another SLO on the same model, GPU and workload is another study, not a
    refused --resume. A name past MAX_NAME_CHARS (a long local model path) is
    cut and ends with a hash of the whole, so two such names stay apart.
    """
    raw = "-".join([model.rstrip("/").split("/")[-1], gpu, workload, *slos]).lower()
    name = re.sub(r"[^a-z0-9.]+", "-", raw).strip("-.")
    if len(name) > MAX_NAME_CHARS:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME_CHARS - 9].rstrip('-.')}-{digest}"
    return name


def check_not_driven(name: str, storage: str) -> None:
    """Before anything starts: refuse (one line) to --resume a study another process is running."""
    connected = _existing(name, storage)
    if connected is not None:
        refuse_live_driver(optuna.load_study(study_name=name, storage=connected))


def check_resumable(name: str, storage: str, runs_dir: Path | None) -> None:
    """Before anything starts: refuse (one line) --resume of a study the storage does not hold (a typo,
    another spelling of the GPU in a default name), naming the studies there: resuming must not start a
    new one. `runs_dir`: the default storage, one study.db per run folder under it."""
    if _existing(name, storage) is not None:
        return
    if runs_dir is None:
        where, names = masked(storage), _study_names(storage)
    else:
        if (runs_dir / name / "study.db").is_file():  # a run stopped as it created its study
            raise AutotuneError(
                f"nothing to resume: {runs_dir / name / 'study.db'} holds no study {name!r} (the run "
                "stopped before it began); drop --resume to start it"
            )
        where, names = f"{runs_dir}/", sorted(p.parent.name for p in runs_dir.glob("*/study.db"))
    held = ", ".join(names) if len(names) <= MAX_LISTED else f"{len(names)} studies"
    raise AutotuneError(
        f"nothing to resume: no study {name!r} in {where} (it holds {held or 'none'}); pass an existing "
        "one with --study, or drop --resume to start it"
    )


def _study_names(storage: str) -> list[str]:
    """The studies a storage holds (none when its SQLite file does not exist)."""
    path = sqlite_path(storage)
    if path is not None and not path.is_file():
        return []
    return sorted(optuna.study.get_all_study_names(connect_storage(storage, attempts=1)))


def holds(name: str, storage: str) -> bool:
    """Whether `storage` holds study `name` (a missing SQLite file is not created by asking)."""
    return _existing(name, storage) is not None


def resumable(name: str, storage: str, settings: StudySettings) -> bool:
    """Whether `storage` holds study `name` and a run with `settings` may resume it: the comparison a
    --resume makes (study_open.check_resume). A lost or broken SQLite file holds nothing to resume."""
    try:
        check_sqlite_file(storage, resume=True)
        connected = _existing(name, storage)
        if connected is None:
            return False
        check_resume(optuna.load_study(study_name=name, storage=connected), settings)
    except AutotuneError:
        return False
    return True


def check_results_kept(name: str, storage: str, run_dir: Path) -> None:
    """Before anything starts: refuse (one line) a run whose folder holds results of a study the storage
    does not have (its study.db deleted or moved): starting over there would overwrite them."""
    if (run_dir / "trials.csv").exists() and _existing(name, storage) is None:
        raise AutotuneError(
            f"{run_dir} holds the results of study {name!r}, which {masked(storage)} does not have (was "
            "study.db deleted or moved?); nothing was changed: pass its --storage, or move the folder "
            "away to start over"
        )


def _existing(name: str, storage: str) -> optuna.storages.BaseStorage | None:
    """The storage, connected, when it holds study `name`; None otherwise (a missing SQLite file is
    not created by asking)."""
    path = sqlite_path(storage)
    if path is not None and not path.is_file():
        return None
    connected = connect_storage(storage, attempts=1)
    return connected if name in optuna.study.get_all_study_names(connected) else None
