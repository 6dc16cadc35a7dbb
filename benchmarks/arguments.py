"""The benchmark scripts' command lines: a bad argument is one line on stderr and exit 2 before anything
runs, worded as autotune's own commands word it (autotune/cli.py): "PROG: error: WHAT (see PROG --help)".

The standard library only at import: sim_speed.py and guide_speed.py run themselves in a child process on
another revision's autotune (`--before REV`), which may lack any newer autotune helper.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """argparse described by a script's docstring (its first line), with a usage error on one line."""

    def __init__(self, doc: str | None) -> None:
        super().__init__(description=doc.splitlines()[0] if doc else None)

    def error(self, message: str) -> NoReturn:  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_names(
    parser: argparse.ArgumentParser, flag: str, names: Iterable[str], about: str, **kw: Any
) -> None:
    """An option that takes names of `names` (by default any number of them: `nargs` in `kw` says
    otherwise): an unknown one is a usage error that lists them, as `--help` does after `about`."""
    kw.setdefault("nargs", "*")
    parser.add_argument(flag, choices=list(names), metavar="NAME", help=f"{about}; of %(choices)s", **kw)


def whole(low: int = 1) -> Callable[[str], int]:
    """argparse type: a whole number >= `low` (1: runs, seeds, requests, processes)."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text!r}")
        return value

    return convert


def positive(text: str) -> float:
    """argparse type: a finite number > 0 (a budget, GPU-minutes, a factor)."""
    value = rate(text)
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def rate(text: str) -> float:
    """argparse type: a request rate, a number > 0 or inf (every request at once)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}")
    return value


def noise(text: str) -> float:
    """argparse type: a run-to-run noise (coefficient of variation) in [0, 1), as the simulator takes it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 1:  # NaN too
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def folder(text: str) -> Path:
    """argparse type: a folder to write into (made if missing); an existing file is refused before the
    work whose results would have gone there."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    return path


@contextlib.contextmanager
def user_errors(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Inside: an AutotuneError (a missing or malformed file, an unknown GPU or model) is the parser's
    one-line usage error, as `autotune` prints one, not a traceback."""
    from autotune.core.errors import AutotuneError  # here, not at import: see the module's docstring

    try:
        yield
    except AutotuneError as exc:
        parser.error(" ".join(str(exc).split()))
