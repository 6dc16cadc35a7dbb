"""Checks of command-line values that no other module owns: each bad value is one AutotuneError line.

They run before anything starts (no Ray, no study, no folder), so a corrected command never meets
the leftovers of a rejected one.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from autotune.core.errors import AutotuneError
from autotune.core.values import positive_number

T = TypeVar("T")
# An option as (its flag, its attribute in the parsed arguments, its default): given when not the default.
Option = tuple[str, str, Any]
# An option only some values of a choice use (--backend, --format): an Option and those values.
ChoiceOption = tuple[str, str, Any, tuple[str, ...]]

# More GPUs than any node has: a count above this is a typo, not a cluster (and range(10**9) is 8 GB).
MAX_GPUS = 4096
# User files read whole (YAML, run.json, config.json): larger ones are not what autotune asks for.
MAX_CONFIG_BYTES = 16 * 1024**2
# Data files (a trace CSV, a JSONL of prompts): a million long prompts fit.
MAX_DATA_BYTES = 4 * 1024**3
# Nesting and size of what a user file parses to (aliases expanded): no autotune schema comes close.
MAX_DEPTH = 64
MAX_VALUES = 1_000_000
# Defaults of the real backends' startup limit (vLLM loading a 70B model from a cold cache).
DEFAULT_STARTUP_TIMEOUT_S = 600.0


def arg(check: Callable[..., T], *bounds: Any) -> Callable[[str], T]:
    """An argparse type from a checker of autotune.core.values (`arg(values.seed)`): the checker's
    AutotuneError becomes argparse's one-line usage error (exit 2) before anything starts."""

    def convert(text: str) -> T:
        try:
            return check(text, "value", *bounds)
        except AutotuneError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = check.__name__  # argparse names the type in its messages
    return convert


def given_flags(args: argparse.Namespace, options: Sequence[Option]) -> list[str]:
    """The flags of `options` given on the command line (their value is not the default)."""
    return [flag for flag, name, default in options if getattr(args, name, default) != default]


def refuse_unless(needed: bool, args: argparse.Namespace, options: Sequence[Option], needs: str) -> None:
    """Each of `options` given while what it needs is not (`needed` False) would be ignored unseen: one
    AutotuneError line, "FLAG needs NEEDS" (`needs`, e.g. "--backend vllm")."""
    given = given_flags(args, options)
    if given and not needed:
        raise AutotuneError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} {needs}")


def refuse_unused(args: argparse.Namespace, choice: str, options: Sequence[ChoiceOption]) -> None:
    """Each of `options` given while the option `choice` (e.g. "--backend") has none of the values that
    use it: one line naming them ("--serve-cmd needs --backend vllm")."""
    value = getattr(args, choice.lstrip("-").replace("-", "_"))
    for flag, name, default, users in options:
        refuse_unless(value in users, args, [(flag, name, default)], f"{choice} {'|'.join(users)}")


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    return arg(positive_number)(text)


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
    existing = nearest_existing(path)
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise AutotuneError(f"bad --runs-dir {str(path)!r}: {existing} is not writable")


def nearest_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists: where a folder it needs would be made."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def not_a_directory(path: Path, what: str) -> None:
    """AutotuneError when a file asked for (`--space DIR`) is a directory: "not found" would mislead."""
    if path.is_dir():
        raise AutotuneError(f"{what} {path} is a directory, not a file")


def regular_file(path: Path, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> None:
    """AutotuneError unless `path` is a regular file of at most `max_bytes`: a FIFO would never end
    and /dev/zero never stop filling memory."""
    try:
        info = path.stat()
    except OSError as exc:
        raise AutotuneError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise AutotuneError(f"{what} {path} is not a regular file (a folder, a FIFO or a device?)")
    if info.st_size > max_bytes:
        raise AutotuneError(f"{what} {path} is {info.st_size:,} bytes: at most {max_bytes:,}")


def read_text(path: Path, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """A user's text file, whole (`regular_file`, UTF-8); anything else is one AutotuneError line."""
    regular_file(path, what, max_bytes)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AutotuneError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AutotuneError(f"{what} {path}: not a text (UTF-8) file") from None


def read_yaml(path: Path, what: str) -> Any:
    """Parse a user's YAML file; unreadable, binary, malformed (a key given twice included), nested too
    deep or too large once its aliases are expanded (an alias bomb): one AutotuneError line."""
    import yaml

    from autotune.core.yaml_loader import UniqueKeyLoader

    text = read_text(path, what)
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: plain data, never objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise AutotuneError(f"malformed YAML in {what} {path}{where}: {problem}") from None
    except RecursionError:
        raise AutotuneError(f"{what} {path}: nested more than {MAX_DEPTH} levels deep") from None
    check_structure(data, f"{what} {path}")
    return data


def read_json(path: Path, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """A user's JSON file (run.json, a model's config.json), checked as `parse_json` does."""
    return parse_json(read_text(path, what, max_bytes), f"{what} {path}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (json keeps the last of two silently; YAML files are
    refused for it too: core/yaml_loader.py)."""
    data = dict(pairs)
    if len(data) < len(pairs):
        twice = next(key for i, (key, _) in enumerate(pairs) if key in dict(pairs[:i]))
        raise ValueError(f"the key {twice!r} is given twice")
    return data


def parse_json(text: str, where: str) -> Any:
    """JSON text -> data; malformed (a key given twice included), nested too deep or too large: one
    AutotuneError line."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except ValueError as exc:
        raise AutotuneError(f"{where}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
    except RecursionError:
        raise AutotuneError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    check_structure(data, where)
    return data


def check_structure(data: Any, where: str) -> None:
    """What a user file parsed to: at most MAX_DEPTH levels and MAX_VALUES values counted with their
    aliases expanded (as every later step sees them), and text keys in every mapping.

    Walked iteratively with those budgets, so a self-referencing alias or a billion-laughs file ends
    here, not in a RecursionError or MemoryError later.
    """
    stack = [(data, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise AutotuneError(f"{where}: more than {MAX_VALUES:,} values (aliases expanded)")
        if depth > MAX_DEPTH:
            raise AutotuneError(f"{where}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            bad = next((k for k in node if not isinstance(k, str)), None)
            if bad is not None:
                raise AutotuneError(f"{where}: key {bad!r} is not a name (keys are text)")
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return value
