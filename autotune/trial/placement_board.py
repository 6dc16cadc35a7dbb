"""Where a running trial's Ray task was placed, told by the task as it starts.

A task's result carries its placement, but a task that never returns (its worker killed, its node lost,
cancelled at its deadline or by Ctrl-C) brings nothing back: without this, such a trial would lose the
node and GPUs it held. So the task writes its placement and start time to Ray's key-value store (kept
by the cluster's head, it outlives the worker and its node), under its own task id, and the driver reads
it back for a trial that ended without a result. Best effort on both sides: the trial runs whatever
happens here, and a placement not found is just not known.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from autotune.measure.placement import Placement

NAMESPACE = "autotune"
STORE_TIMEOUT_S = 2.0  # the driver's wait for the store, which a head dying meanwhile never answers
_PREFIX = "placement/"


def announce(placement: Placement) -> None:
    """In the task: record where it runs and since when (time.time()), keyed by its task id."""
    import ray
    from ray.experimental import internal_kv

    with contextlib.suppress(Exception):  # no store (an old cluster, a hiccup): the trial still runs
        key = _PREFIX + ray.get_runtime_context().get_task_id()
        gpu_ids = list(placement.gpu_ids) if placement.gpu_ids is not None else None
        text = json.dumps(
            {
                "node_id": placement.node_id,
                "node_ip": placement.node_ip,
                "gpu_ids": gpu_ids,
                "since": time.time(),
            }
        )
        internal_kv._internal_kv_put(key, text, overwrite=True, namespace=NAMESPACE)


def announced(ref: Any) -> Placement | None:
    """On the driver: where the task of `ref` said it runs, with `ran_at` from its start to now (None:
    it had not started, or the store did not answer)."""
    from ray.experimental import internal_kv

    text = _bounded(lambda: internal_kv._internal_kv_get(_key(ref), namespace=NAMESPACE))
    with contextlib.suppress(Exception):
        if text:
            told = json.loads(text)
            gpu_ids = told.get("gpu_ids")
            return Placement(
                node_id=str(told["node_id"]),
                node_ip=str(told["node_ip"]),
                gpu_ids=tuple(gpu_ids) if isinstance(gpu_ids, list) else None,
                ran_at=(round(float(told["since"]), 3), round(time.time(), 3)),
            )
    return None


def forget(ref: Any) -> None:
    """On the driver, once the trial is told: drop its entry (a long-lived cluster keeps its store)."""
    from ray.experimental import internal_kv

    _bounded(lambda: internal_kv._internal_kv_del(_key(ref), namespace=NAMESPACE))


def _bounded(call: Callable[[], Any]) -> Any:
    """`call()`'s result within STORE_TIMEOUT_S, else None (an error too). The driver asks the store
    only while the head answers, but a head that dies in between would hold it for Ray's retries (a
    minute, past the run's stop): the call waits in a daemon thread, which does not hold the exit."""
    box: list[Any] = []

    def run() -> None:
        with contextlib.suppress(Exception):
            box.append(call())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(STORE_TIMEOUT_S)
    return box[0] if box else None


def _key(ref: Any) -> str:
    return _PREFIX + ref.task_id().hex()
