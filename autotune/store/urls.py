"""Storage URLs as a user gives them and as a run folder records them.

- A relative SQLite path (`sqlite:///studies/x.db`) is made absolute against the directory the command
  runs in, so the run works, and is found again, from any directory.
- run.json records the default SQLite file (inside the run folder) relative to the run folder
  (`sqlite:///study.db`, read back by `resolve`), so a moved or copied run folder still opens.
- A password in a URL (`postgresql://user:pass@host/db`) is never printed nor stored: `masked` shows
  `***` in its place and run.json keeps the URL without it (libpq reads PGPASSWORD or ~/.pgpass).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.core.secrets import without_password

SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL (relative as given), or None for other URLs and in-memory SQLite."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    raw = url[len(SQLITE_PREFIX) :].split("?", 1)[0]
    return Path(raw) if raw and raw != ":memory:" else None


def absolute(url: str, cwd: Path | None = None) -> str:
    """`url` with a relative SQLite path made absolute against `cwd` (default: the current directory)."""
    path = sqlite_path(url)
    if path is None or path.is_absolute():
        return url
    _, sep, query = url[len(SQLITE_PREFIX) :].partition("?")
    return f"{SQLITE_PREFIX}{((cwd or Path.cwd()) / path).resolve()}{sep}{query}"


def for_run_file(url: str, run_dir: Path) -> str:
    """How run.json records `url`: an SQLite file inside the run folder relative to it; no password (a
    SQLite URL's `?password=` too, whatever the file's place)."""
    path = sqlite_path(url)
    if path is not None and path.is_absolute():
        try:
            return f"{SQLITE_PREFIX}{path.resolve().relative_to(run_dir.resolve())}"
        except ValueError:
            pass
    return without_password(url)


def resolve(recorded: str, run_dir: Path) -> str:
    """The storage URL of a run folder: run.json's relative SQLite paths are relative to the folder."""
    path = sqlite_path(recorded)
    if path is not None and not path.is_absolute():
        return f"{SQLITE_PREFIX}{(run_dir / path).resolve()}"
    return recorded


def run_storage(info: Any) -> str:
    """The storage of a run folder (`autotune.outputs.run_info.RunInfo`), checked to exist when it is a file:
    opening a missing SQLite file would create an empty one."""
    from autotune.core.errors import AutotuneError

    url = resolve(info.storage, Path(info.directory))
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        raise AutotuneError(f"the study file of {info.directory} is missing: {path}")
    return url
