"""SIGTERM is Ctrl-C; a Ctrl-C while results are written waits for them and is never swallowed, nor
one whose KeyboardInterrupt a finalizer discarded; `autotune bench` against a server that fails says why."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.core.interrupts import deferred_ctrl_c, sigterm_as_ctrl_c

STOPS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


def test_sigterm_raises_what_ctrl_c_raises() -> None:
    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes of the main thread
            pass
    assert signal.getsignal(signal.SIGTERM) is not signal.getsignal(signal.SIGINT)  # restored


def test_ctrl_c_while_the_commands_are_imported_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C just after `autotune run` started landed in an import: a KeyboardInterrupt traceback."""
    import importlib

    imported = importlib.import_module

    def cut(name: str, *args: object) -> object:
        if name == "autotune.commands.calibrate":
            raise KeyboardInterrupt
        return imported(name, *args)

    monkeypatch.setattr(importlib, "import_module", cut)
    assert main(["run", "--space", "small"]) == 130
    assert capsys.readouterr().err == "autotune: interrupted\n"


def test_ctrl_c_while_writing_finishes_the_block_then_raises() -> None:
    written = []
    with pytest.raises(KeyboardInterrupt), deferred_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
        written.append("report")  # still runs: the interrupt waits for the block
    assert written == ["report"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.fixture
def swallowed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BaseException]]:
    """The exceptions Python discards ("Exception ignored in ..."), collected instead of printed; Ctrl-C
    raises KeyboardInterrupt meanwhile, as in a terminal (a test worker may have it ignored)."""
    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_value))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # SIGHUP at its default, as in a terminal: under `nohup` it is ignored, and a run leaves it so
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGHUP, hangup)


def _stop_inside_a_weakref_callback(sig: signal.Signals) -> None:
    """Send `sig` while Python runs a weakref callback: what its handler raises there is discarded."""

    class Doomed:
        pass

    doomed = Doomed()
    weakref.finalize(doomed, signal.raise_signal, sig)  # to this thread: handled before the callback returns
    del doomed


@pytest.mark.parametrize("sig", STOPS, ids=[s.name for s in STOPS])
def test_a_stop_a_finalizer_swallowed_is_raised_at_the_next_check(
    sig: signal.Signals, swallowed: list[BaseException]
) -> None:
    reached = []
    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c() as stops:
        _stop_inside_a_weakref_callback(sig)
        assert [type(exc) for exc in swallowed] == [KeyboardInterrupt]  # lost on its own
        reached.append("the phase boundary")
        stops.check()
        reached.append("the next phase")
    assert reached == ["the phase boundary"]


def test_a_block_that_ends_after_a_swallowed_stop_raises_it(swallowed: list[BaseException]) -> None:
    """Past the last phase boundary, the block's end raises it: the run never ends as finished."""
    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
        _stop_inside_a_weakref_callback(signal.SIGTERM)
    assert [type(exc) for exc in swallowed] == [KeyboardInterrupt]


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
