"""A capacity search under a GPU-second cap (the guided run's share of --gpu-hours): it never starts a
window that would pass the cap, keeps what it measured before, and says why it stopped."""

from __future__ import annotations

import dataclasses

from test_capacity import CONFIG, QUICK, SLOS, WORKLOAD

from autotune.backends.sim import SimBackend
from autotune.core.errors import FailureKind
from autotune.measure.result import TrialResult
from autotune.trial.capacity import find_capacity
from autotune.trial.task import SearchPlan, evaluate_trial


def _search(max_gpu_s: float | None) -> TrialResult:
    return find_capacity(
        SimBackend("H100"), CONFIG, WORKLOAD, SLOS, search=dataclasses.replace(QUICK, max_gpu_s=max_gpu_s)
    )


def test_a_capped_search_stops_within_its_cap_and_keeps_the_rate_that_passed() -> None:
    """Capped below what the whole search cost, the search stops before the window that would pass the
    cap: it spends no more than the cap, reports the highest rate that passed before it (never above
    the uncapped search's bracket), and names the budget as what stopped it."""
    whole = _search(None)
    cap = whole.gpu_seconds * 0.999  # room for all but the last window
    capped = _search(cap)
    assert capped.gpu_seconds <= cap
    assert sum(p.windows for p in capped.capacity.probes) < sum(p.windows for p in whole.capacity.probes)
    assert capped.failure is None and 0 < capped.capacity.rate <= whole.capacity.bracket[1]
    assert "GPU-hour budget" in (capped.capacity.stopped_by or "")
    assert whole.capacity.stopped_by is None


def test_a_search_capped_before_any_rate_passed_has_no_verdict() -> None:
    """A cap that leaves room for the startup and the saturation burst only: no probe runs, and the
    trial's failure says the budget ran out (the tuner tells it as cut short, not as missing the SLOs)."""
    whole = _search(None)
    capped = _search(whole.startup_s + 1.0)
    assert capped.failure == FailureKind.BUDGET_SPENT
    assert capped.capacity.probes == ()
    assert "GPU-hour budget" in capped.message
    assert capped.gpu_seconds < whole.gpu_seconds


def test_a_trial_passes_its_cap_to_the_capacity_search() -> None:
    """The executors' plan reaches the search: a trial capped below its uncapped cost stops within it."""
    whole = evaluate_trial(SimBackend("H100"), CONFIG, WORKLOAD, SLOS, 0, (), None)
    plan = SearchPlan(max_gpu_s=whole.gpu_seconds * 0.9)
    capped = evaluate_trial(SimBackend("H100"), CONFIG, WORKLOAD, SLOS, 0, (), None, plan)
    assert capped.gpu_seconds <= plan.max_gpu_s < whole.gpu_seconds
    assert "GPU-hour budget" in (capped.capacity.stopped_by or "")
