"""SIGTERM and SIGHUP stop a run as Ctrl-C does, and a stop while results are written is kept, not lost.

A scheduler or Kubernetes stops a run with SIGTERM, a closed terminal with SIGHUP: the running trial
is failed, its server stopped, the results written, and the run exits 130 as on Ctrl-C. They do so
whatever Ctrl-C's own disposition: a run started with `&` from a script has SIGINT ignored (the shell
does that to background jobs), and its SIGTERM must still stop it. An ignored Ctrl-C stays ignored, and
so does a SIGHUP ignored at start (`nohup`: the user asked the run to outlive the terminal).
While the results are written, a stop only takes note, and is raised once they are all on disk: a
report is never half-written by an interrupt, and the run never exits 0 after one.
Before the tuner's loop, a stop raises KeyboardInterrupt at once and is noted too (`StopRecord`):
Python discards an exception raised while it runs a finalizer or a weakref callback ("Exception
ignored in ..."), so the run checks the note at its phase boundaries and raises a stop that was lost.
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


class StopRecord:
    """A stop signal's handler: raises KeyboardInterrupt, as Ctrl-C does by default, and notes the stop.

    The raise alone can be lost: one that lands while Python runs a finalizer or a weakref callback is
    printed ("Exception ignored in ...") and discarded. `check` raises it again from ordinary code.
    """

    def __init__(self) -> None:
        self.stopped = False

    def __call__(self) -> None:
        self.stopped = True  # before raising: the raise may be swallowed, the note stays
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if a stop came (its own raise may have been swallowed)."""
        if self.stopped:
            raise KeyboardInterrupt


@contextlib.contextmanager
def stops_as_sigint() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP are delivered as SIGINT, to whatever handles Ctrl-C then
    (Python's KeyboardInterrupt, or asyncio.run's cancel of its main task: a KeyboardInterrupt raised
    inside a running task instead leaves "Task exception was never retrieved" and its traceback on
    stderr). With Ctrl-C ignored they raise KeyboardInterrupt themselves."""

    def forward() -> None:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            raise KeyboardInterrupt
        signal.raise_signal(signal.SIGINT)

    with on_stop(forward, ctrl_c=False):
        yield


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[StopRecord]:
    """While the block runs, Ctrl-C (unless ignored), SIGTERM and SIGHUP raise KeyboardInterrupt and are
    noted in the StopRecord yielded: the block calls its `check` at phase boundaries, and a block that
    ends normally after a stop raises it (the tuner's loop and `deferred_ctrl_c` install their own
    handling of all three inside it)."""
    stops = StopRecord()
    with on_stop(stops):
        yield stops
    stops.check()  # a stop swallowed after the last phase boundary: the run must not end as finished


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
