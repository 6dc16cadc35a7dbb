"""`autotune bench --capacity`'s progress: a line on stderr as each measurement of the search starts and
ends (on a real GPU the search takes minutes), from a backend wrapper, so the search runs unchanged."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend, Session, Workload
from autotune.core.config import EngineConfig
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.trial.probe import GROSS_SHORTFALL, keeps_up
from autotune.tune.progress import clock


def _to_stderr(line: str) -> None:
    print(f"autotune bench: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Narrated(Backend):
    """`inner`, saying each measurement as it starts and ends."""

    inner: Backend
    say: Callable[[str], None] = field(default=_to_stderr)

    @property
    def simulated(self) -> bool:
        """As the inner backend."""
        return self.inner.simulated

    @property
    def runs_servers(self) -> bool:
        """As the inner backend."""
        return self.inner.runs_servers

    def session(
        self, config: EngineConfig, gpu_ids: Sequence[int] = (), trial_dir: Path | None = None
    ) -> AbstractContextManager[Session]:
        """The inner backend's session, narrated."""

        @contextlib.contextmanager
        def narrated() -> Iterator[Session]:
            with self.inner.session(config, gpu_ids, trial_dir) as session:
                yield _NarratedSession(session, self.say, time.monotonic())

        return narrated()


@dataclass
class _NarratedSession:
    inner: Session
    say: Callable[[str], None]
    started: float
    saturation: float | None = None  # the last burst's saturation throughput: the probes' rule needs it

    @property
    def alive(self) -> bool:
        return self.inner.alive

    def measure(self, workload: Workload, slos: Sequence[Slo] = (), seed: int = 0) -> TrialResult:
        self.say(f"{self._clock()} {describe(workload)}")
        result = self.inner.measure(workload, slos, seed)
        if result.load is not None and result.load.saturation is not None:
            self.saturation = result.load.saturation.throughput
        rate = getattr(workload, "request_rate", math.inf)
        self.say(f"{self._clock()}   {outcome(result, rate, self.saturation)}")
        return result

    def _clock(self) -> str:
        return f"[{clock(time.monotonic() - self.started)}]"


def describe(workload: Any) -> str:
    """What a measurement is about to send: a burst (saturation) or a window at a rate."""
    n = getattr(workload, "num_requests", None)
    rate = getattr(workload, "request_rate", math.inf)
    if math.isinf(rate):
        return f"saturation: {n} requests at once"
    warmup = getattr(workload, "measure_from", 0.0)
    return f"probe at {rate:.2f} req/s: {n} requests, the first {warmup:.0f} s of them a warm-up"


def outcome(result: TrialResult, rate: float = math.inf, saturation: float | None = None) -> str:
    """A measurement's result in a few words: each figure named with what it is taken over (the window's
    arrivals and completions, the completed requests), none shown where nothing was measured. A probe's
    `rate` and the `saturation` throughput tell whether the search's rule kept it up (`_pace`)."""
    bench = result.benchmark
    parts = []
    if bench is not None and bench.completed == 0:
        parts.append("no measured request completed")  # vLLM's 0 req/s and 0 ms say nothing here
    elif bench is not None:
        parts += _pace(result, rate, saturation)
        ttft, itl = bench.latency_ms["ttft"]["p99"], bench.latency_ms["itl"]["p99"]
        # the completed ones only: an early abort also counts requests still waiting (over all sent)
        parts.append(f"p99 TTFT {ttft:.0f} ms, p99 ITL {itl:.0f} ms over its {bench.completed:,} completed")
    if result.failure is not None:
        parts.append(f"{result.failure}: {result.message}")
    return "; ".join(parts) or "no result"


def _pace(result: TrialResult, rate: float, sat_rate: float | None) -> list[str]:
    """How the measurement kept pace: a probe window's arrivals, completions and backlog, or a burst's
    throughputs ([] after an early abort: its cancelled requests are in no count of the window). A
    backlog that grew past the count's allowance on a probe the search's rule kept up (at or below
    `sat_rate`: trial/probe.py `keeps_up`) says so, or the line would read as the probe's failure."""
    bench, load = result.benchmark, result.load
    assert bench is not None
    steady = load.steady if load is not None else None
    saturation = load.saturation if load is not None else None
    if steady is not None and result.failure is None:
        # completions in the window include warm-up requests: they may outnumber its arrivals while the
        # backlog, judged by the trend of the requests in the server, still grew
        grew = (
            "its backlog held"
            if steady.kept_up
            else f"its backlog grew by {steady.backlog_growth:.1%} of arrivals "
            f"({steady.backlog_allowed:.1%} allowed{_by_rule(result, rate, sat_rate)})"
        )
        return [
            f"window: {steady.offered_rate:.2f} req/s sent, {steady.served_rate:.2f} req/s finished "
            f"(warm-up requests included), {grew}"
        ]
    if saturation is not None:
        return [
            f"{bench.request_throughput:.2f} req/s over the burst, {saturation.throughput:.2f} "
            f"while its batch was full (the saturation throughput)"
        ]
    if result.failure is not None:
        return []
    return [f"{bench.request_throughput:.2f} req/s"]


def _by_rule(result: TrialResult, rate: float, saturation: float | None) -> str:
    """ "; kept up by the probe's rule: ..." for a window whose backlog count grew past its allowance yet
    that the capacity search keeps up (at or below saturation, a window fails only on a gross shortfall);
    "" otherwise."""
    steady = result.load.steady if result.load is not None else None
    if (
        steady is None
        or saturation is None
        or not math.isfinite(rate)
        or not keeps_up(result, rate, saturation)
    ):
        return ""
    return (
        f" for the count; kept up by the probe's rule: at or below the saturation throughput, "
        f"{saturation:.2f} req/s, a window fails only when it serves under {GROSS_SHORTFALL:.0%} of its "
        f"arrivals, and this one served {steady.served_share():.1%}"
    )
