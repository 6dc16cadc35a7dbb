"""The feasible Pareto front of a study's records, the best config on it, and the baseline trial.

`recommend` picks the best config found (autotune/tune/recommendation.py then weighs it against the
baseline, vLLM's defaults): the highest feasible primary objective, where near-ties go to the lower
latencies together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.tune.study import TrialRecord

# Two configs whose primary objective is within this fraction are a tie, broken by the next objectives:
# real measurements vary by a few percent run to run, so a 0.5% "win" is not a reason to pick a config.
TIE_TOLERANCE = 0.01


def contenders(recs: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The trials that can be recommended: feasible, measured, not a duplicate of another."""
    return [r for r in recs if r.feasible and r.duplicate_of is None and r.values]


def pareto_front(recs: Sequence[TrialRecord], maximize: Sequence[bool]) -> list[TrialRecord]:
    """The feasible, non-dominated trials (duplicates left out), best primary objective first."""
    pool = contenders(recs)
    signs = [-1.0 if m else 1.0 for m in maximize]

    def cost(r: TrialRecord) -> list[float]:
        return [s * v for s, v in zip(signs, r.values or [], strict=True)]

    front = []
    for r in pool:
        c = cost(r)
        dominated = any(
            all(o <= m for o, m in zip(cost(other), c, strict=True)) and cost(other) != c for other in pool
        )
        if not dominated:
            front.append(r)
    return sorted(front, key=lambda r: cost(r))


def recommend(
    recs: Sequence[TrialRecord],
    maximize: Sequence[bool],
    resolution: Callable[[TrialRecord], float] = lambda r: 0.0,
) -> TrialRecord | None:
    """The best config found: best feasible primary objective; among its ties, the next objectives.

    Only Pareto-optimal trials can win, and among near-ties on throughput the lower-latency one does,
    so the recommendation never trades a lot of latency for noise-level throughput. A trial ties with
    the best when its own measurement cannot tell them apart: its value is within TIE_TOLERANCE of the
    best's, or its `resolution` (a capacity bracket's relative width: its true value lies up to that
    much above it) reaches the best's value. Each trial is judged by its own bracket, so one coarse
    trial does not make every trial a tie. The tie is broken by the next objectives together (the sum
    of each one's ratio to the best among the tied), not one after the other: 3 % less TTFT does not
    win over 35 % less ITL.
    """
    front = pareto_front(recs, maximize)
    if not front:
        return None
    sign = 1.0 if maximize[0] else -1.0
    best = max(sign * (r.values or [0])[0] for r in front)

    def ties(r: TrialRecord) -> bool:
        value = (r.values or [0])[0]
        reach = max(TIE_TOLERANCE * abs(best), resolution(r) * abs(value))
        return best - sign * value <= reach

    near = [r for r in front if ties(r)]
    return min(near, key=lambda r: _tie_cost(r, near, maximize[1:]))


def _tie_cost(
    r: TrialRecord, tied: Sequence[TrialRecord], maximize: Sequence[bool]
) -> tuple[float, list[float]]:
    """How far `r` is from the best of `tied` on the secondary objectives: the sum of ratios (1 = the
    best on that objective), then the objectives in order for an exact tie."""
    ratios, ordered = 0.0, []
    for i, up in enumerate(maximize, start=1):
        mine = _positive(r, i)
        top = (max if up else min)(_positive(t, i) for t in tied)
        ratios += top / mine if up else mine / top
        ordered.append(-mine if up else mine)
    return ratios, ordered


def _positive(r: TrialRecord, i: int) -> float:
    """Objective `i` of `r`, kept above 0 so that ratios are defined (latencies and throughputs are >= 0)."""
    return max((r.values or [])[i], 1e-12)


def baseline(recs: Sequence[TrialRecord]) -> TrialRecord | None:
    """The trial of vLLM's default config (the first trial of the study; its measured one if the first
    was interrupted)."""
    measured = next((r for r in recs if r.baseline and r.state == "COMPLETE"), None)
    return measured or next((r for r in recs if r.baseline), None)


def moved_defaults(base: TrialRecord | None) -> dict[str, Any]:
    """vLLM's own default of each flag the baseline could not take (the space's nearest value stands
    in): the study's record, else (a study from before it) TP=1 when the baseline's TP is not 1."""
    if base is None:
        return {}
    if base.vllm_defaults:
        return dict(base.vllm_defaults)
    tp = int(base.config.get("tensor_parallel_size") or 1)
    return {} if tp == 1 else {"tensor_parallel_size": 1}


def defaults_label(base: TrialRecord | None) -> str:
    """What the baseline is: vLLM's defaults, "at TP=2" (or "at max_num_seqs=256") when the space moved
    a flag off vLLM's default (a 70B model does not fit one GPU: the space's nearest TP stands in)."""
    moved = moved_defaults(base)
    if base is None or not moved:
        return "vLLM's defaults"
    return f"vLLM's defaults at {_settings({n: base.config.get(n) for n in moved})}"


def moved_note(values: Mapping[str, Any], moved: Mapping[str, Any]) -> str | None:
    """What the baseline is when the space moved it off vLLM's defaults (`values`: its flags, `moved`:
    vLLM's own defaults of those it could not take), in a line; None when nothing moved."""
    if not moved:
        return None
    at = _settings({n: values.get(n) for n in moved})
    own = _settings(moved, " and ")
    one = len(moved) == 1
    default, are, value, stand = (
        ("default", "is", "value", "stands") if one else ("defaults", "are", "values", "stand")
    )
    return (
        f"the baseline is vLLM's defaults at {at}: vLLM's own {default}, {own}, {are} outside this space "
        f"(the nearest {value} it allows {stand} in)"
    )


def _settings(values: Mapping[str, Any], sep: str = ", ") -> str:
    """Flags as the texts name them: "TP=2, max_num_seqs=256" (tensor parallelism by its short name)."""
    return sep.join(f"{'TP' if n == 'tensor_parallel_size' else n}={v}" for n, v in values.items())
