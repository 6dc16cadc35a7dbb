"""Another revision of this repository, checked out for a side-by-side benchmark."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """A temporary git worktree of `revision` (removed after), to run with this Python environment:
    put it first on PYTHONPATH (`environment`) and its `autotune` is the one imported."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        git = ["git", "-C", str(REPO), "worktree"]
        subprocess.run([*git, "add", "--detach", "-q", str(tree), revision], check=True)
        try:
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=True)


def environment(tree: Path) -> dict[str, str]:
    """This process's environment with `tree`'s code first on the import path."""
    return {**os.environ, "PYTHONPATH": str(tree)}


def commit(revision: str) -> str:
    """argparse type of `--before REV`: a revision that names a commit of this repository (`git rev-parse
    --verify`), checked before any worktree is made; anything else is a one-line usage error."""
    git = ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", "--end-of-options"]
    try:
        found = subprocess.run([*git, f"{revision}^{{commit}}"], capture_output=True, text=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot run git to check {revision!r}: {exc.strerror or exc}"
        ) from None
    if found.returncode != 0:
        said = "".join(f" ({line})" for line in found.stderr.strip().splitlines()[-1:])
        raise argparse.ArgumentTypeError(f"{revision!r} is not a commit of {REPO}{said}")
    return revision
