"""Measuring on a running server, for the real-server session (autotune/backends/server.py).

One measurement: scrape /metrics -> run the load with the load generator (early abort on lost SLOs)
while sampling KV-cache usage -> scrape /metrics again -> compute vllm bench serve's metrics and judge
how the load went (autotune/measure/steady_state.py) -> turn a server that died, refused requests or
lost its SLOs into a failure with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from autotune.backends.base import Workload
from autotune.backends.failures import BENCHMARK, classify
from autotune.backends.server_metrics import KvSampler, scrape_metrics, server_figures
from autotune.core.api_keys import client_api_key
from autotune.core.errors import FailureKind
from autotune.measure.early_abort import InFlight, LoadGuard, SloGuard, abort_savings
from autotune.measure.load_report import LoadReport
from autotune.measure.metrics import BenchmarkResult, RequestRecord
from autotune.measure.result import requests_failed_message
from autotune.measure.slo import Slo
from autotune.measure.stall import StallWatch, is_hung
from autotune.measure.steady_state import load_kind, measure_window
from autotune.workloads.spec import Request

if TYPE_CHECKING:
    from autotune.measure.loadgen import LoadResult

EXIT_SETTLE_S = 1.0  # after failed requests, how long to wait for the server to finish dying
EXIT_POLL_S = 0.5  # after a failed request, how often a load asks whether the server process is alive
SERVER_EXITED = "the server exited during the load"
WARMUP_PROMPT_LEN = 16
WARMUP_OUTPUT_LEN = 4
WARMUP_REQUEST_ID = 2**31 - 1  # with its own salt too, its prompt shares nothing with any load's


class ServerHandle(Protocol):
    """A launched server, as the shared path sees it."""

    base_url: str  # http://127.0.0.1:<port>
    api_key: str | None  # the key it was launched to require (None: unknown; the client's own is sent)

    def exit_code(self) -> int | None:
        """The exit status once the server has exited (negative: killed by a signal), else None."""
        ...

    def log_text(self) -> str:
        """The server's log so far (its recent part for long logs)."""
        ...

    def stop(self) -> None:
        """Stop the server and release everything it holds. Idempotent; never raises."""
        ...


@dataclass(frozen=True)
class TrialLimits:
    """How long a trial may take, and whether a load that lost its SLOs ends early."""

    startup_timeout_s: float = 600.0
    benchmark_timeout_s: float = 1800.0
    # Before each measurement: how long the server may take to finish the previous load's requests
    # (vLLM aborts a request whose client left; a server that never gets idle counts as hung).
    idle_timeout_s: float = 300.0
    early_abort: bool = True  # off: every request is measured even once an SLO cannot be met any more
    stall_timeout_s: float = 300.0  # no byte from the server this long, requests in flight: hung


@dataclass
class ServerFailure:
    """Why a server could not be measured: its kind, one line, and what was measured before it."""

    kind: FailureKind
    message: str
    benchmark: BenchmarkResult | None = None
    saved_s: float = 0.0  # an early abort's estimate of the load time it spared


@dataclass
class Measurement:
    """One load on the server: its metrics and load report when it ran to the end of its requests
    (an early abort included), and the failure, if any."""

    benchmark: BenchmarkResult | None = None
    load: LoadReport | None = None
    failure: ServerFailure | None = None


def benchmark(
    handle: ServerHandle,
    model: str,
    workload: Workload,
    slos: Sequence[Slo],
    seed: int,
    limits: TrialLimits,
    salt: int,
) -> Measurement:
    """Run the workload; the metrics when it completed, else the (possibly partial) failure."""
    requests = workload.requests(seed)
    measure_from = workload.measure_from
    measured_lens = [r.output_len for r in requests if r.arrival_time >= measure_from]
    slo_guard = SloGuard.for_requests(slos, measured_lens) if slos and limits.early_abort else None
    guard = ServerWatch(handle, slo_guard, limits.stall_timeout_s)
    before = scrape_metrics(handle.base_url)
    sampler = KvSampler(handle.base_url)
    started = time.monotonic()
    load = run_load(
        handle.base_url,
        model,
        requests,
        workload.max_concurrency,
        guard,
        request_timeout_s=limits.benchmark_timeout_s,
        total_timeout_s=limits.benchmark_timeout_s,
        sampler=sampler,
        salt=salt,
        measure_from=measure_from,
        api_key=handle.api_key,
    )
    if load is None:
        code = settled_exit_code(handle, settle_s=0.0)
        if code is not None:
            return Measurement(failure=ServerFailure(*classify(code, handle.log_text(), BENCHMARK)))
        message = f"the benchmark did not finish within {limits.benchmark_timeout_s:g} s"
        return Measurement(failure=ServerFailure(FailureKind.BENCHMARK_TIMEOUT, message))
    after = scrape_metrics(handle.base_url)
    server = server_figures(before, after, sampler.peak_kv, sampler.peak_running)
    duration = load.duration or (time.monotonic() - started)
    kind = load_kind(requests, workload.max_concurrency)
    metrics, report = measure_window(load.records, duration, measure_from, slos, server, kind)
    failure = _judge(handle, load, metrics, [r.arrival_time for r in requests], limits)
    return Measurement(metrics, report, failure)


def _judge(
    handle: ServerHandle,
    load: LoadResult,
    metrics: BenchmarkResult,
    arrivals: Sequence[float],
    limits: TrialLimits,
) -> ServerFailure | None:
    """Turn a finished load into a failure when the server died, stopped serving, or the run aborted."""
    failed = [r for r in load.records if not r.success]
    if failed or load.aborted == SERVER_EXITED:
        code = settled_exit_code(handle)
        if code is not None:
            kind, message = classify(code, handle.log_text(), BENCHMARK)
            return ServerFailure(
                kind, f"{message} ({len(failed)} of {len(load.records)} requests failed)", metrics
            )
        # A run where the server refused requests is never feasible (the others' metrics look fine).
        return ServerFailure(
            FailureKind.REQUESTS_FAILED, requests_failed_message(failed, len(load.records)), metrics
        )
    if is_hung(load.aborted):
        return ServerFailure(FailureKind.BENCHMARK_TIMEOUT, load.aborted, metrics)
    if load.aborted:
        unfinished = load.cancelled + load.not_sent
        saved_s = abort_savings(load.records, arrivals, load.duration, unfinished, limits.benchmark_timeout_s)
        return ServerFailure(FailureKind.EARLY_ABORT, load.aborted, metrics, saved_s)
    return None


class ServerWatch:
    """The load's guard: the SLO guard's verdict, and a server process that exited ends the load at once
    (its remaining requests would only be refused, one arrival at a time), as does one that sent nothing
    for `stall_s` with measured requests in flight (measure.stall). The process is asked only once a request
    (warm-up or measured) failed: asking a container's state is a Docker API call, kept off a healthy
    load's event loop."""

    def __init__(self, handle: ServerHandle, slos: SloGuard | None, stall_s: float = math.inf) -> None:
        self.handle = handle
        self.slos = slos
        self.stall = StallWatch(stall_s)
        self._failed = False
        self._polled = 0.0

    def add(self, record: RequestRecord) -> None:
        """A measured request finished."""
        self.warmup(record)
        if self.slos is not None:
            self.slos.add(record)

    def warmup(self, record: RequestRecord) -> None:
        """A warm-up request finished: a failed one may mean the server is gone, too (a warm-up can be
        long: a server dead at its start would otherwise be found only once measuring begins)."""
        self._failed |= not record.success
        self.stall.warmup(record)

    def check(self, in_flight: Iterable[InFlight] = (), now: float = 0.0) -> str | None:
        """Why the load must stop now, or None."""
        if self._failed and time.monotonic() - self._polled >= EXIT_POLL_S:
            self._polled = time.monotonic()
            if self.handle.exit_code() is not None:
                return SERVER_EXITED
        if self.slos is None:
            return self.stall.check(in_flight, now)
        views = list(in_flight)
        return self.stall.check(views, now) or self.slos.check(views, now)


def settled_exit_code(handle: ServerHandle, settle_s: float = EXIT_SETTLE_S) -> int | None:
    """The exit code, waiting briefly: clients see a dying server's socket close before it is reaped."""
    deadline = time.monotonic() + settle_s
    while True:
        code = handle.exit_code()
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(0.05)


def run_load(
    base_url: str,
    model: str,
    requests: Sequence[Request],
    max_concurrency: int | None,
    guard: LoadGuard | None,
    request_timeout_s: float,
    total_timeout_s: float | None = None,
    sampler: KvSampler | None = None,
    salt: int = 0,
    measure_from: float = 0.0,
    api_key: str | None = None,
) -> LoadResult | None:
    """Run the load generator (in its own event loop); None when `total_timeout_s` ran out.

    Requests carry `api_key` (the key the server was launched with), else this process's VLLM_API_KEY
    or OPENAI_API_KEY (autotune.core.api_keys).
    """
    from autotune.measure import loadgen  # httpx's streaming stack: imported when a load runs

    async def main() -> LoadResult | None:
        sampling = asyncio.create_task(sampler.run()) if sampler is not None else None
        try:
            return await asyncio.wait_for(
                loadgen.run_load(
                    base_url,
                    model,
                    requests,
                    max_concurrency=max_concurrency,
                    request_timeout_s=request_timeout_s,
                    guard=guard,
                    salt=salt,
                    measure_from=measure_from,
                    api_key=api_key or client_api_key(),
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


def warmup_request() -> Request:
    """The one short request that shows a server serves (before its first load)."""
    return Request(request_id=WARMUP_REQUEST_ID, prompt_len=WARMUP_PROMPT_LEN, output_len=WARMUP_OUTPUT_LEN)
