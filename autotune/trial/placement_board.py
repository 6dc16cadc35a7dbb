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
import time
from typing import Any

from autotune.measure.placement import Placement

NAMESPACE = "autotune"
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

    with contextlib.suppress(Exception):
        text = internal_kv._internal_kv_get(_key(ref), namespace=NAMESPACE)
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

    with contextlib.suppress(Exception):
        internal_kv._internal_kv_del(_key(ref), namespace=NAMESPACE)


def _key(ref: Any) -> str:
    return _PREFIX + ref.task_id().hex()
