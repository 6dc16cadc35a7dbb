"""What to deploy: the best config found, unless its gain over vLLM's defaults is within the noise.

A measurement has a resolution: capacity is known to its bracket (the highest rate that passed and the
lowest that failed, `capacity_resolution` apart), and on real GPUs two runs of one config differ by a
few percent. A config that beats the baseline (vLLM's defaults: trial 0, or 1 in a guided run) by less
than that is a tie, and a tie is not worth changing a deployment for, so the recommendation keeps the
defaults and says so.

The margin a gain must clear:
- with repeats (real backends, or the simulator with `--noise`): the top candidates and the baseline
  are re-measured with other seeds (the tuner stores them in the study's `remeasured` attr); the gain
  is the mean of the paired ratios and its interval their lowest and highest; it counts when even the
  lowest clears the capacity resolution (TIE_TOLERANCE at a fixed load);
- without: the gain counts when it clears the resolution of both measurements (their capacity
  brackets do not overlap), or TIE_TOLERANCE at a fixed load (deterministic: equal is equal); a latency
  objective is one value at each trial's capacity, so its gain has no interval, only that margin.
A minimized objective's gain is shown as its reduction, (baseline - value) / baseline, as in the front table.
With repeats the candidate itself is chosen among the re-measured configs by the mean of their runs:
the best single run of many is partly the luckiest draw (the winner's curse), the mean of three less so.
When the baseline itself misses the SLOs, any feasible config is a gain: it is what makes them hold.
At a fixed load the throughputs of configs that keep up tie (each serves the offered rate): a config whose
latencies are clearly lower (`_latencies_won`) is then recommended over the defaults.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.core.errors import FailureKind
from autotune.core.values import brief, fmt_number
from autotune.tune.front import TIE_TOLERANCE, baseline, defaults_label, recommend
from autotune.tune.objectives import metric_unit
from autotune.tune.study import TrialRecord
from autotune.tune.unmet import unmet_counts

# A latency objective is one run's p99: a config 10 % lower, and no higher on the others, is beyond a run's
# noise (at a fixed load, where throughputs tie).
LATENCY_MARGIN = 0.10


@dataclass(frozen=True)
class Gain:
    """The candidate's primary objective against the baseline's, as an improvement ratio (> 1 better):
    new / old for a maximized objective, old / new for a minimized one (a latency)."""

    metric: str
    ratio: float
    low: float  # the interval's ends (ratios)
    high: float
    margin: float  # what the gain had to clear (a fraction: 0.03 = 3 %)
    significant: bool
    how: str  # where the interval comes from
    maximize: bool = True

    def percent(self) -> str:
        """e.g. "+4.1 % (interval +1.0 % to +7.3 %)"; a minimized objective's as its reduction, e.g.
        "32.3 % lower (interval 30.1 % to 34.0 % lower)", the figure the front table and best.json show."""
        if self.maximize:
            return f"{_pct(self.ratio)} (interval {_pct(self.low)} to {_pct(self.high)}, {self.how})"
        if self.low == self.high:
            return f"{_lower(self.ratio)} ({self.how})"  # one value each: no interval to give
        return f"{_lower(self.ratio)} (interval {_lower_span(self.low, self.high)}, {self.how})"

    def figure(self, ratio: float) -> str:
        """One of the gain's ratios as `percent` writes it: "+2.0 %", or "2.0 % lower" when minimized."""
        return _pct(ratio) if self.maximize else _lower(ratio)

    def reduction(self, ratio: float) -> float:
        """A minimized objective's ratio (old / new) as (old - new) / old: 0.323 = 32.3 % lower."""
        return _reduction(ratio)


@dataclass(frozen=True)
class Recommendation:
    """The decision and its reasons in plain words."""

    trial: TrialRecord | None  # what to deploy: the candidate, or the baseline when the gain is a tie
    candidate: TrialRecord | None  # the best config found on the Pareto front
    baseline: TrialRecord | None
    gain: Gain | None
    keeps_defaults: bool
    text: str


def decide(
    recs: Sequence[TrialRecord],
    maximize: Sequence[bool],
    objective_names: Sequence[str],
    remeasured: Mapping[str, Mapping[str, float]] | None = None,
) -> Recommendation:
    """The recommendation of a study's records (`remeasured`: trial number -> {repeat: primary value})."""
    return _decide(recs, maximize, objective_names, remeasured or {})


def _none_feasible(recs: Sequence[TrialRecord]) -> str:
    """Why nothing is recommended: the trials failed or missed the SLOs, or the budget cut them short
    before a verdict (then they say nothing about their configs)."""
    cut = sum(r.failure == FailureKind.BUDGET_SPENT for r in recs)
    if not recs:
        return "No trial finished: nothing to recommend."
    if cut == len(recs):
        return (
            f"No verdict: the {'trial was' if cut == 1 else f'{cut} trials were'} cut short by --gpu-hours "
            "before reaching one (a larger budget affords a whole trial)."
        )
    rest = f" ({cut} cut short by --gpu-hours before a verdict)" if cut else ""
    return (
        f"No feasible config: {unmet_counts(recs) or 'every trial failed or violated the SLOs'}{rest}"
        f"{_commonest_failure(recs)} (see trials.csv for reasons)."
    )


def _commonest_failure(recs: Sequence[TrialRecord]) -> str:
    """'; 3 of 5 launched failed alike: <kind> (<message>)' for the most frequent failure among the
    launched trials, '' when none failed twice alike (each failure is then its config's own)."""
    launched = [
        r for r in recs if r.launched and r.duplicate_of is None and r.failure != FailureKind.BUDGET_SPENT
    ]
    counts = Counter((r.failure, r.message) for r in launched if r.failure)
    if not counts:
        return ""
    (failure, message), n = counts.most_common(1)[0]
    if n < 2:
        return ""
    return f"; {n} of {len(launched)} launched failed alike: {failure} ({brief(message)})"


def _defaults_unmet(base: TrialRecord, defaults: str) -> str:
    """The verdict's words on an infeasible baseline: a failure with its reason (a crash is not an SLO
    missed), else the SLOs it missed; then that the recommendation meets them."""
    who = f"{defaults} (trial #{base.number})"
    if not base.failure:
        return f"{who} do not meet the SLOs (violates the SLOs); this config does"
    message = " ".join(base.message.split())
    reason = f"{base.failure} ({message[:200]})" if message else base.failure
    return f"{who} failed: {reason}; this config meets the SLOs"


def _decide(
    recs: Sequence[TrialRecord],
    maximize: Sequence[bool],
    objective_names: Sequence[str],
    remeasured: Mapping[str, Mapping[str, float]],
) -> Recommendation:
    base = baseline(recs)
    candidate = pick(recs, maximize, remeasured)
    name = objective_names[0]
    defaults = defaults_label(base)
    means = _means_sentence(recs, remeasured, maximize[0], name, base)
    if candidate is None:
        return Recommendation(None, None, base, None, False, _none_feasible(recs))
    if base is None or not base.values:
        text = f"Recommended: trial #{candidate.number} (no baseline trial in this study to compare with)."
        return Recommendation(candidate, candidate, base, None, False, text)
    if not base.feasible:
        text = f"Recommended: trial #{candidate.number}: {_defaults_unmet(base, defaults)}."
        return Recommendation(candidate, candidate, base, None, False, text)
    if candidate.number == base.number:
        text = (
            f"Keep {defaults} (trial #{base.number}): no config found beats their {name} by more than "
            f"the measurement's resolution{tie_clause(objective_names)}.{means}"
        )
        return Recommendation(base, candidate, base, None, True, text)
    gain = measure_gain(candidate, base, maximize[0], name, remeasured)
    if gain.significant:
        text = f"Recommended: trial #{candidate.number}: {name} {gain.percent()} vs {defaults}.{means}"
        return Recommendation(candidate, candidate, base, gain, False, text)
    lower = _latencies_won(candidate, base, objective_names) if maximize[0] else ""
    if lower and gain.ratio >= 1 - gain.margin:
        text = (
            f"Recommended: trial #{candidate.number}: at the fixed load its {name} ties with {defaults}' "
            f"({gain.percent()}), and its latencies are lower ({lower}).{means}"
        )
        return Recommendation(candidate, candidate, base, gain, False, text)
    found = pick_name(objective_names, candidate, recs, maximize[0], remeasured)
    if gain.low < gain.high < 1:
        # Tied on its first run (picked by the tie-break), but every repeat measured it below the defaults.
        text = (
            f"Keep {defaults} (trial #{base.number}): no config found beats them.{means} {found} measured "
            f"below them in every repeat: {name} {gain.percent()}."
        )
    elif gain.ratio > 1 + gain.margin:
        # Beyond the margin on average, not in every paired run: the rule asks every pair to clear it.
        text = (
            f"Keep {defaults} (trial #{base.number}): the best config found (trial #{candidate.number}) "
            f"gains {gain.percent()} on average, but its lowest paired run, {gain.figure(gain.low)}, is "
            f"within the measurement's margin of {gain.margin:.1%}: not a sure gain.{means}"
        )
    else:
        # The candidate is the tie rule's pick, not the highest value: it is named by what picked it.
        text = (
            f"Keep {defaults} (trial #{base.number}): no config found beats their {name} by more than the "
            f"measurement's margin of {gain.margin:.1%}.{means} {found} differs by {gain.percent()}: a "
            "tie, not a gain."
        )
    return Recommendation(base, candidate, base, gain, True, text)


def _latencies_won(candidate: TrialRecord, base: TrialRecord, objective_names: Sequence[str]) -> str:
    """At a fixed load every config that keeps up serves the offered rate: the throughputs tie and the
    configs differ in their latencies. The candidate's reductions in words ("p99_itl_ms 73.9% lower")
    when it is no slower on any latency objective (within TIE_TOLERANCE) and LATENCY_MARGIN faster on
    one; "" otherwise, and for capacity trials (there a tie on throughput keeps the defaults)."""
    if candidate.capacity is not None or base.capacity is not None:
        return ""
    if not latencies_break_ties(objective_names) or not (candidate.values and base.values):
        return ""
    pairs = list(zip(objective_names[1:], candidate.values[1:], base.values[1:], strict=False))
    if any(old <= 0 or new > old * (1 + TIE_TOLERANCE) for _, new, old in pairs):
        return ""
    if not any(new <= old * (1 - LATENCY_MARGIN) for _, new, old in pairs):
        return ""
    return ", ".join(f"{n} {1 - new / old:.1%} lower" for n, new, old in pairs)


def _means_sentence(
    recs: Sequence[TrialRecord],
    remeasured: Mapping[str, Mapping[str, float]],
    maximize: bool,
    name: str,
    base: TrialRecord | None,
) -> str:
    """' Mean output_throughput of 3 runs each: #7 4,669, #0 (the defaults) 4,648.': what picked among
    the re-measured configs, best first ('' without repeats: single runs picked)."""
    runs = remeasured_runs(recs, remeasured, maximize)
    if not runs:
        return ""
    counts = {len(values) for _, values in runs}
    alike = len(counts) == 1  # every config measured as often: said once, not per config
    each = f"of {counts.pop()} runs each" if alike else "of each one's runs"
    parts = []
    for record, values in runs:
        what = " (the defaults)" if base is not None and record.number == base.number else ""
        many = "" if alike else f" ({len(values)} runs)"
        parts.append(f"#{record.number}{what} {fmt_number(statistics.fmean(values))}{many}")
    return f" Mean {name} {each}: {', '.join(parts)}."


def remeasured_runs(
    recs: Sequence[TrialRecord], remeasured: Mapping[str, Mapping[str, float]], maximize: bool
) -> list[tuple[TrialRecord, list[float]]]:
    """The re-measured trials with their primary objective's runs (`runs_of`), best mean first."""
    repeated = [(r, runs_of(r, remeasured)) for r in recs if remeasured.get(str(r.number)) and r.values]
    sign = -1.0 if maximize else 1.0
    return sorted(repeated, key=lambda item: sign * statistics.fmean(item[1]))


def tie_clause(objective_names: Sequence[str]) -> str:
    """How a tie with the defaults could still have won, by the objectives that break ties (all but the
    first): " with lower latency" when they are latencies, "" when there are none."""
    rest = list(objective_names[1:])
    if latencies_break_ties(objective_names):
        return " with lower latency"
    return f" or ties with them with a better {', '.join(rest)}" if rest else ""


def latencies_break_ties(objective_names: Sequence[str]) -> bool:
    """Whether a tie on the primary objective is broken by latencies alone (the default objectives'
    p99 TTFT and ITL): the texts that say "the lowest latencies" hold only then."""
    rest = objective_names[1:]
    return bool(rest) and all(metric_unit(n) == "ms" for n in rest)


def tie_breakers(objective_names: Sequence[str]) -> str:
    """The objectives that break a tie on the primary one, for a text that names them: "the best
    request_throughput", "the best a, b together" ("" when there are none)."""
    rest = list(objective_names[1:])
    if not rest:
        return ""
    return f"the best {', '.join(rest)}" + (" together" if len(rest) > 1 else "")


def pick_name(
    objective_names: Sequence[str],
    candidate: TrialRecord,
    recs: Sequence[TrialRecord],
    maximize: bool,
    remeasured: Mapping[str, Mapping[str, float]],
) -> str:
    """The config weighed against the baseline (the verdict's, flags_to_know's), named by what picked it:
    a tie rule, or the best one found when nothing breaks ties; with repeats, "by the mean of its runs",
    not its first run."""
    number = candidate.number
    runs = remeasured_runs(recs, remeasured, maximize)
    means = " by the mean of its runs" if runs else ""
    if runs and runs[0][0].number == number:
        return f"The best config{means} (trial #{number})"  # the highest mean: no tie rule picked it
    if latencies_break_ties(objective_names):
        return f"The lowest-latency near-tie{means} (trial #{number})"
    by = tie_breakers(objective_names)
    if by:
        return f"The near-tie{means} with {by} (trial #{number})"
    return f"The best config found{means} (trial #{number})"


def pick(
    recs: Sequence[TrialRecord], maximize: Sequence[bool], remeasured: Mapping[str, Mapping[str, float]]
) -> TrialRecord | None:
    """The best config found (front.recommend). With repeats, only the re-measured configs compete,
    each by the mean of its first run and its repeats; a config never re-measured has one run, which
    can be the luckiest of many, so it is left out."""
    repeated = [r for r in recs if remeasured.get(str(r.number)) and r.values]
    if not repeated:
        return recommend(recs, maximize, resolution_of)
    means = [_with_mean(r, remeasured) for r in repeated]
    chosen = recommend(means, maximize, resolution_of)
    return next((r for r in repeated if chosen is not None and r.number == chosen.number), None)


def runs_of(record: TrialRecord, remeasured: Mapping[str, Mapping[str, float]]) -> list[float]:
    """A measured trial's primary objective over its first run and its repeats, in that order."""
    return [(record.values or [0.0])[0], *remeasured.get(str(record.number), {}).values()]


def _with_mean(record: TrialRecord, remeasured: Mapping[str, Mapping[str, float]]) -> TrialRecord:
    """`record` with its primary objective replaced by the mean over its first run and its repeats."""
    values = list(record.values or [])
    values[0] = statistics.fmean(runs_of(record, remeasured))
    return dataclasses.replace(record, values=values)


def measure_gain(
    candidate: TrialRecord,
    base: TrialRecord,
    maximize: bool,
    metric: str,
    remeasured: Mapping[str, Mapping[str, float]],
) -> Gain:
    """The candidate's gain over the baseline and whether it clears the measurement's margin."""
    resolution = max(resolution_of(candidate), resolution_of(base), 0.0)
    margin = resolution or TIE_TOLERANCE  # a fixed load has no bracket: equal within 1 % is equal
    first = _improvement(candidate.values[0], base.values[0], maximize)  # type: ignore[index]
    # Paired by seed: the first measurements (the run's seed), then each repeat both have.
    cand_runs = remeasured.get(str(candidate.number), {})
    base_runs = remeasured.get(str(base.number), {})
    repeats = [_improvement(cand_runs[k], base_runs[k], maximize) for k in cand_runs if k in base_runs]
    # A run that measured nothing (0: a failed repeat kept by an older autotune) gives no ratio, not inf.
    pairs = [first] + [ratio for ratio in repeats if math.isfinite(ratio)]
    if len(pairs) > 1:
        # Minimized: the harmonic mean of old / new is the mean reduction, the figure the gain is shown as.
        mean = statistics.fmean(pairs) if maximize else statistics.harmonic_mean(pairs)
        return Gain(
            metric,
            mean,
            min(pairs),
            max(pairs),
            margin,
            min(pairs) > 1 + margin,
            f"{len(pairs)} paired runs",
            maximize,
        )
    if resolution > 0:
        low = first / (1 + resolution_of(base))  # the gain must clear the baseline's capacity bracket
        if not maximize:
            # A latency is one measurement at each trial's capacity: the brackets bound the rate, not it.
            return Gain(metric, first, first, first, resolution, low > 1, "one run each", maximize)
        # Capacity brackets: the candidate's true value is in [value, value x (1 + its resolution)].
        high = first * (1 + resolution_of(candidate))
        return Gain(metric, first, low, high, resolution, low > 1, "capacity brackets")
    return Gain(metric, first, first, first, margin, first > 1 + margin, "one run each", maximize)


def resolution_of(record: TrialRecord) -> float:
    """The relative width of a trial's capacity bracket (0 for a fixed-load trial)."""
    value = record.capacity.resolution if record.capacity is not None else None
    return float(value) if isinstance(value, (int, float)) else 0.0


def _improvement(new: float, old: float, maximize: bool) -> float:
    """new vs old as a ratio where > 1 is better (inf when old is 0 and new is better)."""
    if maximize:
        return new / old if old > 0 else float("inf") if new > 0 else 1.0
    return old / new if new > 0 else float("inf") if old > 0 else 1.0


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f} %"


def _reduction(ratio: float) -> float:
    """old / new as (old - new) / old, the front table's convention for a minimized objective."""
    return 1 - 1 / ratio if ratio > 0 else float("-inf")


def _lower(ratio: float) -> str:
    """A minimized objective's ratio (old / new) as words: "32.3 % lower", or "4.0 % higher" for a loss."""
    change = _reduction(ratio)
    return f"{abs(change) * 100:.1f} % {'lower' if change >= 0 else 'higher'}"


def _lower_span(low: float, high: float) -> str:
    """An interval of ratios (old / new) as words, e.g. "30.1 % to 34.0 % lower"."""
    first, last = _reduction(low), _reduction(high)
    if first >= 0:  # both ends lower: one word for both
        return f"{first * 100:.1f} % to {last * 100:.1f} % lower"
    if last < 0:  # both higher: the smaller rise first
        return f"{-last * 100:.1f} % to {-first * 100:.1f} % higher"
    return f"{_lower(low)} to {_lower(high)}"
