"""Why no trial of a study is feasible, by count: the all-infeasible summary names its reasons
("4 did not keep up with 60.3 req/s (the most served 21.3), 1 failed to start") rather than one
sentence for all, which called a run whose every trial only fell behind a fixed load one that
"failed or violated the SLOs"."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from autotune.core.errors import STARTUP_FAILURES, FailureKind
from autotune.tune.study import NO_RATE, TrialRecord

KEPT_BEHIND = "did not keep up"  # TrialRecord.status of a trial that fell behind its load (unmet_reason)


def unmet_counts(recs: Sequence[TrialRecord]) -> str:
    """The infeasible trials' reasons, the commonest first, each with its count; "" when none is told.

    A duplicate repeats another trial's result and a trial cut short by --gpu-hours has no verdict:
    neither is counted here (the summary says the cut ones apart).
    """
    counts: Counter[str] = Counter()
    for r in recs:
        if r.duplicate_of is None and r.failure != FailureKind.BUDGET_SPENT:
            counts[_words(r)] += 1
    parts = []
    for words, n in counts.most_common():  # ties keep the order first seen
        if words == KEPT_BEHIND:
            words += _pace(recs)
        parts.append(f"{n} {words}")
    return ", ".join(parts)


def _words(r: TrialRecord) -> str:
    """One trial's reason in the summary's words, from its status (tune/study.py `unmet_reason`)."""
    if not r.launched:
        return "screened out (predicted to fail to start)" if r.screened else "rejected before launch"
    if r.failure in STARTUP_FAILURES:
        return "failed to start"
    status = r.status
    if status == KEPT_BEHIND:
        return KEPT_BEHIND
    if status == "violates SLO":
        return "violated the SLOs"
    if status.startswith(NO_RATE):
        return "confirmed no rate (their lowest too close to the SLOs to call)"
    if r.failure == FailureKind.EARLY_ABORT:
        return "stopped early (the SLOs out of reach)"
    return f"failed ({status})"


def _pace(recs: Sequence[TrialRecord]) -> str:
    """The words after "did not keep up": " with 60.3 req/s (the most served 21.3)", the load the
    fixed-load windows that fell behind were offered (a range when their windows' rates differ) and the
    most the best of them served; "" without such a window."""
    steady = [
        r.load.steady
        for r in recs
        if r.duplicate_of is None and r.load is not None and r.load.steady is not None and r.kept_up is False
    ]
    if not steady:
        return ""  # a capacity search that fell behind at every rate: its probes say at which
    low, high = (f"{f(s.offered_rate for s in steady):.1f}" for f in (min, max))
    offered = low if low == high else f"{low}-{high}"
    return f" with {offered} req/s (the most served {max(s.served_rate for s in steady):.1f})"
