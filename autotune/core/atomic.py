"""Write a file all at once: into a temporary file beside it, flushed to disk, then renamed over it.

A reader (or a crash, a full disk, Ctrl-C) sees the old file or the new one, never a half-written or
empty one. The temporary file is removed when writing fails.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary path to write instead of `path`; renamed over `path` when the block succeeds."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


def _default_mode(path: Path) -> int:
    """The mode the file has, or what a plain open() would give it (mkstemp's is 0600)."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
