"""A trial's capacity in words: what limited it, and where its latencies sit at that rate against
their SLOs (the summary, best.json, the report's front table and probes.png)."""

from __future__ import annotations

from autotune.core.values import fmt_number
from autotune.measure.capacity_report import KEEPING_UP, ProbeSummary
from autotune.measure.evidence import UNSURE
from autotune.tune.study import TrialRecord


def limited_by(record: TrialRecord) -> str:
    """What limits a trial's capacity, in a few words ("" when it was not a capacity search, or its
    study predates the record): the SLOs the rate above it missed, "(not confirmed)" after them when
    that rate was only too close to call (capacity_text's words), or keeping up."""
    c = record.capacity
    limits = c.limited_by if c is not None else None
    if not limits:
        return ""
    above = _above(record)
    unsure = limits != (KEEPING_UP,) and above is not None and above.verdict == UNSURE
    return " and ".join(limits) + (" (not confirmed)" if unsure else "")


def _above(record: TrialRecord) -> ProbeSummary | None:
    """The probe at the top of a trial's capacity bracket: the rate above its capacity (None: no probe
    failed above it)."""
    c = record.capacity
    if c is None or c.bracket is None:
        return None
    return next((p for p in c.probes if p.rate == c.bracket[1]), None)


def capacity_text(record: TrialRecord, slos: list[str]) -> str:
    """One sentence: a trial's capacity, what limits it, and where its latencies sit at that rate
    against their SLOs ("" without a capacity search)."""
    c = record.capacity
    if c is None or c.rate <= 0:
        return ""
    head = f"capacity {c.rate:.2f} req/s per replica"
    if c.cut_by_budget:
        head += " or more (its search stopped at its share of --gpu-hours)"
    limits = c.limited_by or ()
    above = _above(record)
    if limits == (KEEPING_UP,):
        bound = (
            f"it fell behind at {above.rate:.2f} req/s"
            if above is not None
            else f"it serves at most {c.saturation_throughput:.2f} req/s (saturation)"
            if c.saturation_throughput
            else "above it lies its saturation throughput"
        )
        text = f"{head}, limited by keeping up with arrivals, not by an SLO: {bound}"
    elif limits:
        how = "not confirmed" if above is not None and above.verdict == UNSURE else "missed"
        where = f" at {above.rate:.2f} req/s" if above is not None else ""
        text = f"{head}, limited by {' and '.join(limits)}: {how}{where}"
        # a rate that missed one SLO may have left another only unsure: not "missed" (an older study's
        # probes do not say, and its limits name both)
        unsure = above.unconfirmed if above is not None and how == "missed" else None
        if unsure:
            text += f" ({' and '.join(unsure)} not confirmed there)"
    else:
        text = head
    at = _slo_values(record, slos)
    # the rate named: after "fell behind at" or "not confirmed at" another rate, "that rate" misleads
    return f"{text}; at {c.rate:.2f} req/s {at}" if at else text


def _slo_values(record: TrialRecord, slos: list[str]) -> str:
    """Each SLO's value at the trial's rate against its limit, e.g. "p99_ttft_ms 593 of 2,000"."""
    from autotune.measure.slo import parse_slos

    parts = []
    for slo in parse_slos(slos) if slos else []:
        value = record.metrics.get(slo.key)
        if isinstance(value, (int, float)):
            parts.append(f"{slo.key} {fmt_number(float(value))} of {fmt_number(slo.limit_ms)}")
    return ", ".join(parts)
