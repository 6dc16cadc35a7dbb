"""What a run's results say: the front, the recommendation, the baseline and the costs (`Outcome`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.core.config import gpus_per_replica
from autotune.core.values import fmt_number
from autotune.outputs.cost import CostView, Sizing, cost_view, sizing
from autotune.tune.front import (
    TIE_TOLERANCE,
    baseline,
    defaults_label,
    moved_defaults,
    moved_note,
    pareto_front,
)
from autotune.tune.objectives import PER_GPU
from autotune.tune.progress import versus
from autotune.tune.recommendation import (
    Recommendation,
    decide,
    latencies_break_ties,
    pick_name,
    remeasured_runs,
    resolution_of,
    runs_of,
    tie_breakers,
)
from autotune.tune.remeasure import StoredRepeats
from autotune.tune.study import TrialRecord

# Said wherever a simulated run's results go (report, summary, best.json, exports, dashboard note).
SIMULATED_NOTE = (
    "simulated: these results come from autotune's simulated vLLM engine, not a GPU; confirm them on "
    "one before you deploy (autotune bench --url against the deployment, --capacity for its capacity)"
)
# One config's runs further apart than this: at these SLOs its capacity, not the config, is what is
# uncertain (a capacity search's repeats spread 2-5 % on well-conditioned cases, 10-35 % near a p99 ITL SLO
# on which the latency barely moves with the rate: docs/guided-search-experiments.md, "A ground truth with the
# trials' noise").
SENSITIVE_SPREAD = 0.10


def is_simulated(context: Mapping[str, Any]) -> bool:
    """Whether a run's results come from the simulated engine (its context or run.json; a run.json from
    before the mark existed: its backend)."""
    return bool(context.get("simulated", context.get("backend") == "sim"))


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
    repeats: StoredRepeats = field(default_factory=StoredRepeats)  # the top configs' re-measurements

    def change(self, record: TrialRecord) -> float | None:
        """Signed relative change of the primary objective's metric against the baseline (-0.634: 63.4 %
        lower, whichever way the objective points): what the "vs baseline" columns show, as the
        verdict's "vs the defaults" does, so one column reads the same under any objective."""
        if self.baseline is None or not self.baseline.values or not record.values:
            return None
        if not (_whole(self.baseline) and _whole(record)):
            return None
        base = self.baseline.values[0]
        return record.values[0] / base - 1 if base else None

    def gain(self, record: TrialRecord) -> float | None:
        """Relative change of the primary objective against the baseline (+0.23 = 23% better)."""
        change = self.change(record)
        if change is None:
            return None
        return change if self.maximize[0] else -change

    def verdict(self) -> str:
        """One sentence: the recommendation against the baseline, with the evidence (every objective)."""
        text = self.decision.text
        best, base = self.decision.candidate, self.baseline
        if best is None or base is None or not base.values or best.number == base.number:
            return text
        if not _whole(base):
            return text
        changes = ", ".join(
            f"{name} {_change(new, old)}"
            for name, new, old in zip(self.objective_names, best.values or [], base.values, strict=False)
        )
        # With repeats the gain above is their mean; these figures (latencies too) are one run of each.
        runs = self.repeats.values
        first = " in their first runs" if runs.get(str(best.number)) or runs.get(str(base.number)) else ""
        return f"{text} Trial #{best.number} vs the defaults{first}: {changes}.{self._per_gpu(best, base)}"

    def _per_gpu(self, best: TrialRecord, base: TrialRecord) -> str:
        """The verdict's per-GPU sentence when the two take different GPU counts and the objective is
        per replica: a TP=4 replica doing 2.5x a TP=2 one's work is a 25 % gain per GPU, not 150 %."""
        gain = self.gain_per_gpu(best)
        mine, theirs = gpus_per_replica(best.config), gpus_per_replica(base.config)
        if gain is None or mine == theirs:
            return ""
        new, old = (best.values or [0.0])[0] / mine, (base.values or [0.0])[0] / theirs
        return (
            f" Per GPU ({mine} GPUs per replica vs {theirs}): {self.objective_names[0]} "
            f"{_change(new, old)} ({fmt_number(new)} vs {fmt_number(old)})."
        )

    def searched(self) -> bool:
        """Whether the front's configs had their capacity searched: the front's capacity and "limited by"
        columns are shown only then (a fixed load has nothing to put in them)."""
        return any(r.capacity is not None for r in self.front)

    def per_replica(self) -> bool:
        """Whether the primary objective is a throughput per replica (not per GPU)."""
        name = self.objective_names[0]
        return self.maximize[0] and not name.endswith(PER_GPU) and not name.endswith("_ms")

    def gain_per_gpu(self, record: TrialRecord) -> float | None:
        """`gain` per GPU of each replica (None: the objective is not a throughput per replica)."""
        base = self.baseline
        if not self.per_replica() or base is None or not base.values or not record.values:
            return None
        if not (base.measured and record.measured):
            return None
        theirs = base.values[0] / gpus_per_replica(base.config)
        return record.values[0] / gpus_per_replica(record.config) / theirs - 1 if theirs else None

    def multi_gpu(self) -> bool:
        """Whether a config of the study takes more than one GPU per replica (a comparison of them must
        say how many)."""
        return any(gpus_per_replica(r.config) > 1 for r in self.records if r.config)

    @property
    def simulated(self) -> bool:
        """Whether these results come from the simulated engine."""
        return is_simulated(self.context)

    def highest(self) -> TrialRecord | None:
        """The best primary value measured (feasible, duplicates left out): the progress line's best."""
        pool = [r for r in self.feasible() if r.values]
        sign = 1.0 if self.maximize[0] else -1.0
        return max(pool, key=lambda r: sign * (r.values or [0.0])[0], default=None)

    def progress_note(self) -> str:
        """One line when the verdict does not name the progress line's best as it showed it: a tie rule
        gave another trial, or re-measurements changed its gain ("" when they agree)."""
        top, candidate, gain = self.highest(), self.decision.candidate, self.decision.gain
        if top is None or candidate is None:
            return ""
        kept = self.decision.trial
        if kept is not None and top.number == kept.number != candidate.number:
            return ""  # the verdict deploys the progress line's best (the defaults, kept in a tie)
        shown = f"trial #{top.number} ({fmt_number((top.values or [0.0])[0])} {self.objective_names[0]}"
        first = self.gain(top)
        # as the progress line words it: a minimized objective's gain is its reduction, "32.3% lower"
        shown += f", {versus(first, self.maximize[0], 'the defaults')})" if first is not None else ")"
        if top.number != candidate.number:
            return f"The progress line's best, {shown}, {self._lost_to(top, candidate)}."
        if gain is not None and gain.how.endswith("paired runs") and first is not None:
            return (
                f"The progress line's best, {shown}, was its first measurement; with the re-measurements "
                f"({gain.how}) its gain is {gain.percent()}."
            )
        return ""

    def _lost_to(self, top: TrialRecord, candidate: TrialRecord) -> str:
        """Why the highest first run is not the pick: with repeats, the mean of its runs (or none: only
        re-measured configs compete); else, or when the means tie too, the tie rule."""
        n, runs = candidate.number, self.repeats.values
        value, best = (candidate.values or [0.0])[0], (top.values or [0.0])[0]
        means = ""
        if runs.get(str(candidate.number)):
            if not runs.get(str(top.number)):
                return "was one run and not re-measured: only the re-measured configs compete, by their means"
            value = statistics.fmean(runs_of(candidate, runs))
            best = statistics.fmean(runs_of(top, runs))
            sign = 1.0 if self.maximize[0] else -1.0
            mine = f"the mean of its {len(runs_of(top, runs))} runs, {fmt_number(best)}"
            if sign * best <= sign * value:
                worse = "below" if sign > 0 else "above"
                return f"was its first run; {mine}, is {worse} trial #{n}'s, {fmt_number(value)}"
            means = f" by their means ({mine}; #{n}'s {fmt_number(value)})"
        bracket = resolution_of(candidate)
        if bracket and abs(value) * bracket >= abs(best - value):
            why = f"#{n}'s capacity bracket, {bracket:.1%}, reaches it"
        else:
            why = f"they are within {TIE_TOLERANCE:.0%}"
        return f"ties with trial #{n}{means}: {why}{self._tie_goes(n)}"

    def _tie_goes(self, number: int) -> str:
        """Who wins a tie, after the progress note's why: the objectives after the first ("" if none)."""
        if latencies_break_ties(self.objective_names):
            return f", and a tie goes to the lowest latencies, #{number}'s"
        by = tie_breakers(self.objective_names)
        return f", and a tie goes to {by}, #{number}'s" if by else ""

    def spread_note(self) -> str:
        """One sentence when the recommended config's or the baseline's runs (its first and its repeats)
        lie more than SENSITIVE_SPREAD apart ("" otherwise): a gain smaller than that spread is not
        established by a few runs, whatever their mean says."""
        chosen = [r for r in (self.best, self.baseline) if r is not None and r.values]
        spreads = []
        for record in {r.number: r for r in chosen}.values():
            runs = runs_of(record, self.repeats.values)
            low, high = min(runs), max(runs)
            if len(runs) > 1 and low > 0 and high / low - 1 > SENSITIVE_SPREAD:
                what = f"{fmt_number(low)} to {fmt_number(high)} ({high / low - 1:.0%} apart)"
                spreads.append(f"#{record.number}'s {len(runs)} runs measured {what}")
        if not spreads:
            return ""
        return (
            f"Sensitive to noise: trial {' and trial '.join(spreads)} of {self.objective_names[0]}. At "
            "these SLOs a small change in speed moves the capacity far: read differences smaller than "
            "that as ties, and confirm on the deployment (autotune bench --url ... --capacity)."
        )

    def once_note(self) -> str:
        """One sentence when the run recommends a switch from the defaults that it meant to re-measure
        and could not (a budget left no room), by less than one search's spread on a noisy GPU: the gain
        then rests on one capacity search of each ("" otherwise)."""
        best, base, gain = self.best, self.baseline, self.decision.gain
        if self.decision.keeps_defaults or best is None or base is None or best.number == base.number:
            return ""
        if gain is not None and gain.low >= 1 + SENSITIVE_SPREAD:
            return ""  # beyond what one search's noise can make
        once = [
            r
            for r in (best, base)
            if r.number in self.repeats.planned and not self.repeats.values.get(str(r.number))
        ]
        if not once:
            return ""
        who = " and ".join(f"trial #{r.number}" + (" (the defaults)" if r is base else "") for r in once)
        return (
            f"Measured once: {who} could not be re-measured within the budget, so the gain rests on single "
            "capacity searches, which spread a few percent on a GPU (more near an ITL or TPOT SLO): confirm "
            "it on the deployment (autotune bench --url ... --capacity) before you switch."
        )

    def failed_repeats_note(self) -> str:
        """One sentence naming the re-measurements that failed, with why: they measured nothing, so the
        means and the paired gain are without them ("" when none failed)."""
        base = self.baseline.number if self.baseline is not None else None
        parts = [
            f"trial #{number}{' (the defaults)' if number == str(base) else ''} repeat {index} ({why})"
            for number, runs in self.repeats.failed.items()
            for index, why in runs.items()
        ]
        if not parts:
            return ""
        return f"Re-measurement failed: {'; '.join(parts)}: left out of the means and the paired gain."

    def unjudged_note(self) -> str:
        """One sentence when a fixed open-loop load was too short to judge whether the recommended config
        keeps up: it is feasible on its SLOs alone, which an overload that a short run hides meets too
        ("" otherwise)."""
        best = self.best
        if best is None or best.capacity is not None or best.kept_up is not None:
            return ""
        if self.context.get("load_kind") != "open":  # a closed loop or a burst has no verdict to give
            return ""
        return (
            f"Not judged: whether trial #{best.number} keeps up with the fixed load's arrivals (the run is "
            f"too short to tell), so its SLO verdicts hold for {best.metrics.get('completed', 'these')} "
            "requests only: more requests in the workload would judge it."
        )

    def measurement_notes(self) -> list[str]:
        """What the measurement leaves open about the recommendation (`spread_note`, `once_note`,
        `failed_repeats_note`, `unjudged_note`), for the summary, the flags and the dashboard's note alike."""
        notes = (self.spread_note(), self.once_note(), self.failed_repeats_note(), self.unjudged_note())
        return [note for note in notes if note]

    def remeasured(self) -> list[tuple[TrialRecord, list[float]]]:
        """The re-measured trials with their primary objective's runs (the first, then the repeats), best
        mean first: what the pick among them rests on (empty without repeats)."""
        return remeasured_runs(self.records, self.repeats.values, self.maximize[0])

    def feasible(self) -> list[TrialRecord]:
        """Feasible trials (duplicates left out)."""
        return [r for r in self.records if r.feasible and r.duplicate_of is None]

    def gain_text(self) -> str:
        """The gain with its interval when the decision measured one ("" otherwise)."""
        gain = self.decision.gain
        return f"{gain.metric} {gain.percent()}" if gain is not None else ""

    def flags(self) -> list[str]:
        """What a deployer should know before acting: infeasible baseline, a gain within noise..."""
        out = [SIMULATED_NOTE] if self.simulated else []
        if self.best is None:
            out.append("no config met the SLOs: relax them or widen the search space")
        label = defaults_label(self.baseline)
        if self.baseline is not None and label != "vLLM's defaults":
            out.append(moved_note(self.baseline.config, moved_defaults(self.baseline)) or label)
        if self.baseline is not None and not self.baseline.feasible:
            why = self.baseline.status
            what = "vLLM's default config is" if label == "vLLM's defaults" else f"{label} are"
            out.append(f"{what} infeasible here ({why})")
        gain, candidate = self.decision.gain, self.decision.candidate
        if (
            gain is not None
            and not gain.significant
            and candidate is not None
            and self.decision.keeps_defaults
        ):
            # named as the verdict names it: a tie rule's pick is not "the best config found"
            who = pick_name(
                self.objective_names, candidate, self.records, self.maximize[0], self.repeats.values
            )
            out.append(
                f"{who[0].lower()}{who[1:]} differs by {gain.figure(gain.ratio)}, not clearly beyond the "
                f"measurement's margin of {gain.margin:.1%}: {label} are kept"
            )
        if self.best is not None:
            resolution = resolution_of(self.best)
            if resolution:
                out.append(f"capacity measured to within {resolution:.1%}")
            if self.best.kept_up is False:
                out.append("at the fixed load the recommended config did not keep up with the arrivals")
        out += self.measurement_notes()
        return out


def _whole(record: TrialRecord) -> bool:
    """Whether a trial's values are a whole measurement, to compare with: not a failure's, whose values
    are placeholders or a run cut short (a server killed mid-run served a fraction of its load)."""
    return record.failure is None


def outcome(
    records: list[TrialRecord],
    objective_names: list[str],
    maximize: list[bool],
    slos: list[str],
    context: dict[str, Any] | None = None,
    target_rate: float | None = None,
    gpu_price: float | None = None,
    repeats: StoredRepeats | None = None,
) -> Outcome:
    """Front, recommendation (with its gain), baseline and costs of a study's records (`repeats`: the
    study's re-measurements, tune/remeasure.py)."""
    repeats = repeats or StoredRepeats()
    decision = decide(records, maximize, objective_names, repeats.values)
    best = decision.trial
    ctx = dict(context or {})
    simulated = is_simulated(ctx)
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
        cost=cost_view(
            records, simulated, int(ctx.get("gpus") or 0), str(ctx.get("gpu") or ""), repeats.gpu_s
        ),
        sizing=sizing(best, target_rate, gpu_price, simulated) if best is not None and target_rate else None,
        repeats=repeats,
    )


def _change(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old else f"{new:,.4g} (baseline 0)"
