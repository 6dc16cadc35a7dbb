"""Whether the Ray cluster's head is still there, as the driver sees it between trials.

The head (its GCS) holds the cluster's state and its key-value store; a driver that asks a dead head
anything hangs. So the executor probes the head's port: every WATCH_EVERY_S while it waits for trials,
and before each use of the store. Two probes in a row unanswered and the cluster counts as gone
(ClusterLost): the run stops with what finished in the study.
"""

from __future__ import annotations

import math
import time

from autotune.dispatch.ray_cluster import ClusterLost, gcs_address, tcp_reachable

WATCH_EVERY_S = 2.0  # how often the driver checks that the cluster's head answers and re-reads its nodes
LOST_AFTER_MISSES = 2  # consecutive unanswered checks before the cluster counts as gone
STORE_CHECK_S = 1.0  # how long a probe of the head vouches for its key-value store (store_answers)
HEAD_GONE = "its head at {head} stopped answering"
NO_GPU_LEFT = "every node with GPUs was lost"


class HeadWatch:
    """The driver's view of the cluster's head: answering, or gone (with the one line that says why)."""

    def __init__(self) -> None:
        self._gcs = gcs_address()
        self._last_watch = time.monotonic()
        self._misses = 0
        self._store_checked = (-math.inf, False)  # when the head was last probed before using its store
        self.lost = ""  # why the cluster counts as gone ("" while it is there)

    def due(self) -> bool:
        """Whether a periodic check is due (WATCH_EVERY_S since the last one; never without a head)."""
        now = time.monotonic()
        if self._gcs is None or now - self._last_watch < WATCH_EVERY_S:
            return False
        self._last_watch = now
        return True

    def check(self) -> bool:
        """One periodic probe: whether the head answered (the count of misses then starts over); raises
        ClusterLost at LOST_AFTER_MISSES misses in a row."""
        if self.answers():
            self._misses = 0
            return True
        self._misses += 1
        if self._misses >= LOST_AFTER_MISSES:
            raise ClusterLost(self.lose(HEAD_GONE))
        return False

    def answers(self) -> bool:
        """Whether the cluster's head (its GCS) accepts a connection (True when its address is unknown)."""
        return self._gcs is None or tcp_reachable(*self._gcs, timeout_s=WATCH_EVERY_S / 2)

    def lose(self, why: str) -> str:
        """Mark the cluster gone; returns the one line that says so (`why` may name `{head}`)."""
        host, port = self._gcs or ("?", 0)
        self.lost = f"the Ray cluster is gone: {why.format(head=f'{host}:{port}')}"
        return self.lost

    def store_answers(self) -> bool:
        """Whether the cluster's key-value store (on its head) may be asked: a call to a dead head would
        hang the driver. The head's answer is reused for a second (several trials end at once)."""
        now = time.monotonic()
        if now - self._store_checked[0] > STORE_CHECK_S:
            self._store_checked = (now, self.answers())
        return not self.lost and self._store_checked[1]
