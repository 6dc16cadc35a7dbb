"""What a run's results say: the front, the recommendation, the baseline and the costs (`Outcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.outputs.cost import CostView, Sizing, cost_view, sizing
from autotune.tune.front import baseline, pareto_front
from autotune.tune.recommendation import Recommendation, decide, resolution_of
from autotune.tune.study import TrialRecord


@dataclass
class Outcome:
    """The results a report shows."""

    records: list[TrialRecord]
    front: list[TrialRecord]
    best: TrialRecord | None
    baseline: TrialRecord | None
    objective_names: list[str]
    maximize: list[bool]
    slos: list[str]
    decision: Recommendation
    context: dict[str, Any] = field(default_factory=dict)  # the study's settings (model, gpu, workload...)
    cost: CostView | None = None
    sizing: Sizing | None = None

    def gain(self, record: TrialRecord) -> float | None:
        """Relative change of the primary objective against the baseline (+0.23 = 23% better)."""
        if self.baseline is None or not self.baseline.values or not record.values:
            return None
        base = self.baseline.values[0]
        if base == 0:
            return None
        change = record.values[0] / base - 1
        return change if self.maximize[0] else -change

    def verdict(self) -> str:
        """One sentence: the recommendation against the baseline, with the evidence (every objective)."""
        text = self.decision.text
        best, base = self.decision.candidate, self.baseline
        if best is None or base is None or not base.values or best.number == base.number:
            return text
        changes = ", ".join(
            f"{name} {_change(new, old)}"
            for name, new, old in zip(self.objective_names, best.values or [], base.values, strict=False)
        )
        return f"{text} Trial #{best.number} vs the defaults: {changes}."

    def feasible(self) -> list[TrialRecord]:
        """Feasible trials (duplicates left out)."""
        return [r for r in self.records if r.feasible and r.duplicate_of is None]

    def gain_text(self) -> str:
        """The gain with its interval when the decision measured one ("" otherwise)."""
        gain = self.decision.gain
        return f"{gain.metric} {gain.percent()}" if gain is not None else ""

    def flags(self) -> list[str]:
        """What a deployer should know before acting: infeasible baseline, a gain within noise..."""
        out = []
        if self.best is None:
            out.append("no config met the SLOs: relax them or widen the search space")
        if self.baseline is not None and not self.baseline.feasible:
            why = self.baseline.failure or "violates the SLOs"
            out.append(f"vLLM's default config is infeasible here ({why})")
        gain = self.decision.gain
        if gain is not None and not gain.significant:
            found = self.decision.candidate.number if self.decision.candidate else "?"
            out.append(
                f"the best config found (#{found}) gains less than the measurement's margin "
                f"({gain.margin:.1%}): vLLM's defaults are kept"
            )
        if self.best is not None:
            resolution = resolution_of(self.best)
            if resolution:
                out.append(f"capacity measured to within {resolution:.1%}")
            if self.best.kept_up is False:
                out.append("at the fixed load the recommended config did not keep up with the arrivals")
        return out


def outcome(
    records: list[TrialRecord],
    objective_names: list[str],
    maximize: list[bool],
    slos: list[str],
    context: dict[str, Any] | None = None,
    target_rate: float | None = None,
    gpu_price: float | None = None,
    remeasured: dict[str, list[float]] | None = None,
) -> Outcome:
    """Front, recommendation (with its gain), baseline and costs of a study's records."""
    decision = decide(records, maximize, objective_names, remeasured)
    best = decision.trial
    ctx = dict(context or {})
    simulated = bool(ctx.get("simulated", ctx.get("backend") == "sim"))
    return Outcome(
        records=records,
        front=pareto_front(records, maximize),
        best=best,
        baseline=baseline(records),
        objective_names=objective_names,
        maximize=maximize,
        slos=slos,
        decision=decision,
        context=ctx,
        cost=cost_view(records, simulated),
        sizing=sizing(best, target_rate, gpu_price) if best is not None and target_rate else None,
    )


def fmt_number(value: Any) -> str:
    """A figure as people read it: 12,571 / 95.8 / 0.82; "" for a missing value."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _change(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old else f"{new:,.4g} (baseline 0)"


def _change(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old else f"{new:,.4g} (baseline 0)"
