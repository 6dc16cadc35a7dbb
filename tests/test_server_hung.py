"""A server that stops answering mid-load (frozen, not dead) ends the measurement in one line, sized to
the silence, not the benchmark's 30-minute limit: a real sim-server on 127.0.0.1, stopped with SIGSTOP."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator

from autotune.backends.remote import _Attached
from autotune.backends.server_load import TrialLimits, benchmark
from autotune.core.errors import FailureKind
from autotune.measure.early_abort import InFlight
from autotune.measure.stall import StallWatch
from autotune.sim_server.process import start_sim_server
from autotune.workloads.spec import LengthDist, WorkloadSpec

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def test_a_frozen_server_is_a_hung_benchmark_once_it_has_been_silent_for_the_stall_limit() -> None:
    workload = WorkloadSpec(
        name="steady",
        num_requests=400,
        request_rate=20.0,  # 20 s of arrivals
        prompt_len=LengthDist("fixed", 64),
        output_len=LengthDist("fixed", 64),
    )
    workload = dataclasses.replace(workload, load="fixed")
    with start_sim_server([MODEL, "--max-model-len", "4096"]) as server:
        freeze = threading.Timer(2.0, os.kill, (server.process.pid, signal.SIGSTOP))
        freeze.start()
        started = time.monotonic()
        try:
            measured = benchmark(
                _Attached(server.base_url), MODEL, workload, [], 0, TrialLimits(stall_timeout_s=3.0), salt=1
            )
        finally:
            freeze.cancel()
            os.kill(server.process.pid, signal.SIGCONT)
    assert measured.failure is not None and measured.failure.kind == FailureKind.BENCHMARK_TIMEOUT
    assert measured.failure.message.startswith("the server sent nothing for 3 s with ")
    assert measured.failure.message.endswith("requests in flight: it hung")
    assert time.monotonic() - started < 20  # the freeze, 3 s of silence and a /metrics timeout: not 1,800 s


def test_a_request_sent_after_a_long_idle_gap_is_not_silence() -> None:
    """At a low rate the server may have said nothing for minutes because nothing was asked: silence
    counts from the oldest request it owes an answer, not from its last byte."""
    watch = StallWatch(stall_s=300.0)
    now = time.perf_counter()
    watch._finished = now - 1000.0  # the last request finished long ago
    assert watch.check([InFlight(start=now - 1.0)], now) is None
    said = watch.check([InFlight(start=now - 300.0)], now + 1.0)
    assert said == "the server sent nothing for 300 s with 1 request in flight: it hung"


def test_the_silence_is_read_once_a_second_not_at_every_finished_request() -> None:
    """The load generator asks at every finish: reading every request in flight each time tripled its
    CPU time on a 3,000-request burst, and a calibration's burst measured 5 % less throughput."""
    watch, read = StallWatch(stall_s=60.0), []
    now = time.perf_counter()

    def in_flight() -> Iterator[InFlight]:
        read.append(1)
        yield InFlight(start=now)

    for i in range(1000):
        assert watch.check(in_flight(), now + i / 1000) is None
    assert len(read) == 1
    watch.check(in_flight(), now + 1.0)
    assert len(read) == 2
