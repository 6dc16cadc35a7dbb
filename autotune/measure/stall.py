"""A server that stopped answering: the load ends with one line instead of waiting out its timeouts.

vLLM streams a token to every request it holds at each engine step, so a server silent for long with
requests in flight has hung (a frozen one kept `bench --url` silent until its 30-minute limit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from autotune.core.values import counted
from autotune.measure.early_abort import InFlight
from autotune.measure.metrics import RequestRecord

SERVER_HUNG = "the server sent nothing for {seconds:g} s with {requests} in flight: it hung"
# How often the silence is measured: the load generator asks at every finished request, and reading every
# request in flight each time tripled its CPU time on a 3,000-request burst (slower sends, lower figures).
CHECK_EVERY_S = 1.0


def is_hung(reason: str | None) -> bool:
    """Whether a load's abort reason is StallWatch's."""
    return bool(reason) and reason.startswith(SERVER_HUNG.partition("{")[0])


class StallWatch:
    """A load guard (measure.early_abort.LoadGuard) that stops the load once the server has sent nothing
    for `stall_s` with requests in flight."""

    def __init__(self, stall_s: float = math.inf) -> None:
        self.stall_s = stall_s
        self._finished = time.perf_counter()  # when a request last finished (the in-flight views' clock)
        self._checked = -math.inf

    def add(self, record: RequestRecord) -> None:
        """A measured request finished."""
        self.warmup(record)

    def warmup(self, record: RequestRecord) -> None:
        """A warm-up request finished."""
        self._finished = time.perf_counter()

    def check(self, in_flight: Iterable[InFlight] = (), now: float = 0.0) -> str | None:
        """SERVER_HUNG once silent since the later of its last byte and the oldest request it owes an
        answer, else None. Reads `in_flight` at most every CHECK_EVERY_S."""
        if now - self._checked < CHECK_EVERY_S:
            return None
        self._checked = now
        views = list(in_flight)
        if not views:
            return None
        heard = max([self._finished, *(v.last_token or v.first_token or 0.0 for v in views)])
        if now - max(heard, min(v.start for v in views)) > self.stall_s:
            return SERVER_HUNG.format(seconds=self.stall_s, requests=counted(len(views), "request"))
        return None
