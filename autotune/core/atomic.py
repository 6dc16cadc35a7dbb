"""Write a file all at once: into a temporary file beside it, flushed to disk, then renamed over it.

A reader (or a crash, a full disk, Ctrl-C) sees the old file or the new one, never a half-written or
empty one. The temporary file is removed when writing fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

TEMP_SUFFIX = ".tmp"
# atomic_path's temporary names: "." + the file's name + "." + mkstemp's 8 random characters (a-z, 0-9,
# _) + TEMP_SUFFIX; nothing else matches, so nothing else is removed as one.
_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX))


@contextlib.contextmanager
def atomic_path(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary path to write instead of `path`; renamed over `path` when the block succeeds."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        tmp.chmod(mode if mode is not None else _default_mode(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> Path:
    """Write `text` (UTF-8) to `path` atomically; `mode` sets its permissions."""
    with atomic_path(path, mode) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def remove_stale_temps(folder: Path) -> list[Path]:
    """Remove the temporary files atomic writes left in `folder` when their process was killed (kill -9
    mid-write: no `except` ran); the caller makes sure no other process writes there now. Returns them."""
    stale = [p for p in sorted(Path(folder).glob(f".*{TEMP_SUFFIX}")) if _TEMP_NAME.fullmatch(p.name)]
    removed = []
    for path in stale:
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed


def _default_mode(path: Path) -> int:
    """The mode the file has, or what a plain open() would give it (mkstemp's is 0600)."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
