"""What the tuner needs from an executor: one protocol, implemented on Ray (executor.py), in the
driver's process (local.py) and in worker processes (processes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from autotune.core.config import EngineConfig
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.trial.task import SearchPlan

__all__ = ["TrialExecutor", "free_slots"]


class TrialExecutor(Protocol):
    """What the tuner needs from an executor (module docstring)."""

    capacity: int
    max_trials: int | None  # trials in flight at most, whatever their slots (None: as capacity allows)

    def needs(self, config: EngineConfig) -> int: ...  # noqa: D102

    def misfit(self, config: EngineConfig) -> str | None: ...  # noqa: D102

    def fits(self, config: EngineConfig) -> bool: ...  # noqa: D102

    def can_start(self, config: EngineConfig | None = None) -> bool: ...  # noqa: D102

    def in_flight(self) -> list[tuple[int, EngineConfig]]: ...  # noqa: D102

    def submit(
        self,
        number: int,
        config: EngineConfig,
        seed: int,
        trial_dir: Path | None,
        plan: SearchPlan | None = None,
    ) -> None: ...  # noqa: D102

    def wait(self, timeout: float) -> list[tuple[int, TrialResult]]: ...  # noqa: D102

    def placements(self) -> dict[int, Placement]: ...  # noqa: D102

    def cancel_all(self) -> list[int]: ...  # noqa: D102


def free_slots(executor: TrialExecutor, config: EngineConfig) -> int:
    """How many trials of `config` could start now beside the executor's running ones."""
    running = executor.in_flight()
    used = sum(executor.needs(other) for _, other in running)
    slots = (executor.capacity - used) // executor.needs(config)
    return slots if executor.max_trials is None else min(slots, executor.max_trials - len(running))
