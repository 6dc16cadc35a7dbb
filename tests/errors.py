"""What a user sees of an AutotuneError: its one line, from a call or from the `autotune` CLI (exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.core.errors import AutotuneError


def one_line_error(call: Callable[[], Any]) -> str:
    """The message of the AutotuneError `call` raises, checked to be one non-empty line."""
    with pytest.raises(AutotuneError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message
    return message


def materialize(tmp: Path, files: dict[str, str | bytes]) -> None:
    """Write the case's files under `tmp` (folders made as needed)."""
    for name, content in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def assert_rejected(
    argv: list[str],
    files: dict[str, str | bytes],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """Run the CLI in `tmp_path` on `argv`: exit 2, one error line on stderr (returned), nothing written
    and no password shown."""
    materialize(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if args and args[0] == "run" and "--runs-dir" not in args:
        args += ["--runs-dir", str(tmp_path / "runs")]
    if args and args[0] == "run":
        args += ["--n-trials", "1", "--quiet"] if "--n-trials" not in args else ["--quiet"]
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "error" in lines[0] and "Traceback" not in err
    assert "hunter2pass" not in out + err
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert after == before
    return lines[0]
