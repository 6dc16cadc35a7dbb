"""What a run folder records so `export`, `report` and `dashboard` find its study: runs/<study>/run.json
(the study's name and storage, the run's settings and image), and the sizing best.json holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core.atomic import atomic_write_text
from autotune.core.errors import AutotuneError
from autotune.core.inputs import read_json
from autotune.core.json_out import json_text

RUN_FILE = "run.json"
BEST_FILE = "best.json"  # the run's results (report.py): its "sizing" holds --target-rate


@dataclass(frozen=True)
class RunInfo:
    """What runs/<study>/run.json records so export, report and dashboard find the study."""

    study: str
    storage: str
    directory: Path
    meta: dict[str, Any] = field(default_factory=dict)  # the rest of run.json (settings, image...)

    def save(self, extra: dict[str, Any] | None = None) -> None:
        """Write run.json (the storage URL is a path or URL, never a secret-bearing value we add)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = {"study": self.study, "storage": self.storage, **(extra or {})}
        atomic_write_text(self.directory / RUN_FILE, json_text(data, indent=2) + "\n")


def load_run(directory: str | Path) -> RunInfo:
    """Read runs/<study>/run.json; AutotuneError (one line) when the folder is not a run or its run.json
    was edited into something else (a list, a number for the study, no storage)."""
    if not str(directory).strip():  # Path("") is ".", which the error would show as the empty name
        raise AutotuneError("an empty run path: pass a run folder, e.g. runs/<study>")
    path = Path(directory)
    meta = path / RUN_FILE
    if not meta.is_file():
        if not path.exists():
            raise AutotuneError(f"run folder not found: {directory}")
        raise AutotuneError(f"{directory} is not an autotune run (no {RUN_FILE}); pass runs/<study>")
    data = read_json(meta, "run file")
    if not isinstance(data, dict):
        raise AutotuneError(f"{meta}: unreadable run file (not a JSON object)")
    for key, kind, required in RUN_FIELDS:
        value = data.get(key)
        if (value is None and required) or (value is not None and not kind(value)):
            raise AutotuneError(f"{meta}: unreadable run file ({key!r} is {value!r})")
    return RunInfo(study=data["study"], storage=data["storage"], directory=path, meta=data)


def target_rate(info: RunInfo) -> float | None:
    """The req/s the run sized its recommendation for (`run --target-rate`, in best.json's "sizing"), or
    None: no best.json yet, or no target rate."""
    path = info.directory / BEST_FILE
    if not path.is_file():
        return None
    data = read_json(path, "results file")
    sizing = data.get("sizing") if isinstance(data, dict) else None
    rate = sizing.get("target_rate") if isinstance(sizing, dict) else None
    is_number = isinstance(rate, int | float) and not isinstance(rate, bool)
    return float(rate) if is_number and rate > 0 else None


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


# What autotune reads back from run.json: (key, check, required).
RUN_FIELDS = (
    ("study", _text, True),
    ("storage", _text, True),
    ("image", _text, False),
    ("slos", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), False),
)
