"""A multi-node Ray cluster on this machine, for tests: a head without GPUs and worker nodes with fake
GPUs, in this process's children only (so a test can own it and end it without touching other Ray).

    python tests/ray_keeper.py 2 3     # head + a worker with 2 fake GPUs + a worker with 3

Prints one JSON line {"address": ..., "workers": [{"node_id", "gpus", "raylet_pid"}, ...]}, then reads
commands on stdin: `kill I` ends worker I at once (SIGKILL, like a machine lost), `quit` (or end of
input) shuts the whole cluster down and exits.
"""

from __future__ import annotations

import json
import os
import signal
import sys

os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

from ray import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402


def main(gpus_per_worker: list[int]) -> None:
    """Start the cluster, report it, obey stdin, always shut it down (SIGTERM included)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    # A node that dies is declared dead after 3 missed health checks 1 s apart (Ray's default: 5 x 3 s),
    # so a test of a lost node does not wait on the default detection.
    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    head = {"num_cpus": 1, "num_gpus": 0, "_system_config": health}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        workers = [cluster.add_node(num_cpus=1, num_gpus=gpus) for gpus in gpus_per_worker]
        cluster.wait_for_nodes()
        report = {
            "address": cluster.address,
            "workers": [
                {
                    "node_id": node.node_id,
                    "gpus": gpus,
                    "raylet_pid": node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid,
                }
                for node, gpus in zip(workers, gpus_per_worker, strict=True)
            ],
        }
        print(json.dumps(report), flush=True)
        for line in sys.stdin:
            command, *rest = line.split()
            if command == "kill":
                cluster.remove_node(workers[int(rest[0])], allow_graceful=False)
                print("killed", flush=True)
            elif command == "quit":
                break
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]])
