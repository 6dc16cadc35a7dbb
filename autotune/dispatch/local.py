"""Trials in the driver's own process, one at a time: small simulated runs need no Ray."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from autotune.backends.base import Backend
from autotune.core.config import EngineConfig
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.trial.task import SearchPlan, evaluate_trial
from autotune.workloads.spec import WorkloadSpec


class LocalExecutor:
    """Runs one trial at a time in this process, for small simulated runs (`--backend sim --parallel 1`):
    they need no Ray, so they do not pay its start (seconds) or print its notices.

    The simulation is bounded by its own virtual clock, so no deadline is needed; `wait` runs the
    submitted trial to its end.
    """

    capacity = 1
    max_trials: int | None = 1

    def __init__(self, backend: Backend, workload: WorkloadSpec, slos: Sequence[Slo]) -> None:
        self.backend = backend
        self.workload = workload
        self.slos = list(slos)
        self._job: tuple[int, EngineConfig, int] | None = None

    def describe(self) -> str:
        """Where trials run, for the run's first line."""
        return "1 trial at a time in process (no Ray)"

    def needs(self, config: EngineConfig) -> int:
        """One slot per trial."""
        return 1

    def misfit(self, config: EngineConfig) -> str | None:
        """Never: the simulator's GPUs are virtual."""
        return None

    def fits(self, config: EngineConfig) -> bool:
        """Always."""
        return True

    def can_start(self, config: EngineConfig | None = None) -> bool:
        """Whether no trial is waiting to run."""
        return self._job is None

    def in_flight(self) -> list[tuple[int, EngineConfig]]:
        """The submitted trial, if any."""
        return [(self._job[0], self._job[1])] if self._job else []

    def submit(
        self,
        number: int,
        config: EngineConfig,
        seed: int,
        trial_dir: Path | None,
        plan: SearchPlan | None = None,
    ) -> None:
        """Take a trial; it runs at the next `wait`."""
        if self._job is not None:
            raise RuntimeError("submit() without a free slot: call can_start() first")
        self._job = (number, config, seed, plan)

    def wait(self, timeout: float) -> list[tuple[int, TrialResult]]:
        """Run the submitted trial now, in this process."""
        if self._job is None:
            return []
        number, config, seed, plan = self._job
        try:
            result = evaluate_trial(self.backend, config, self.workload, self.slos, seed, (), None, plan)
        finally:
            self._job = None
        return [(number, result)]

    def placements(self) -> dict[int, Placement]:
        """None: a trial here runs in this process, on no Ray node."""
        return {}

    def cancel_all(self) -> list[int]:
        """Drop the trial not yet run."""
        numbers = [self._job[0]] if self._job else []
        self._job = None
        return numbers
