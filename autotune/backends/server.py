"""The real-server session, shared by the `vllm` (subprocess) and `docker` launchers: launching a server.

A session starts one server: pick a free port -> launch -> wait for /health while watching the
server (an exit ends the wait at once and is classified from its exit code and log) -> one warm-up
request. Each measurement on it waits until the server is idle, then runs the load
(autotune/backends/server_load.py: metrics, load report, failure). The server is torn down in `finally`
when the session ends, whatever happened (failure, timeout, Ctrl-C). A launcher only supplies a
`launch(port, log_path) -> ServerHandle`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from autotune.backends.base import Workload
from autotune.backends.failures import BENCHMARK, STARTUP, classify
from autotune.backends.server_load import (
    Measurement,
    ServerFailure,
    ServerHandle,
    TrialLimits,
    benchmark,
    run_load,
    settled_exit_code,
    warmup_request,
)
from autotune.backends.server_metrics import parse_prometheus
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.core.secrets import scrub
from autotune.measure.result import TrialResult
from autotune.measure.server_report import EngineFacts, ServerReport
from autotune.measure.slo import Slo
from autotune.workloads.spec import salt_base

LOG_NAME = "server.log"
LOG_TAIL_LINES = 40
HEALTH_POLL_S = 0.25  # cheap: a refused connection answers at once
IDLE_POLL_S = 0.1
PORT_ATTEMPTS = 2  # a free port can be taken between picking it and the server binding it
_IN_SERVER_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class LaunchError(Exception):
    """The launcher could not start the server; the message is classified like a server log."""


Launch = Callable[[int, Path], ServerHandle]  # (host port, log file) -> a started server


@contextlib.contextmanager
def server_session(
    launch: Launch,
    config: EngineConfig,
    limits: TrialLimits,
    trial_dir: Path | None,
    report: ServerReport | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
) -> Iterator[ServerSession]:
    """A server started by `launch` for `config`, for measurements (the Session of the real backends).

    Never raises for a bad config: a failed start is the first measurement's result. The server is
    stopped on exit whatever happened (failure, Ctrl-C: KeyboardInterrupt stops it and propagates).
    `report` says how it was launched (its command, image). `env` is the server's environment: values
    of its secret variables never reach a result, nor do `secrets` (the values of secret flags in its
    command, see `secret_args`).
    """
    with _log_dir(trial_dir) as log_dir:
        report = report or ServerReport()
        if trial_dir is not None:
            report = dataclasses.replace(report, log_path=str(log_dir / LOG_NAME))
        session = ServerSession(launch, config, limits, log_dir / LOG_NAME, report, env, secrets)
        try:
            session.start()
            yield session
        finally:
            session.stop()


class ServerSession:
    """One launched server: started once (launch, /health, warm-up), then measured load by load.

    Every load (the warm-up too) gets its own prompt salt, so no load hits the prefix cache with an
    earlier one's prompts; the salts count from a random base, so neither does a load on a server an
    earlier process measured (`bench --url` run again). Before each load the server must be idle: no
    request running or waiting.
    """

    def __init__(
        self,
        launch: Launch,
        config: EngineConfig,
        limits: TrialLimits,
        log_path: Path,
        report: ServerReport,
        env: Mapping[str, str] | None,
        secrets: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.limits = limits
        self._launch = launch
        self._log_path = log_path
        self._report = report
        self._env = env
        self._secrets = tuple(secrets)
        self._handle: ServerHandle | None = None
        self._failure: TrialResult | None = None  # once set, the server is unusable (see `alive`)
        self._startup_s = 0.0  # reported by the first measurement only
        self._salts = itertools.count(salt_base())

    @property
    def alive(self) -> bool:
        """False once the server failed to start, died or hung."""
        return self._failure is None

    @property
    def failure(self) -> FailureKind | None:
        """Why the server failed to start, died or hung (None while it serves)."""
        return self._failure.failure if self._failure is not None else None

    @property
    def base_url(self) -> str | None:
        """Where the running server answers (for clients of its own, e.g. autotune calibrate); None
        once it failed."""
        return self._handle.base_url if self._handle is not None and self.alive else None

    def start(self) -> None:
        """Launch the server and wait until it serves; a failure is kept for `measure` to return."""
        started = time.monotonic()
        failure = None
        for _ in range(PORT_ATTEMPTS):
            failure = self._launch_once(free_port())
            if failure is None or failure.kind is not FailureKind.PORT_IN_USE:
                break
        self._startup_s = time.monotonic() - started
        if failure is not None:
            self._failure = self._result(Measurement(failure=failure))

    def _launch_once(self, port: int) -> ServerFailure | None:
        if self._handle is not None:  # a previous attempt's server (its port was taken)
            self._handle.stop()
            self._handle = None
        try:
            self._handle = self._launch(port, self._log_path)
        except LaunchError as exc:
            return ServerFailure(*classify(None, str(exc), STARTUP))
        return _start(self._handle, self.config.api_name, self.limits.startup_timeout_s, next(self._salts))

    def measure(self, workload: Workload, slos: Sequence[Slo] = (), seed: int = 0) -> TrialResult:
        """Run `workload` on the idle server; the first result carries the startup's GPU time."""
        startup_s, self._startup_s = self._startup_s, 0.0
        if self._failure is not None:
            return dataclasses.replace(self._failure, startup_s=startup_s)
        assert self._handle is not None
        handle = self._handle
        started = time.monotonic()
        busy = _wait_idle(handle, self.limits.idle_timeout_s)
        if busy is None:
            salt = next(self._salts)
            measured = benchmark(handle, self.config.api_name, workload, slos, seed, self.limits, salt)
        else:
            measured = Measurement(failure=busy)
        result = self._result(measured)
        result.startup_s, result.benchmark_s = startup_s, time.monotonic() - started
        failure = measured.failure
        result.saved_s = failure.saved_s if failure is not None else 0.0
        if failure is not None and (
            failure.kind is FailureKind.BENCHMARK_TIMEOUT or handle.exit_code() is not None
        ):
            # Died or hung: later measurements get this failure, without a load or GPU time.
            self._failure = dataclasses.replace(
                result, benchmark=None, startup_s=0.0, benchmark_s=0.0, failed_in_earlier_measurement=True
            )
        return result

    def _result(self, measured: Measurement) -> TrialResult:
        """A TrialResult of this server (times are set by the caller), scrubbed of secrets."""
        server = self._report
        if measured.benchmark is not None:
            engine = EngineFacts(num_gpu_blocks=measured.benchmark.server.get("num_gpu_blocks"))
            server = dataclasses.replace(server, engine=engine)
        result = TrialResult(
            config=self.config, benchmark=measured.benchmark, server=server, load=measured.load
        )
        failure = measured.failure
        if failure is not None:
            result.failure = failure.kind
            result.message = scrub(failure.message, self._env, self._secrets)
            result.benchmark = failure.benchmark
            log = self._handle.log_text() if self._handle is not None else failure.message
            result.log_tail = scrub("\n".join(log.splitlines()[-LOG_TAIL_LINES:]), self._env, self._secrets)
        return result

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        if self._handle is not None:
            self._handle.stop()


def _start(handle: ServerHandle, model: str, timeout_s: float, salt: int) -> ServerFailure | None:
    """Wait for /health, then send one warm-up request; a failure if the server did not come up."""
    deadline = time.monotonic() + timeout_s
    failure = _wait_healthy(handle, timeout_s)
    if failure is not None:
        return failure
    left = max(deadline - time.monotonic(), 1.0)
    warmup = run_load(
        handle.base_url, model, [warmup_request()], None, None, left, left, salt=salt, api_key=handle.api_key
    )
    if warmup is not None and warmup.records and warmup.records[0].success:
        return None
    code = settled_exit_code(handle)
    if code is not None:
        return ServerFailure(*classify(code, handle.log_text(), STARTUP))
    if warmup is None:
        return ServerFailure(
            FailureKind.STARTUP_TIMEOUT, f"the warm-up request did not finish within {timeout_s:g} s"
        )
    error = warmup.records[0].error if warmup.records else "no answer"
    return ServerFailure(FailureKind.ERROR, f"the warm-up request failed: {error}")


def _wait_healthy(handle: ServerHandle, timeout_s: float) -> ServerFailure | None:
    def healthy(client: httpx.Client) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return client.get(handle.base_url + "/health").status_code == 200
        return False

    def silent() -> ServerFailure:
        return ServerFailure(FailureKind.STARTUP_TIMEOUT, f"/health did not answer within {timeout_s:g} s")

    return _poll(handle, STARTUP, timeout_s, HEALTH_POLL_S, healthy, silent)


def _wait_idle(handle: ServerHandle, timeout_s: float) -> ServerFailure | None:
    """Wait until no request is running or waiting on the server (a previous load's leftovers, e.g.
    after an early abort, would slow this one down); a failure if it died or stayed busy."""
    busy: float | None = None

    def idle(client: httpx.Client) -> bool:
        nonlocal busy
        busy = _requests_in_server(client, handle.base_url)
        return busy == 0

    def stuck() -> ServerFailure:
        state = "did not answer /metrics" if busy is None else f"still had {busy:g} requests"
        message = f"the server {state} {timeout_s:g} s after the previous load"
        return ServerFailure(FailureKind.BENCHMARK_TIMEOUT, message)

    return _poll(handle, BENCHMARK, timeout_s, IDLE_POLL_S, idle, stuck)


def _poll(
    handle: ServerHandle,
    phase: str,
    timeout_s: float,
    every_s: float,
    ready: Callable[[httpx.Client], bool],
    timed_out: Callable[[], ServerFailure],
) -> ServerFailure | None:
    """Ask `ready` every `every_s` until it holds; the failure if the server exits first (classified
    as in `phase`) or `timed_out()` once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while True:
            code = handle.exit_code()
            if code is not None:
                return ServerFailure(*classify(code, handle.log_text(), phase))
            if ready(client):
                return None
            if time.monotonic() >= deadline:
                return timed_out()
            time.sleep(every_s)


def _requests_in_server(client: httpx.Client, base_url: str) -> float | None:
    """Requests running + waiting by the server's /metrics (0 without those gauges); None: no answer."""
    try:
        response = client.get(base_url + "/metrics")
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return sum(s.value for s in parse_prometheus(response.text) if s.name in _IN_SERVER_GAUGES)


# --- helpers for launchers -----------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_tail(path: Path, max_bytes: int = 1 << 20) -> str:
    """The last `max_bytes` of a log file ('' if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


@contextlib.contextmanager
def _log_dir(trial_dir: Path | None) -> Iterator[Path]:
    """The trial directory (created), or a temporary one removed afterwards."""
    if trial_dir is not None:
        trial_dir = Path(trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        yield trial_dir
        return
    with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
        yield Path(tmp)
