"""The real-server session, shared by the `vllm` (subprocess) and `docker` launchers.

A session starts one server: pick a free port -> launch -> wait for /health while watching the
server (an exit ends the wait at once and is classified from its exit code and log) -> one warm-up
request. Each measurement on it: wait until the server is idle -> scrape /metrics -> run the load
with the load generator (early abort on lost SLOs) while sampling KV-cache usage -> scrape /metrics
again -> compute vllm bench serve's metrics. The server is torn down in `finally` when the session
ends, whatever happened (failure, timeout, Ctrl-C). A launcher only supplies a
`launch(port, log_path) -> ServerHandle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from autotune.backends.failures import BENCHMARK, STARTUP, classify
from autotune.backends.server_metrics import KvSampler, parse_prometheus, scrape_metrics, server_figures
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.core.secrets import scrub
from autotune.measure.metrics import BenchmarkResult
from autotune.measure.result import TrialResult, requests_failed_message
from autotune.measure.slo import Slo
from autotune.measure.steady_state import LOAD_KEYS, load_kind, measure_window

LOG_NAME = "server.log"
LOG_TAIL_LINES = 40
HEALTH_POLL_S = 0.25  # cheap: a refused connection answers at once
IDLE_POLL_S = 0.1
EXIT_SETTLE_S = 1.0  # after failed requests, how long to wait for the server to finish dying
PORT_ATTEMPTS = 2  # a free port can be taken between picking it and the server binding it
WARMUP_PROMPT_LEN = 16
WARMUP_OUTPUT_LEN = 4
WARMUP_REQUEST_ID = 2**31 - 1  # with its own salt too, its prompt shares nothing with any load's
_IN_SERVER_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class ServerHandle(Protocol):
    """A launched server, as the shared path sees it."""

    base_url: str  # http://127.0.0.1:<port>

    def exit_code(self) -> int | None:
        """The exit status once the server has exited (negative: killed by a signal), else None."""
        ...

    def log_text(self) -> str:
        """The server's log so far (its recent part for long logs)."""
        ...

    def stop(self) -> None:
        """Stop the server and release everything it holds. Idempotent; never raises."""
        ...


class LaunchError(Exception):
    """The launcher could not start the server; the message is classified like a server log."""


Launch = Callable[[int, Path], ServerHandle]  # (host port, log file) -> a started server


@dataclass(frozen=True)
class TrialLimits:
    """How long a trial may take."""

    startup_timeout_s: float = 600.0
    benchmark_timeout_s: float = 1800.0
    # Before each measurement: how long the server may take to finish the previous load's requests
    # (vLLM aborts a request whose client left; a server that never gets idle counts as hung).
    idle_timeout_s: float = 300.0


@dataclass
class _Failure:
    kind: FailureKind
    message: str
    benchmark: BenchmarkResult | None = None
    saved_s: float = 0.0  # an early abort's estimate of the load time it spared


@contextlib.contextmanager
def server_session(
    launch: Launch,
    config: EngineConfig,
    limits: TrialLimits,
    trial_dir: Path | None,
    info: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
) -> Iterator[ServerSession]:
    """A server started by `launch` for `config`, for measurements (the Session of the real backends).

    Never raises for a bad config: a failed start is the first measurement's result. The server is
    stopped on exit whatever happened (failure, Ctrl-C: KeyboardInterrupt stops it and propagates).
    `env` is the server's environment: values of its secret variables never reach a result, nor do
    `secrets` (the values of secret flags in its command, see `secret_args`).
    """
    with _log_dir(trial_dir) as log_dir:
        info = dict(info or {})
        if trial_dir is not None:
            info["server_log"] = str(log_dir / LOG_NAME)
        session = ServerSession(launch, config, limits, log_dir / LOG_NAME, info, env, secrets)
        try:
            session.start()
            yield session
        finally:
            session.stop()


class ServerSession:
    """One launched server: started once (launch, /health, warm-up), then measured load by load.

    Every load (the warm-up too) gets its own prompt salt, so no load hits the prefix cache with an
    earlier one's prompts. Before each load the server must be idle: no request running or waiting.
    """

    def __init__(
        self,
        launch: Launch,
        config: EngineConfig,
        limits: TrialLimits,
        log_path: Path,
        info: Mapping[str, Any],
        env: Mapping[str, str] | None,
        secrets: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.limits = limits
        self._launch = launch
        self._log_path = log_path
        self._info = dict(info)
        self._env = env
        self._secrets = tuple(secrets)
        self._handle: ServerHandle | None = None
        self._failure: TrialResult | None = None  # once set, the server is unusable (see `alive`)
        self._startup_s = 0.0  # reported by the first measurement only
        self._salts = itertools.count()

    @property
    def alive(self) -> bool:
        """False once the server failed to start, died or hung."""
        return self._failure is None

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
            self._failure = self._result(None, failure)

    def _launch_once(self, port: int) -> _Failure | None:
        if self._handle is not None:  # a previous attempt's server (its port was taken)
            self._handle.stop()
            self._handle = None
        try:
            self._handle = self._launch(port, self._log_path)
        except LaunchError as exc:
            return _Failure(*classify(None, str(exc), STARTUP))
        return _start(self._handle, self.config.model, self.limits.startup_timeout_s, next(self._salts))

    def measure(self, workload: Any, slos: Sequence[Slo] = (), seed: int = 0) -> TrialResult:
        """Run `workload` on the idle server; the first result carries the startup's GPU time."""
        startup_s, self._startup_s = self._startup_s, 0.0
        if self._failure is not None:
            return dataclasses.replace(self._failure, startup_s=startup_s, info=dict(self._failure.info))
        assert self._handle is not None
        handle = self._handle
        started = time.monotonic()
        benchmark = None
        failure = _wait_idle(handle, self.limits.idle_timeout_s)
        if failure is None:
            salt = next(self._salts)
            model = self.config.model
            benchmark, failure = _benchmark(handle, model, workload, slos, seed, self.limits, salt)
        result = self._result(benchmark, failure)
        result.startup_s, result.benchmark_s = startup_s, time.monotonic() - started
        result.saved_s = failure.saved_s if failure is not None else 0.0
        if failure is not None and (
            failure.kind is FailureKind.BENCHMARK_TIMEOUT or handle.exit_code() is not None
        ):
            # Died or hung: later measurements get this failure, without a load or GPU time.
            self._failure = dataclasses.replace(result, benchmark=None, startup_s=0.0, benchmark_s=0.0)
            self._failure.info = {**result.info, "failed_in_earlier_measurement": True}
        return result

    def _result(self, benchmark: BenchmarkResult | None, failure: _Failure | None) -> TrialResult:
        """A TrialResult of this server (times are set by the caller), scrubbed of secrets."""
        result = TrialResult(config=self.config, benchmark=benchmark, info=dict(self._info))
        if benchmark is not None:
            result.info["num_gpu_blocks"] = benchmark.server.get("num_gpu_blocks")
            # How the load was kept up with is about the trial, not the server's counters.
            result.info.update({k: benchmark.server.pop(k) for k in LOAD_KEYS if k in benchmark.server})
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


def _start(handle: ServerHandle, model: str, timeout_s: float, salt: int) -> _Failure | None:
    """Wait for /health, then send one warm-up request; a failure if the server did not come up."""
    deadline = time.monotonic() + timeout_s
    failure = _wait_healthy(handle, timeout_s)
    if failure is not None:
        return failure
    left = max(deadline - time.monotonic(), 1.0)
    warmup = _load(handle.base_url, model, [_warmup_request()], None, None, left, left, salt=salt)
    if warmup is not None and warmup.records and warmup.records[0].success:
        return None
    code = _settled_exit_code(handle)
    if code is not None:
        return _Failure(*classify(code, handle.log_text(), STARTUP))
    if warmup is None:
        return _Failure(
            FailureKind.STARTUP_TIMEOUT, f"the warm-up request did not finish within {timeout_s:g} s"
        )
    error = warmup.records[0].error if warmup.records else "no answer"
    return _Failure(FailureKind.ERROR, f"the warm-up request failed: {error}")


def _wait_healthy(handle: ServerHandle, timeout_s: float) -> _Failure | None:
    def healthy(client: httpx.Client) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return client.get(handle.base_url + "/health").status_code == 200
        return False

    def silent() -> _Failure:
        return _Failure(FailureKind.STARTUP_TIMEOUT, f"/health did not answer within {timeout_s:g} s")

    return _poll(handle, STARTUP, timeout_s, HEALTH_POLL_S, healthy, silent)


def _wait_idle(handle: ServerHandle, timeout_s: float) -> _Failure | None:
    """Wait until no request is running or waiting on the server (a previous load's leftovers, e.g.
    after an early abort, would slow this one down); a failure if it died or stayed busy."""
    busy: float | None = None

    def idle(client: httpx.Client) -> bool:
        nonlocal busy
        busy = _requests_in_server(client, handle.base_url)
        return busy == 0

    def stuck() -> _Failure:
        state = "did not answer /metrics" if busy is None else f"still had {busy:g} requests"
        message = f"the server {state} {timeout_s:g} s after the previous load"
        return _Failure(FailureKind.BENCHMARK_TIMEOUT, message)

    return _poll(handle, BENCHMARK, timeout_s, IDLE_POLL_S, idle, stuck)


def _poll(
    handle: ServerHandle,
    phase: str,
    timeout_s: float,
    every_s: float,
    ready: Callable[[httpx.Client], bool],
    timed_out: Callable[[], _Failure],
) -> _Failure | None:
    """Ask `ready` every `every_s` until it holds; the failure if the server exits first (classified
    as in `phase`) or `timed_out()` once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while True:
            code = handle.exit_code()
            if code is not None:
                return _Failure(*classify(code, handle.log_text(), phase))
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


def _benchmark(
    handle: ServerHandle,
    model: str,
    workload: Any,
    slos: Sequence[Slo],
    seed: int,
    limits: TrialLimits,
    salt: int,
) -> tuple[BenchmarkResult | None, _Failure | None]:
    """Run the workload; the metrics when it completed, else the (possibly partial) failure."""
    from autotune.measure.early_abort import SloGuard

    requests = workload.requests(seed)
    measure_from = getattr(workload, "measure_from", 0.0)
    measured_lens = [r.output_len for r in requests if r.arrival_time >= measure_from]
    guard = SloGuard.for_requests(slos, measured_lens) if slos else None
    before = scrape_metrics(handle.base_url)
    sampler = KvSampler(handle.base_url)
    started = time.monotonic()
    load = _load(
        handle.base_url,
        model,
        requests,
        getattr(workload, "max_concurrency", None),
        guard,
        request_timeout_s=limits.benchmark_timeout_s,
        total_timeout_s=limits.benchmark_timeout_s,
        sampler=sampler,
        salt=salt,
        measure_from=measure_from,
    )
    if load is None:
        code = _settled_exit_code(handle, settle_s=0.0)
        if code is not None:
            return None, _Failure(*classify(code, handle.log_text(), BENCHMARK))
        return None, _Failure(
            FailureKind.BENCHMARK_TIMEOUT,
            f"the benchmark did not finish within {limits.benchmark_timeout_s:g} s",
        )
    after = scrape_metrics(handle.base_url)
    server = server_figures(before, after, sampler.peak_kv)
    duration = load.duration or (time.monotonic() - started)
    kind = load_kind(requests, getattr(workload, "max_concurrency", None))
    metrics, load_info = measure_window(load.records, duration, measure_from, slos, server, kind)
    metrics.server.update(load_info)  # moved to the trial's info by _result
    return metrics, _judge(handle, load, metrics, [r.arrival_time for r in requests], limits)


def _judge(
    handle: ServerHandle, load: Any, metrics: BenchmarkResult, arrivals: Sequence[float], limits: TrialLimits
) -> _Failure | None:
    """Turn a finished load into a failure when the server died, stopped serving, or the run aborted."""
    failed = [r for r in load.records if not r.success]
    if failed:
        code = _settled_exit_code(handle)
        if code is not None:
            kind, message = classify(code, handle.log_text(), BENCHMARK)
            return _Failure(
                kind, f"{message} ({len(failed)} of {len(load.records)} requests failed)", metrics
            )
        # A run where the server refused requests is never feasible (the others' metrics look fine).
        return _Failure(
            FailureKind.REQUESTS_FAILED, requests_failed_message(failed, len(load.records)), metrics
        )
    if load.aborted:
        from autotune.measure.early_abort import abort_savings

        unfinished = load.cancelled + load.not_sent
        saved_s = abort_savings(load.records, arrivals, load.duration, unfinished, limits.benchmark_timeout_s)
        return _Failure(FailureKind.EARLY_ABORT, load.aborted, metrics, saved_s)
    return None


def _settled_exit_code(handle: ServerHandle, settle_s: float = EXIT_SETTLE_S) -> int | None:
    """The exit code, waiting briefly: clients see a dying server's socket close before it is reaped."""
    deadline = time.monotonic() + settle_s
    while True:
        code = handle.exit_code()
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(0.05)


def _load(
    base_url: str,
    model: str,
    requests: Sequence[Any],
    max_concurrency: int | None,
    guard: Any,
    request_timeout_s: float,
    total_timeout_s: float | None = None,
    sampler: KvSampler | None = None,
    salt: int = 0,
    measure_from: float = 0.0,
) -> Any:
    """Run the load generator (in its own event loop); None when `total_timeout_s` ran out."""
    from autotune.measure.loadgen import run_load

    async def main() -> Any:
        sampling = asyncio.create_task(sampler.run()) if sampler is not None else None
        try:
            return await asyncio.wait_for(
                run_load(
                    base_url,
                    model,
                    requests,
                    max_concurrency=max_concurrency,
                    request_timeout_s=request_timeout_s,
                    guard=guard,
                    salt=salt,
                    measure_from=measure_from,
                ),
                timeout=total_timeout_s,
            )
        except TimeoutError:
            return None
        finally:
            if sampling is not None:
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling

    return asyncio.run(main())


def _warmup_request() -> Any:
    from autotune.workloads.spec import Request

    return Request(request_id=WARMUP_REQUEST_ID, prompt_len=WARMUP_PROMPT_LEN, output_len=WARMUP_OUTPUT_LEN)


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
