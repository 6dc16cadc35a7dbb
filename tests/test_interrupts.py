"""SIGTERM is Ctrl-C; a Ctrl-C while results are written waits for them and is never swallowed;
`autotune bench` against a server that fails says why."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.core.interrupts import deferred_ctrl_c, sigterm_as_ctrl_c


def test_sigterm_raises_what_ctrl_c_raises() -> None:
    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes of the main thread
            pass
    assert signal.getsignal(signal.SIGTERM) is not signal.getsignal(signal.SIGINT)  # restored


def test_ctrl_c_while_writing_finishes_the_block_then_raises() -> None:
    written = []
    with pytest.raises(KeyboardInterrupt), deferred_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
        written.append("report")  # still runs: the interrupt waits for the block
    assert written == ["report"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_bench_against_a_failing_server_prints_why_and_keeps_its_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The reason is one line of the server's log: the log is kept, and its path printed."""
    serve = f"{sys.executable} -c 'import sys; print(\"boom: RuntimeError: no GPU\"); sys.exit(3)'"
    assert main(["bench", "--backend", "vllm", "--serve-cmd", serve]) == 1
    why, where = capsys.readouterr().err.strip().splitlines()
    assert why == "autotune bench: crashed: server exited with code 3: boom: RuntimeError: no GPU"
    assert where.startswith("autotune bench: the server's log: ")
    log = Path(where.removeprefix("autotune bench: the server's log: "))
    try:
        assert "boom: RuntimeError: no GPU" in log.read_text()
    finally:
        shutil.rmtree(log.parent)
