"""Processes on this host: is an owner (a driver, a worker) still alive?"""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(text: str) -> bool:
    """Whether the process `text` names runs. A zombie does not: a worker Ray killed stays one until
    its parent reaps it, which on a busy machine can be after the executor looks."""
    try:
        pid = int(text)
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if not Path("/proc/self/stat").exists():
        return True  # no /proc (not Linux): os.kill said it exists
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False  # reaped since
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
