"""How a benchmark run ends, as `autotune run` ends it on a noisy backend: the top configs and vLLM's
defaults measured again with other seeds (autotune/tune/remeasure.py: its targets, its order and, in a
guided run, the GPU-hour budget), then the recommendation (autotune/tune/recommendation.py: the best
mean among the re-measured configs, vLLM's defaults kept unless the gain clears the margin).

The tool's own functions decide; the benchmark's trials become the records they read. A capacity
bracket's resolution is taken as the search's RESOLUTION (3 %: where its bisection stops; the cached
searches do not keep their bracket).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.measure.capacity_report import CapacityReport
from autotune.trial.capacity import RESOLUTION
from autotune.tune.recommendation import decide
from autotune.tune.remeasure import RepeatBudget, plan, targets
from autotune.tune.study import TrialRecord

MAXIMIZE = [True]


@dataclass(frozen=True)
class Ending:
    """The best config found after the repeats, what the run deploys (vLLM's defaults unless the gain
    clears the margin; None: nothing met the SLOs) and what the repeats cost."""

    picked: str | None
    deployed: str | None
    gpu_h: float


def finish(
    world: Any, trace: Any, within: int, base_key: str, repeats: int, budget_h: float | None
) -> Ending:
    """Re-measure and decide over the trace's first `within` trials (those inside the budget: the
    benchmark's rule for regret). `budget_h`: the guided run's --gpu-hours, less every trial it ran, a
    last one that passed it included (None: repeats are not bounded, as in an unguided run)."""
    keys = trace.measured[:within]
    costs = [h - (trace.gpu_h[i - 1] if i else 0.0) for i, h in enumerate(trace.gpu_h[:within])]
    recs = [
        _record(i, value, key == base_key, cost * 3600)
        for i, (key, value, cost) in enumerate(zip(keys, trace.values[:within], costs, strict=True))
    ]
    todo = plan(targets(recs, MAXIMIZE), repeats)
    left_s = None if budget_h is None else (budget_h - trace.gpu_h[-1]) * 3600  # every trial it ran
    budget = RepeatBudget.of(todo, left_s)
    remeasured: dict[str, dict[str, float]] = {}
    spent_s = 0.0
    for repeat in todo:
        if not budget.fits():  # one at a time, charged as the run charges it
            break
        key = keys[repeat.trial.number]
        m = world.trials.measure(key, world.grid_keys[key], trace.seed + repeat.index)
        remeasured.setdefault(str(repeat.trial.number), {})[str(repeat.index)] = m.value
        spent_s += m.gpu_s
        budget.charge(m.gpu_s)
    decision = decide(recs, MAXIMIZE, ["output_throughput"], remeasured)
    picked = keys[decision.candidate.number] if decision.candidate is not None else None
    deployed = keys[decision.trial.number] if decision.trial is not None else None
    return Ending(picked, deployed, spent_s / 3600)


def _record(number: int, value: float, baseline: bool, gpu_s: float) -> TrialRecord:
    """A benchmark trial as the recommendation reads a study's trial (value 0: it met no rate)."""
    bracket = CapacityReport(
        rate=1.0,
        kept_up=True,
        bracket=(1.0, 1.0 + RESOLUTION),
        resolution=RESOLUTION,
        bound_measured=True,
        saturation_throughput=None,
        goodput=None,
    )
    return TrialRecord(
        number,
        "COMPLETE",
        [value],
        {},
        {},
        feasible=value > 0,
        baseline=baseline,
        gpu_seconds=gpu_s,
        capacity=bracket if value > 0 else None,
    )
