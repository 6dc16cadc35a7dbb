"""The Docker engine as the `docker` backend sees it: its client, its refusals, its loss mid-run, and
the containers that dead owners left on it.

A refusal to create or start a container is the trial's failure (LaunchError, worded as the engine
words it); no answer at all, once the run found the engine there, is EngineLost: the run stops.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

from autotune.backends.server import LaunchError
from autotune.core.errors import AutotuneError, SetupLost
from autotune.core.procs import pid_alive

LABEL_TRIAL = "autotune.trial"
LABEL_OWNER_PID = "autotune.owner_pid"
LABEL_OWNER_HOST = "autotune.owner_host"
REAPED_STATES = ("exited", "dead")
# A stopping engine first stops its containers (their servers crash, maybe with exit code 0), then
# answers for a moment more: so long a crashed trial's engine is watched before the crash counts as
# the config's (check_engine).
ENGINE_GONE_WITHIN_S = 5.0
ENGINE_POLL_S = 0.2
# The engine's answer when a container asks for GPUs and no runtime can give them: the same for every
# config, so the run halts on it (tune/halt.py) and the message says what to fix.
NO_GPU_DRIVER = "could not select device driver"
NO_GPU_DRIVER_HINT = (
    "the NVIDIA Container Toolkit is not installed or Docker is not configured for it (`docker run "
    "--gpus all ...` fails the same way): install it, run `nvidia-ctk runtime configure --runtime=docker` "
    "and restart Docker"
)


class EngineUnreachable(AutotuneError):
    """The Docker engine does not answer (a usage error before a run: no engine to run on)."""


class EngineLost(SetupLost):
    """The Docker engine stopped answering mid-run: no later trial can start, and the trials it cut
    short are not their configs' failures, so the run stops (a resume continues)."""

    what = "the Docker engine"


def docker_client() -> Any:
    """A Docker SDK client for the local engine; EngineUnreachable when it is not reachable."""
    try:
        import docker

        client = docker.from_env(version="auto", timeout=30)
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' errors or FileNotFoundError
        raise EngineUnreachable(f"Docker engine not reachable: {first_line(exc)}") from exc
    return client


def reap_orphans(client: Any = None) -> int:
    """Remove autotune containers on this host whose owner process is dead; returns how many.

    The executor calls this after force-cancelling a trial (the killed worker could not stop its
    container), and each session at its start: also this process's own exited containers, which a
    trial whose Docker engine was lost mid-run could not remove. Containers of live owners (other
    running studies) are left alone.
    """
    import docker

    client = client or docker_client()
    removed = 0
    host = socket.gethostname()
    for container in _labelled_containers(client):
        labels = container.attrs.get("Labels") or {}
        if labels.get(LABEL_OWNER_HOST, host) != host:
            continue
        owner = labels.get(LABEL_OWNER_PID, "")
        # This process's own containers are running trials unless they already exited: one whose
        # stop failed (the engine was lost mid-trial) is left over.
        mine_and_done = owner == str(os.getpid()) and container.attrs.get("State") in REAPED_STATES
        if pid_alive(owner) and not mine_and_done:
            continue
        try:
            container.remove(force=True)
            removed += 1
        except docker.errors.APIError:
            pass  # removed concurrently (NotFound), or its removal is under way (409)
    return removed


def _labelled_containers(client: Any) -> list[Any]:
    """The containers with autotune's owner label, as the engine's list gives them.

    Sparse: the SDK would otherwise inspect each one, and one that a concurrent trial removed between
    the list and its inspection would raise NotFound (labels and state are in the list's answer).
    """
    return client.containers.list(all=True, filters={"label": LABEL_OWNER_PID}, sparse=True)


def check_engine(client: Any) -> None:
    """EngineLost when the engine stops answering within ENGINE_GONE_WITHIN_S (after a failed server:
    the engine stopping may be what failed it)."""
    deadline = time.monotonic() + ENGINE_GONE_WITHIN_S
    while True:
        try:
            client.ping()
        except engine_errors() as exc:
            raise EngineLost(f"the Docker engine stopped answering mid-trial: {first_line(exc)}") from None
        if time.monotonic() >= deadline:
            return
        time.sleep(ENGINE_POLL_S)


def engine_errors() -> tuple[type[BaseException], ...]:
    """What the SDK raises when the engine does not answer (refused socket, daemon restarting)."""
    import docker
    import requests

    return (docker.errors.DockerException, requests.exceptions.RequestException)


@contextlib.contextmanager
def engine_answers() -> Iterator[None]:
    """Around an SDK call at launch: the engine's refusal is a LaunchError (the trial's failure), no
    answer at all is EngineLost (the run's: the engine answered at the run's start)."""
    import docker

    try:
        yield
    except docker.errors.APIError as exc:
        raise launch_error(exc) from exc
    except engine_errors() as exc:
        raise EngineLost(f"the Docker engine stopped answering mid-trial: {first_line(exc)}") from exc


def launch_error(exc: Any) -> LaunchError:
    """The engine's refusal to create or start a container, as the engine words it.

    The SDK's own text leads with the request's URL, which holds the container's id: every trial's
    message would differ and the run would not halt on a refusal that fails them all alike.
    """
    explanation = str(exc.explanation or "").strip()
    if not explanation:
        return LaunchError(first_line(exc))
    message = f"Docker error: {explanation.splitlines()[0]}"
    if NO_GPU_DRIVER in explanation:
        message += f": {NO_GPU_DRIVER_HINT}"
    return LaunchError(message)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
