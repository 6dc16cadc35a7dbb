"""`autotune` as a user runs it in the tests: a process in a folder of their files (relative paths)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def autotune(
    folder: Path, *args: str, check: bool = True, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`autotune ARGS` as a process in `folder` (stdout and stderr captured as text), in `env` (default:
    this process's environment)."""
    command = [sys.executable, "-m", "autotune.cli", *args]
    return subprocess.run(
        command, cwd=folder, capture_output=True, text=True, timeout=timeout, check=check, env=env
    )
