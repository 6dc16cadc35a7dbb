"""Checks of command-line values that no other module owns: each bad value is one AutotuneError line.

They run before anything starts (no Ray, no study, no folder), so a corrected command never meets
the leftovers of a rejected one.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
from pathlib import Path
from typing import Any

from autotune.core.errors import AutotuneError

# More GPUs than any node has: a count above this is a typo, not a cluster (and range(10**9) is 8 GB).
MAX_GPUS = 4096
# Defaults of the real backends' startup limit (vLLM loading a 70B model from a cold cache).
DEFAULT_STARTUP_TIMEOUT_S = 600.0


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def add_startup_timeout(parser: argparse.ArgumentParser | Any) -> None:
    """Register --startup-timeout (real backends: how long a server may take to answer /health)."""
    parser.add_argument(
        "--startup-timeout",
        type=positive_seconds,
        metavar="S",
        help=f"vllm/docker backends: seconds a server may take to get healthy (default "
        f"{DEFAULT_STARTUP_TIMEOUT_S:g}); past it the trial fails as startup_timeout",
    )


def check_gpus_text(text: str | None) -> None:
    """Reject --gpus values that are empty lists or absurd counts before they are expanded."""
    if text is None:
        return
    parts = [p.strip() for p in text.split(",")]
    if not any(parts) or ("," in text and not all(parts)):
        raise AutotuneError(f"bad --gpus {text!r}: expected a count (4) or device ids (0,1,2,3)")
    numbers = [p for p in parts if p.lstrip("-").isdigit()]
    if any(int(p) > MAX_GPUS for p in numbers):
        raise AutotuneError(f"bad --gpus {text!r}: at most {MAX_GPUS} GPUs (or device ids below it)")


def serve_command(text: str) -> list[str]:
    """--serve-cmd as an argument list (shell quoting rules, never run by a shell)."""
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise AutotuneError(f"bad --serve-cmd {text!r}: {exc}") from None
    if not args:
        raise AutotuneError("bad --serve-cmd: empty (e.g. --serve-cmd 'vllm serve')")
    return args


def check_runs_dir(path: Path) -> None:
    """--runs-dir must be (or become) a writable folder."""
    if path.exists() and not path.is_dir():
        raise AutotuneError(f"bad --runs-dir {str(path)!r}: it is a file, not a folder")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise AutotuneError(f"bad --runs-dir {str(path)!r}: {existing} is not writable")


def read_yaml(path: Path, what: str) -> Any:
    """Parse a user's YAML file; unreadable, binary or malformed: one AutotuneError line."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AutotuneError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AutotuneError(f"{what} {path}: not a text (UTF-8) YAML file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise AutotuneError(f"malformed YAML in {what} {path}{where}: {problem}") from None


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return value
