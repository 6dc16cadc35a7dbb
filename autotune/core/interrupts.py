"""SIGTERM acts like Ctrl-C, and a Ctrl-C while results are written is kept, not lost.

A scheduler or Kubernetes stops a run with SIGTERM: it goes to whatever handles Ctrl-C at that moment
(the tuner's loop sets its stop flag; elsewhere Python raises KeyboardInterrupt), so the running
trial is failed, its server stopped, the results written, and the run exits 130 as on Ctrl-C.
While the results are written, Ctrl-C (or SIGTERM) only takes note, and is raised once they are all
on disk: a report is never half-written by an interrupt, and the run never exits 0 after one.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


def _forward_to_ctrl_c(signum: int, frame: FrameType | None) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    elif handler != signal.SIG_IGN:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """While the block runs, SIGTERM does what Ctrl-C does (main thread only; else a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _forward_to_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred_ctrl_c() -> Iterator[None]:
    """Ctrl-C during the block is raised as KeyboardInterrupt when the block ends (a second one at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen = False

    def note(signum: int, frame: FrameType | None) -> None:
        nonlocal seen
        if seen:
            raise KeyboardInterrupt
        seen = True

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if seen:
        raise KeyboardInterrupt
