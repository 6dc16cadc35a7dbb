"""The `docker` backend: each session (a trial) runs a `vllm/vllm-openai` container through the Docker SDK.

The container gets the GPUs Ray assigned the trial (ids of the node it runs on) as device requests,
the Hugging Face cache as a volume, host IPC (or a shm size), and its port 8000 published on 127.0.0.1
only. Every container carries the labels `autotune.trial` and `autotune.owner_pid` (+ host), so
`reap_orphans()` (docker_engine.py) can remove the ones whose owner died (a force-cancelled Ray
worker cannot run its `finally`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend
from autotune.backends.docker_engine import (
    LABEL_OWNER_HOST,
    LABEL_OWNER_PID,
    LABEL_TRIAL,
    EngineLost,
    EngineUnreachable,
    check_engine,
    docker_client,
    engine_answers,
    engine_errors,
    first_line,
    reap_orphans,
)
from autotune.backends.failures import LOG_HEADER
from autotune.backends.server import (
    LaunchError,
    ServerSession,
    TrialLimits,
    server_session,
)
from autotune.core.api_keys import SERVER_KEY_VAR, server_api_key
from autotune.core.config import DEFAULT_IMAGE, EngineConfig
from autotune.core.errors import AutotuneError, FailureKind
from autotune.core.secrets import scrub, scrub_args, secret_args
from autotune.measure.server_report import ServerReport

CONTAINER_PORT = 8000
DIRECT_CHECK_S = 1.0  # how long the container's own address may take to accept or refuse a connection
CONTAINER_HF_CACHE = "/root/.cache/huggingface"
# Variables of this process the container gets (by the SDK's environment, never on a command line):
# VLLM_API_KEY makes the server require the key the load generator sends (autotune.core.api_keys).
PASSED_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", SERVER_KEY_VAR)
LOG_FETCH_LINES = 2000  # lines fetched from the engine while the container runs
ENGINE_LOST_EXIT_CODE = 125  # Docker's own exit status for "the daemon failed" (docker run)
# A failed server's engine is checked (check_engine): the engine stopping may be what failed it.
ENGINE_SUSPECTS = (FailureKind.CRASHED,)


@dataclass(frozen=True)
class DockerBackend(Backend):
    """Launches one container of `image` per session, i.e. per trial (its entrypoint: vLLM's API server).

    `load_format_dummy` adds `--load-format dummy` (random weights: no download, same speed);
    `extra_volumes` maps host paths to container paths (read-only); `network_host` uses the host's
    network instead of a published port. `env` adds container variables.
    """

    gpu: str
    image: str = DEFAULT_IMAGE
    startup_timeout_s: float = 600.0
    benchmark_timeout_s: float = 1800.0
    hf_cache: str | None = "~/.cache/huggingface"
    shm_size: str = "16g"
    load_format_dummy: bool = True
    extra_volumes: Mapping[str, str] | None = None
    network_host: bool = False
    env: Mapping[str, str] | None = None
    stop_grace_s: float = 10.0
    _limits: TrialLimits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_volumes", dict(self.extra_volumes or {}))
        object.__setattr__(self, "env", dict(self.env or {}))
        object.__setattr__(self, "_limits", TrialLimits(self.startup_timeout_s, self.benchmark_timeout_s))

    def preflight(self) -> Any:
        """Check the engine and the image (no registry is assumed reachable); returns the client."""
        import docker

        client = docker_client()
        try:
            client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise AutotuneError(
                f"Docker image {self.image!r} is not available locally: pull or build it first"
            ) from None
        return client

    @contextlib.contextmanager
    def session(
        self, config: EngineConfig, gpu_ids: Sequence[int] = (), trial_dir: Path | None = None
    ) -> Iterator[ServerSession]:
        """A container for `config`, for one or more measurements (see autotune.backends.server).

        EngineLost when the engine does not answer at the start, or after the server failed: the run's
        preflight found it there, so it was lost mid-run and the failure is not the config's.
        """
        try:
            client = self.preflight()
        except EngineUnreachable as exc:
            raise EngineLost(str(exc)) from None
        try:
            reap_orphans(client)  # containers of dead owners, or of an earlier trial the engine lost

            def launch(port: int, log_path: Path) -> _Container:
                return self._launch(client, config, port, gpu_ids, log_path)

            command = self.command(config, CONTAINER_PORT)
            report = ServerReport(image=self.image, command=tuple(scrub_args(command)))
            env = {**os.environ, **(self.env or {})}
            secrets = secret_args(command)
            with server_session(launch, config, self._limits, trial_dir, report, env, secrets) as session:
                yield session
            if session.failure in ENGINE_SUSPECTS:
                check_engine(client)
        finally:
            client.close()

    def command(self, config: EngineConfig, port: int) -> list[str]:
        """The API server's arguments inside the container (`--model X --flag ...`).

        On a published port the server listens on all the container's interfaces; on the host's
        network it listens on the trial's own port, on loopback only.
        """
        model, *flags = config.to_args()
        args = ["--model", model, *flags]
        if self.load_format_dummy and "load_format" not in config.extra:
            args += ["--load-format", "dummy"]
        host = "127.0.0.1" if self.network_host else "0.0.0.0"
        return [*args, "--port", str(port), "--host", host]

    def _launch(
        self, client: Any, config: EngineConfig, port: int, gpu_ids: Sequence[int | str], log_path: Path
    ) -> _Container:
        options = self._run_options(gpu_ids, port)
        inside_port = port if self.network_host else CONTAINER_PORT
        with engine_answers():
            container = client.containers.create(self.image, self.command(config, inside_port), **options)
        scrubbing = ({**os.environ, **(self.env or {})}, secret_args(self.command(config, port)))
        api_key = server_api_key(self.command(config, inside_port), options["environment"])
        handle = _Container(
            container, f"http://127.0.0.1:{port}", log_path, self.stop_grace_s, scrubbing, api_key
        )
        # The first line of the log, as a `vllm serve` trial's (backends/process.py): the image, the
        # devices it was given and its command, secrets masked.
        devices = f"--gpus device={','.join(str(g) for g in gpu_ids)} " if gpu_ids else ""
        command = " ".join(scrub_args(self.command(config, inside_port)))
        handle.header = f"{LOG_HEADER}docker run {devices}{self.image} {command}\n"
        log_path.write_text(handle.header)
        try:
            with engine_answers():
                container.start()
        except (LaunchError, EngineLost):
            handle.stop()
            raise
        if not self.network_host:
            handle.base_url = _direct_url(container) or handle.base_url
        return handle

    def _run_options(self, gpu_ids: Sequence[int | str], port: int) -> dict[str, Any]:
        import docker

        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(self.env or {})
        env["AUTOTUNE_SIM_GPU"] = self.gpu
        volumes = {
            host: {"bind": inside, "mode": "ro"} for host, inside in (self.extra_volumes or {}).items()
        }
        if self.hf_cache:
            cache = Path(self.hf_cache).expanduser()
            cache.mkdir(parents=True, exist_ok=True)  # else the engine creates it owned by root
            volumes[str(cache)] = {"bind": CONTAINER_HF_CACHE, "mode": "rw"}
        options: dict[str, Any] = {
            "environment": env,
            "volumes": volumes,
            "labels": {
                LABEL_TRIAL: uuid.uuid4().hex,
                LABEL_OWNER_PID: str(os.getpid()),
                LABEL_OWNER_HOST: socket.gethostname(),
            },
            "detach": True,
        }
        if self.shm_size:
            options["shm_size"] = self.shm_size
        else:
            options["ipc_mode"] = "host"  # PyTorch's shared memory between vLLM's processes
        if gpu_ids:
            options["device_requests"] = [
                docker.types.DeviceRequest(device_ids=[str(g) for g in gpu_ids], capabilities=[["gpu"]])
            ]
        if self.network_host:
            options["network_mode"] = "host"
        else:
            options["ports"] = {f"{CONTAINER_PORT}/tcp": ("127.0.0.1", port)}
        return options


def _direct_url(container: Any) -> str | None:
    """The server's URL at the container's own address on its bridge network, when this host reaches it
    (a Linux engine of this machine; not Docker Desktop's VM nor rootless Docker's namespace): the load
    then bypasses the published port's proxy (docker-proxy), which dropped every request of a 4,096-request
    burst (vLLM's defaults' saturation run) that the container's own address served in full. Reached
    means a connection is accepted or refused at once: the server is not listening yet."""
    with contextlib.suppress(*engine_errors(), KeyError, TypeError):
        container.reload()
        networks = container.attrs["NetworkSettings"]["Networks"].values()
        address = next((n["IPAddress"] for n in networks if n.get("IPAddress")), None)
        if address is None:
            return None
        try:
            socket.create_connection((address, CONTAINER_PORT), timeout=DIRECT_CHECK_S).close()
        except ConnectionRefusedError:
            pass  # routed to the container: nothing listens there yet
        except OSError:
            return None  # unreachable from this host: the published port it is
        return f"http://{address}:{CONTAINER_PORT}"
    return None


class _Container:
    """A running container (the ServerHandle of the `docker` backend)."""

    def __init__(
        self,
        container: Any,
        base_url: str,
        log_path: Path,
        grace_s: float,
        scrubbing: tuple[Mapping[str, str], Sequence[str]] = ({}, ()),
        api_key: str | None = None,
    ) -> None:
        self.container = container
        self.scrubbing = scrubbing  # (environment, secret flag values): masked in the saved log
        self.base_url = base_url
        self.log_path = log_path
        self.grace_s = grace_s
        self._stopped = False
        self.engine_lost = ""  # why the Docker engine stopped answering mid-trial, once it did
        self.header = ""  # the log's first line: what was launched (LOG_HEADER)
        self.api_key = api_key  # the key its command or environment requires

    def exit_code(self) -> int | None:
        import docker

        try:
            self.container.reload()
        except docker.errors.NotFound:
            return -9  # removed behind our back: as good as killed
        except engine_errors() as exc:
            # The daemon went away (restart, crash): the trial is lost; its container is reaped at the
            # next session's start (reap_orphans), if the daemon kept it.
            self.engine_lost = first_line(exc)
            return ENGINE_LOST_EXIT_CODE
        if self.container.status in ("exited", "dead"):
            return int(self.container.attrs["State"]["ExitCode"])
        return None

    def log_text(self) -> str:
        if self._stopped:
            text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        else:
            text = self._fetch_logs(tail=LOG_FETCH_LINES)
        if self.engine_lost:
            text += f"\nERROR autotune: Docker engine lost mid-trial: {self.engine_lost}\n"
        return text

    def _fetch_logs(self, tail: int | str = "all") -> str:
        try:
            return self.container.logs(stdout=True, stderr=True, tail=tail).decode("utf-8", errors="replace")
        except engine_errors():
            return ""

    def stop(self) -> None:
        """Stop (SIGTERM, then SIGKILL after the grace period), save the logs, remove the container."""
        if self._stopped:
            return
        import docker

        try:
            # Already gone or exited: remove(force=True) below settles it; an engine that is gone
            # cannot stop it (reap_orphans removes it at the next start).
            with contextlib.suppress(docker.errors.APIError, *engine_errors()):
                self.container.stop(timeout=int(self.grace_s))
            self.log_path.write_text(self.header + scrub(self._fetch_logs(), *self.scrubbing))
        finally:
            with contextlib.suppress(docker.errors.APIError, *engine_errors()):
                self.container.remove(force=True)
            self._stopped = True
