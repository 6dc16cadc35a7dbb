"""SIGTERM and SIGHUP stop a run as Ctrl-C does, and a stop while results are written is kept, not lost.

A scheduler or Kubernetes stops a run with SIGTERM, a closed terminal with SIGHUP: the running trial
is failed, its server stopped, the results written, and the run exits 130 as on Ctrl-C. They do so
whatever Ctrl-C's own disposition: a run started with `&` from a script has SIGINT ignored (the shell
does that to background jobs), and its SIGTERM must still stop it. An ignored Ctrl-C stays ignored, and
so does a SIGHUP ignored at start (`nohup`: the user asked the run to outlive the terminal).
While the results are written, a stop only takes note, and is raised once they are all on disk: a
report is never half-written by an interrupt, and the run never exits 0 after one.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType


def stop_signals(ctrl_c: bool = True) -> list[signal.Signals]:
    """The signals that stop a run now: SIGTERM always; SIGHUP and (with `ctrl_c`) SIGINT unless ignored."""
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    if ctrl_c and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signals.append(signal.SIGINT)
    return signals


@contextlib.contextmanager
def on_stop(handler: Callable[[], None], ctrl_c: bool = True) -> Iterator[None]:
    """While the block runs, each stop signal (`stop_signals`) calls `handler` (main thread only, where
    Python delivers signals; elsewhere a no-op). The previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def call(signum: int, frame: FrameType | None) -> None:
        handler()

    previous = {sig: signal.signal(sig, call) for sig in stop_signals(ctrl_c)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _interrupt() -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does by default
    (the tuner's loop and `deferred_ctrl_c` install their own handling of all three inside it)."""
    with on_stop(_interrupt, ctrl_c=False):
        yield


@contextlib.contextmanager
def deferred_ctrl_c() -> Iterator[None]:
    """A stop (Ctrl-C, SIGTERM, SIGHUP) during the block is raised as KeyboardInterrupt when the block
    ends (a second one at once)."""
    seen = False

    def note() -> None:
        nonlocal seen
        if seen:
            raise KeyboardInterrupt
        seen = True

    with on_stop(note):
        yield
    if seen:
        raise KeyboardInterrupt
