"""Simulated trials on this host's cores: N in flight on worker processes, told in submission order.

A simulated trial is pure CPU work, so on one machine worker processes run it without Ray's start
(seconds) or its memory. Results are handed to the tuner one at a time in the order the trials were
submitted, not the order they finish: the study then sees the same sequence of asks and tells on any
machine and under any load, so a seeded run is reproducible (a trial that finishes early waits for the
older one). The workers are autotune.core.procs.worker_pool's (spawned; Ctrl-C is the driver's, and
cancelling ends them).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.core.procs import end_workers, usable_cpus, worker_pool
from autotune.dispatch.local import LocalExecutor
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.trial.task import SearchPlan, evaluate_trial


@dataclass
class _Job:
    """A submitted trial: what its worker was asked (to ask again), and whether it was asked again."""

    config: EngineConfig
    args: tuple[Any, ...]
    future: Future[TrialResult]
    retried: bool = False


class ProcessExecutor(LocalExecutor):
    """`in_flight` simulated trials at once on up to `processes` worker processes (default: the
    cores, at most `in_flight`), each trial's result told in the order the trials were submitted.
    A worker that dies (killed, out of memory) breaks the pool under every trial in flight, whose
    configs did nothing wrong: they run again once on new workers, and fail only if that dies too."""

    def __init__(
        self,
        backend: Backend,
        workload: Any,
        slos: Sequence[Slo],
        in_flight: int,
        processes: int | None = None,
    ) -> None:
        super().__init__(backend, workload, slos)
        self.capacity = max(1, in_flight)
        self.max_trials = self.capacity
        self.processes = max(1, min(self.capacity, processes or usable_cpus()))
        self._pool: ProcessPoolExecutor | None = None
        self._jobs: dict[int, _Job] = {}  # in submission order

    def describe(self) -> str:
        """Where trials run, for the run's first line."""
        return (
            f"{self.capacity} trials at a time on {self.processes} worker process(es), told in the order "
            "they started (no Ray)"
        )

    def can_start(self, config: EngineConfig | None = None) -> bool:
        """Whether fewer than `capacity` trials are in flight."""
        return len(self._jobs) < self.capacity

    def in_flight(self) -> list[tuple[int, EngineConfig]]:
        """The submitted trials not yet handed back, oldest first."""
        return [(number, job.config) for number, job in self._jobs.items()]

    def submit(
        self,
        number: int,
        config: EngineConfig,
        seed: int,
        trial_dir: Path | None,
        plan: SearchPlan | None = None,
    ) -> None:
        """Start a trial on a worker (the simulator writes no trial files)."""
        if not self.can_start():
            raise RuntimeError("submit() without a free slot: call can_start() first")
        args = (evaluate_trial, self.backend, config, self.workload, self.slos, seed, (), None, plan)
        self._jobs[number] = _Job(config, args, self._submit(args))

    def wait(self, timeout: float) -> list[tuple[int, TrialResult]]:
        """Up to `timeout` s for the oldest trial: its result alone, so that the tuner asks its next
        trial with the same ones in flight whichever finished first (two at once would not be)."""
        if not self._jobs:
            return []
        number, job = next(iter(self._jobs.items()))
        wait_futures([job.future], timeout=timeout)
        if not job.future.done():
            return []
        if _broken(job.future) and not job.retried:
            self._restart()
            return []
        del self._jobs[number]
        return [(number, _outcome(job))]

    def _submit(self, args: tuple[Any, ...]) -> Future[TrialResult]:
        try:
            return self._workers().submit(*args)
        except BrokenProcessPool:  # a worker died since the last trial ended: start anew
            self._pool = None
            return self._workers().submit(*args)

    def _restart(self) -> None:
        """New workers for a broken pool; the trials it broke run again on them, once."""
        broken, self._pool = self._pool, None
        if broken is not None:
            end_workers(broken)
        for job in self._jobs.values():
            if _broken(job.future):
                job.future, job.retried = self._submit(job.args), True

    def placements(self) -> dict[int, Placement]:
        """None: a trial here runs in a worker process of this host, on no Ray node."""
        return {}

    def cancel_all(self) -> list[int]:
        """Drop every trial in flight and end the workers (a simulation cannot be interrupted)."""
        numbers = list(self._jobs)
        self._close(force=True)
        return numbers

    def close(self) -> None:
        """End the worker processes once the trials in flight are done (a later submit starts new ones)."""
        self._close(force=False)

    def _close(self, force: bool) -> None:
        self._jobs.clear()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if force:
            end_workers(pool)
        else:
            pool.shutdown(wait=True)

    def _workers(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = worker_pool(self.processes)
        return self._pool


def _broken(future: Future[TrialResult]) -> bool:
    """Whether a finished future's worker died under it."""
    return not future.cancelled() and isinstance(future.exception(), BrokenProcessPool)


def _outcome(job: _Job) -> TrialResult:
    """The trial's result; workers that died under it twice are an `error` failure (evaluate_trial
    already turns any exception of the trial itself into one)."""
    try:
        return job.future.result()
    except BrokenProcessPool as exc:
        message = f"the worker process running the trial died twice (killed, or out of memory): {exc}"
        return TrialResult(config=job.config, failure=FailureKind.ERROR, message=message)
