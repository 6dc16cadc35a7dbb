"""What every backend offers and returns: sessions on a started server, TrialResult, failure kinds.

A backend starts a server for a config once per `session(...)`; each `measure(...)` on the session
runs one load on that running server. A capacity search measures several rates in one session, so a
trial pays one startup (minutes on a GPU) instead of one per rate. `evaluate(...)` is one session with
one measurement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from autotune.config import EngineConfig
from autotune.metrics import BenchmarkResult
from autotune.slo import Slo


class FailureKind(StrEnum):
    """Why a trial produced no usable benchmark. The tuner tells each as a constraint violation."""

    INVALID_CONFIG = "invalid_config"  # vLLM rejected the flags (scheduler/config validation)
    KV_CACHE_OOM = "kv_cache_oom"  # no memory for KV blocks / max-length request does not fit
    STARTUP_OOM = "startup_oom"  # CUDA OOM while starting (profiling, CUDA graphs, sampler warm-up)
    OOM_UNDER_LOAD = "oom_under_load"  # CUDA OOM while serving
    CRASHED = "crashed"  # the server died mid-run
    STARTUP_TIMEOUT = "startup_timeout"  # /health never answered in time
    BENCHMARK_TIMEOUT = "benchmark_timeout"  # the load did not finish in time
    PORT_IN_USE = "port_in_use"
    REQUESTS_FAILED = "requests_failed"  # the server answered some requests with an error (e.g. too long)
    EARLY_ABORT = "early_abort"  # stopped early: the SLOs could no longer be met (partial metrics kept)
    ERROR = "error"  # anything else


@dataclass
class TrialResult:
    """The outcome of evaluating one config: a benchmark, or a failure with its reason."""

    config: EngineConfig
    benchmark: BenchmarkResult | None = None
    failure: FailureKind | None = None
    message: str = ""  # one line: the vLLM error message or what went wrong
    log_tail: str = ""  # the last lines of the server log, for failed trials
    startup_s: float = 0.0  # GPU seconds spent starting the server (simulated for the sim backend)
    benchmark_s: float = 0.0  # GPU seconds spent running the load
    saved_s: float = 0.0  # GPU seconds early abort spared (an estimate: see where it is set)
    info: dict[str, Any] = field(default_factory=dict)  # e.g. num_gpu_blocks, resolved flags

    @property
    def ok(self) -> bool:
        """True when the benchmark ran to the end (an early abort is not ok but keeps metrics)."""
        return self.failure is None and self.benchmark is not None

    @property
    def gpu_seconds(self) -> float:
        """Device time this trial cost, per GPU."""
        return self.startup_s + self.benchmark_s


def requests_failed_message(failed: Sequence[Any], total: int) -> str:
    """One line for a run where requests failed: how many, and the first error (the server's words)."""
    first = " ".join(str(getattr(failed[0], "error", "") or "no answer").split())[:300]
    return f"{len(failed)} of {total} requests failed: {first}"


class Session(Protocol):
    """A started server for one config. Entering `backend.session(...)` starts it (never raising for
    a bad config) and leaving stops it, whatever happened (failure, Ctrl-C).

    The first measurement's result carries the startup's GPU time (`startup_s`), later ones only their
    own `benchmark_s`. A server that failed to start, died or hung is not relaunched: `alive` turns
    False and every later `measure` returns that failure again (with no GPU time).
    """

    @property
    def alive(self) -> bool:
        """False once the server failed to start, died or hung."""
        ...

    def measure(self, workload: Any, slos: Sequence[Slo] = (), seed: int = 0) -> TrialResult:
        """Run `workload` on the running server (idle beforehand); a failure is the result, not raised."""
        ...


class Backend(ABC):
    """Evaluates configs on workloads. Must never raise for a bad config: return a failure.

    Backends are plain picklable objects: the executor ships them to Ray workers.
    `gpu_ids` are the devices Ray assigned the trial's task on its node (len == tensor_parallel_size;
    empty for the sim): the backend pins its server to exactly those;
    `trial_dir` is where the backend may write logs (runs/<study>/trials/<n>/), or None.
    """

    @property
    def simulated(self) -> bool:
        """True when the engine behind this backend is autotune's simulator: its GPUs are virtual."""
        return False

    @property
    def runs_servers(self) -> bool:
        """True when a session starts a server process or container that must be torn down."""
        return True

    @property
    def noisy(self) -> bool:
        """True when two measurements of one config can differ (a real GPU always; the sim with noise),
        so the tuner re-measures its top candidates and the baseline before recommending."""
        return True

    @abstractmethod
    def session(
        self, config: EngineConfig, gpu_ids: Sequence[int] = (), trial_dir: Path | None = None
    ) -> AbstractContextManager[Session]:
        """A server started for `config`, for one or more measurements (see Session)."""

    def evaluate(
        self,
        config: EngineConfig,
        workload: Any,
        slos: Sequence[Slo] = (),
        seed: int = 0,
        gpu_ids: Sequence[int] = (),
        trial_dir: Path | None = None,
    ) -> TrialResult:
        """One session with one measurement: start a server for `config`, run `workload`, stop it."""
        with self.session(config, gpu_ids, trial_dir) as session:
            return session.measure(workload, slos, seed)
