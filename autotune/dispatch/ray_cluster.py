"""The Ray cluster a run uses: start a local one or join one (failing fast), its GPUs per node, its liveness.

Placement is Ray's: a trial task asks for `num_gpus` = its config's GPUs, which Ray grants on one
node, and the task pins the devices Ray gave it. The driver only needs to know how many GPUs the
cluster's live nodes have (its capacity) and the largest node (the most GPUs a config can ever take).
`--gpus 0,1` on a local cluster is made real by starting Ray with CUDA_VISIBLE_DEVICES=0,1, so Ray's
own assignment maps onto those devices (Ray respects a CUDA_VISIBLE_DEVICES its raylet inherited).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.core.errors import AutotuneError, SetupLost, one_line
from autotune.dispatch.reaper import Reaper, start_reaper

CONNECT_TIMEOUT_S = 3.0  # an unreachable --ray-address fails in this long, not after Ray's minutes of retries
DEFAULT_GCS_PORT = 6379
AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
AUTH_MODE_VAR = "RAY_AUTH_MODE"  # "token": this process sends Ray's auth token (ray.init with an address)
TOKEN_FILE = "~/.ray/auth_token"  # where Ray keeps its token (else RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH)
NO_TOKEN = "no authentication token"  # Ray's AuthenticationError in token mode without a token
# Ray's words for a refused or missing token (its AuthenticationError, gRPC's status, its C++ log)
_TOKEN_REFUSED = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError", NO_TOKEN)
# "0": a cluster of this machine alone, as Ray runs on macOS and Windows: its node takes the loopback
# address, so its GCS, raylets and workers listen on 127.0.0.1, not on every interface (Ray's
# ray_constants.ENABLE_RAY_CLUSTER). A local cluster autotune starts has no other node to reach it.
SINGLE_MACHINE_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
WORKER_NICENESS_VAR = "RAY_worker_niceness"  # Ray's RayConfig worker_niceness (default 15), read at start
_NODE_DIED = re.compile(r"Node IP: (?P<ip>[^,\s]+), node ID: (?P<id>[0-9a-f]+)")


class ClusterLost(SetupLost):
    """The Ray cluster is gone (its head unreachable) or has no GPU left: the run cannot go on (exit 1)."""

    what = "the Ray cluster"
    resume_note = " (against a new cluster: --ray-address)"


@dataclass(frozen=True)
class NodeGpus:
    """A live node of the cluster and the GPUs (real or fake) it offers Ray."""

    node_id: str
    ip: str
    gpus: int


@dataclass(frozen=True)
class LostNode:
    """The node a task died with, as Ray's NodeDiedError names it ("" when Ray did not name it)."""

    ip: str = ""
    node_id: str = ""

    def describe(self) -> str:
        """`node 10.0.0.5 (Ray node 92e3c9a8)`, or `its node` when Ray did not say which."""
        return f"node {self.ip} (Ray node {self.node_id[:8]})" if self.node_id else "its node"


@dataclass
class Inventory:
    """The live nodes with GPUs; nodes seen lost stay out even while Ray still lists them alive."""

    nodes: dict[str, NodeGpus] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)

    @property
    def total(self) -> int:
        """GPUs on the live nodes."""
        return sum(n.gpus for n in self.nodes.values())

    @property
    def largest(self) -> int:
        """GPUs of the largest live node: no task can get more than that (Ray keeps a task on one node)."""
        return max((n.gpus for n in self.nodes.values()), default=0)

    def refresh(self) -> None:
        """Re-read the live nodes from Ray (nodes may join; lost ones stay out)."""
        import ray

        nodes = {}
        for node in ray.nodes():
            gpus = int(node.get("Resources", {}).get("GPU", 0))
            if node.get("Alive") and gpus > 0 and node["NodeID"] not in self.lost:
                nodes[node["NodeID"]] = NodeGpus(node["NodeID"], node.get("NodeManagerAddress", "?"), gpus)
        self.nodes = nodes

    def dead_among(self, node_ids: Iterable[str]) -> list[LostNode]:
        """Those of these nodes that are lost: dropped here, or dead in Ray (which lists dead nodes too)."""
        import ray

        listed = {node["NodeID"]: node for node in ray.nodes()}
        dead = []
        for n in sorted(node_ids):
            node = listed.get(n, {})
            if n in self.lost or not node.get("Alive"):
                dead.append(LostNode(node.get("NodeManagerAddress", "?"), n))
        return dead

    def drop(self, node_id: str) -> None:
        """Forget a node that died (Ray marks it dead only after its health checks time out)."""
        self.lost.add(node_id)
        self.nodes.pop(node_id, None)


def gpus_found(total: int, local: bool) -> str:
    """How many GPUs the run found, for a refusal ("... but <this>"): on a local cluster the run started
    itself (no --ray-address) they are this machine's, and the user started no Ray cluster to blame."""
    if local:
        return f"this machine has {total} GPU(s)" if total else "no GPU was found on this machine"
    return f"the Ray cluster has {total}" if total else "the Ray cluster has none"


def lost_node(exc: BaseException) -> LostNode | None:
    """The node a task's failure says died, or None when the failure is something else.

    A node killed under a running task reaches the driver as a NodeDiedError (which names it) or, when
    the task's own raylet went first, as a LocalRayletDiedError (which does not).
    """
    import ray.exceptions

    if isinstance(exc, ray.exceptions.LocalRayletDiedError):
        return LostNode()
    if not isinstance(exc, ray.exceptions.NodeDiedError):
        return None
    match = _NODE_DIED.search(str(exc))
    return LostNode(match["ip"], match["id"]) if match else LostNode()


@dataclass
class RaySession:
    """This run's hold on Ray: `close()` disconnects, and stops what is left of a local cluster it
    started (autotune.dispatch.reaper does that too if the driver is killed)."""

    reaper: Reaper | None = None

    def close(self) -> None:
        """ray.shutdown(), then the reaper's sweep of the local cluster's processes."""
        import ray

        try:
            ray.shutdown()
        finally:
            if self.reaper is not None:
                self.reaper.stop()


def start_ray(
    address: str | None,
    num_cpus: int,
    num_gpus: int | None = None,
    device_ids: Sequence[int] | None = None,
) -> RaySession | None:
    """Join the cluster at `address`, or start a local one; the session to close when this call started
    or joined it, None when it reused a Ray already initialized in this process.

    A local cluster gets `num_gpus` GPUs (fake ones for the simulator) and, with `device_ids`, sees only
    those devices, with Ray's default token authentication, and listens on 127.0.0.1 only.
    """
    if not address:
        os.environ.setdefault(SINGLE_MACHINE_VAR, "0")  # read once, when ray is first imported
    import ray

    if ray.is_initialized():
        return None
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    common: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address:
        join_ray(address, common)
        return RaySession()
    # Ray's notice that it enabled token authentication (its default) would land in the run's output.
    logging.getLogger(AUTH_LOGGER).setLevel(logging.ERROR)
    # Ray runs its workers at nice 15: the load generator and the servers it launches would yield the CPU
    # to every other process; they keep this process's priority (the guide's predictors run at nice 19)
    os.environ.setdefault(WORKER_NICENESS_VAR, "0")
    session = RaySession(start_reaper())
    try:
        with _visible_devices(device_ids):
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, **common)
    except BaseException:
        session.close()
        raise
    if session.reaper is not None:
        with contextlib.suppress(Exception):  # a private helper of Ray's: without it, the token alone
            session.reaper.watch(ray._private.worker._global_node.get_session_dir_path())
    return session


def join_ray(address: str, init_args: dict[str, Any]) -> None:
    """ray.init(address) or one AutotuneError line; one that names the fix when the cluster wants Ray's
    auth token (a head's default in Ray 2.60 once its machine has a token: docs/gpus.md).

    Without the token, Ray's C++ client retries for ~20 s, a log line to stderr each time: a process
    that sends no token (RAY_AUTH_MODE is not `token`) asks an explicit host:port's GCS once first, so
    that a head that wants one is told at once, not after the retries.
    """
    import ray

    check_reachable(address)
    try:
        _ask_gcs_once(address)
        ray.init(address=address, **init_args)
    except Exception as exc:  # noqa: BLE001  (Ray raises ConnectionError, RuntimeError, ValueError...)
        if _token_refused(exc):
            raise AutotuneError(f"cannot join the Ray cluster at {address}: {_token_fix(exc)}") from None
        raise AutotuneError(f"cannot join the Ray cluster at {address}: {one_line(exc)}") from exc


def _sends_token() -> bool:
    """Whether this process sends Ray's auth token when it joins a cluster (RAY_AUTH_MODE=token)."""
    return os.environ.get(AUTH_MODE_VAR, "").lower() == "token"


def _ask_gcs_once(address: str) -> None:
    """Without RAY_AUTH_MODE=token, one request to the GCS at an explicit host:port (not `auto`, where
    Ray may turn token mode on itself, nor ray://): Ray's AuthenticationError when it wants a token; any
    other failure is left to ray.init, with its retries. (With token mode on and no token, Ray's client
    aborts the process: ray.init checks that first.)"""
    if _sends_token() or address == "auto" or address.startswith("ray://"):
        return
    try:
        from ray._raylet import GcsClient  # a private class of Ray's: if it moved, ray.init tells
        from ray.exceptions import AuthenticationError
    except ImportError:
        return
    try:
        with _stderr_dropped():  # its C++ client logs the refusal before it raises it
            GcsClient(address=address, cluster_id=None)
    except AuthenticationError:
        raise
    except Exception:  # noqa: BLE001  (not the token: ray.init retries and says what it is)
        return


@contextlib.contextmanager
def _stderr_dropped() -> Iterator[None]:
    """File descriptor 2 (where Ray's C++ code logs) goes to /dev/null meanwhile."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _token_refused(exc: BaseException) -> bool:
    """Whether a join failed on Ray's token auth: the error or its causes say so (after its retries,
    ray.init raises a ConnectionError from a RuntimeError that quotes the last attempt's traceback)."""
    from ray.exceptions import AuthenticationError

    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, AuthenticationError) or any(m in str(seen) for m in _TOKEN_REFUSED):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _token_fix(exc: BaseException) -> str:
    """What to set for a cluster with token auth, as this process stands (docs/gpus.md)."""
    where = f"in {TOKEN_FILE} here, or in RAY_AUTH_TOKEN or a file RAY_AUTH_TOKEN_PATH names (docs/gpus.md)"
    if not _sends_token():
        return (
            f"the cluster requires Ray's auth token: set {AUTH_MODE_VAR}=token, with the head's token (its "
            f"{TOKEN_FILE}) {where}"
        )
    if NO_TOKEN in str(exc):
        return f"{AUTH_MODE_VAR}=token is set but this machine has no Ray auth token: put the head's {where}"
    return f"the cluster refused this machine's Ray auth token: put the head's {where}"


@contextlib.contextmanager
def _visible_devices(device_ids: Sequence[int] | None) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES=ids while Ray starts (its raylet and workers inherit it), then as before.
    Under a CUDA_VISIBLE_DEVICES of the user's the ids count among its devices, as CUDA numbers them
    (`--gpus 2` under 2,3 is devices 2 and 3, not 0 and 1, which the user left out)."""
    if device_ids is None:
        yield
        return
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(_among_visible(device_ids, previous))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous


def _among_visible(device_ids: Sequence[int], visible: str | None) -> list[str]:
    """The devices `device_ids` name: those ids themselves, or the entries at those places of the
    user's CUDA_VISIBLE_DEVICES (ids or UUIDs); AutotuneError for an id past its end."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if not entries:
        return [str(d) for d in device_ids]
    past = [d for d in device_ids if d >= len(entries)]
    if past:
        raise AutotuneError(
            f"--gpus names device {past[0]}, but CUDA_VISIBLE_DEVICES={visible} leaves {len(entries)} "
            f"(--gpus counts among them: 0 to {len(entries) - 1})"
        )
    return [entries[d] for d in device_ids]


def check_reachable(address: str) -> None:
    """AutotuneError within CONNECT_TIMEOUT_S when nothing listens at the cluster's address."""
    host_port = _host_port(address)
    if host_port is None:
        return  # "auto" with no cluster recorded on this machine: ray.init says so at once
    if not tcp_reachable(*host_port, timeout_s=CONNECT_TIMEOUT_S):
        host, port = host_port
        raise AutotuneError(
            f"cannot join the Ray cluster at {address}: nothing answers at {host}:{port} "
            f"within {CONNECT_TIMEOUT_S:g} s"
        )


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray address: host:port, ray://host:port, or `auto` as Ray resolves it
    (RAY_ADDRESS, or the cluster `ray start` recorded on this machine); None when it cannot say."""
    if address == "auto":
        address = _resolve_auto()
    address = address.removeprefix("ray://")
    host, sep, port = address.rpartition(":")
    if not sep:
        host, port = address, str(DEFAULT_GCS_PORT)
    try:
        return (host.strip("[]"), int(port)) if host and address != "auto" else None
    except ValueError:
        return None


def _resolve_auto() -> str:
    """What Ray makes of `auto` ('auto' again when it would look for a running cluster itself)."""
    with contextlib.suppress(Exception):  # a private helper of Ray's: if it moved, Ray's own error stands
        from ray._private.services import get_ray_address_from_environment

        return str(get_ray_address_from_environment("auto", None) or "auto")
    return "auto"


def tcp_reachable(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connection to host:port opens within `timeout_s`."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def gcs_address() -> tuple[str, int] | None:
    """The (host, port) of the joined cluster's head (its GCS), None when Ray does not say."""
    import ray

    with contextlib.suppress(Exception):
        return _host_port(ray.get_runtime_context().gcs_address)
    return None
