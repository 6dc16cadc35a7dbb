"""What every backend offers: sessions on a started server, each measurement a TrialResult.

A backend starts a server for a config once per `session(...)`; each `measure(...)` on the session
runs one load on that running server. A capacity search measures several rates in one session, so a
trial pays one startup (minutes on a GPU) instead of one per rate. `evaluate(...)` is one session with
one measurement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from autotune.core.config import EngineConfig
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.workloads.spec import Request


class Workload(Protocol):
    """What a backend needs of a workload to run it (a WorkloadSpec is one): its requests for a seed,
    the client's concurrency cap, and when the measured window starts (earlier requests are a warm-up)."""

    @property
    def max_concurrency(self) -> int | None:
        """Requests in flight at most (None: no cap)."""
        ...

    @property
    def measure_from(self) -> float:
        """Seconds on the run's clock before which requests are sent but not measured."""
        ...

    def requests(self, seed: int = 0) -> list[Request]:
        """The requests to send, the same list for the same seed."""
        ...


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

    def measure(self, workload: Workload, slos: Sequence[Slo] = (), seed: int = 0) -> TrialResult:
        """Run `workload` on the running server (idle beforehand); a failure is the result, not raised."""
        ...


class Backend(ABC):
    """Evaluates configs on workloads. Must never raise for a bad config: return a failure.

    Backends are plain picklable objects: the executor ships them to Ray workers.
    `gpu_ids` are the devices Ray assigned the trial's task on its node (as many as the config's GPUs,
    core/config.py gpus_per_replica; empty for the sim): the backend pins its server to exactly those;
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
        workload: Workload,
        slos: Sequence[Slo] = (),
        seed: int = 0,
        gpu_ids: Sequence[int] = (),
        trial_dir: Path | None = None,
    ) -> TrialResult:
        """One session with one measurement: start a server for `config`, run `workload`, stop it."""
        with self.session(config, gpu_ids, trial_dir) as session:
            return session.measure(workload, slos, seed)
