"""A capacity search under a GPU-second cap (the guided run's share of --gpu-hours, for a trial or a
re-measurement): it never starts a window that would pass the cap, keeps what it measured before, and
says why it stopped."""

from __future__ import annotations

import dataclasses
import math

from test_capacity import CONFIG, LLAMA_8B, QUICK, SLOS, WORKLOAD

from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.result import TrialResult
from autotune.trial.capacity import find_capacity
from autotune.trial.saturation import saturation_runs
from autotune.trial.task import SearchPlan, evaluate_trial
from autotune.tune.remeasure import RepeatBudget


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


def test_repeats_are_capped_at_their_share_and_a_cut_one_is_not_counted() -> None:
    """The re-measurements' budget (tune/remeasure.py): a repeat starts while the dearest run so far fits
    beside the running repeats' caps, gets a share of what is left, and one the cap stopped gives no value
    to its config's mean (a lower bound, or no verdict)."""
    budget = RepeatBudget(left_s=3000.0, dearest_s=1000.0)
    first = budget.cap_s(0.0, 2)
    assert first == 1500.0 and budget.fits(first)
    assert budget.cap_s(first, 1) == 1500.0 and not budget.fits(first + 1500.0)
    assert RepeatBudget(left_s=math.inf, dearest_s=1000.0).cap_s(0.0, 1) is None
    whole = _search(None)
    assert not whole.cut_by_budget
    assert _search(whole.gpu_seconds * 0.999).cut_by_budget
    assert _search(whole.startup_s + 1.0).cut_by_budget


def test_a_cap_that_cannot_hold_the_second_saturation_burst_does_not_run_it() -> None:
    """128 sequences of short requests: the first burst (256 requests) sizes a second of 512. A cap
    below what that second burst would take at the first one's pace stops the search there, within
    the cap and with no verdict; a cap with room for it runs both bursts."""
    config = EngineConfig(model=LLAMA_8B, max_model_len=4096, max_num_seqs=128)
    with SimBackend("H100").session(config) as session:
        first = saturation_runs(session, config, WORKLOAD, 0)[0]
    with SimBackend("H100").session(config) as session:
        cut = saturation_runs(session, config, WORKLOAD, 0, max_gpu_s=first.gpu_seconds + first.benchmark_s)
    assert [r.failure for r in cut] == [FailureKind.BUDGET_SPENT]
    assert cut[0].gpu_seconds <= first.gpu_seconds + first.benchmark_s
    assert "saturation burst of 512 requests" in cut[0].message
    with SimBackend("H100").session(config) as session:
        both = saturation_runs(session, config, WORKLOAD, 0, max_gpu_s=first.gpu_seconds * 10)
    assert [r.benchmark.completed for r in both] == [256, 512] and all(r.ok for r in both)
