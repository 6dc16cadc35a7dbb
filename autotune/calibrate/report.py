"""The fit report: each constant's old and new value, each point's error before and after, warnings."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from autotune.calibrate.fit import FitResult
from autotune.calibrate.points import Error
from autotune.sim.calibration import calibration_fields

CLASS_BOUND = 0.20  # a class of metrics above this median |error| after the fit is worth a warning
CLASS_ORDER = ("throughput", "ttft", "tpot/itl", "latency", "memory")
# A class's median |error| up by this much after the fit is worth a warning: the report's one-decimal
# percentages show it, where rounding the constants to four digits moves a median by less.
WORSE_BY = 0.005
# A constant at its bound with a class still off: the replays likely ran another config than the server.
UNSTATED_FLAGS = (
    "a likely cause: the server runs flags the points do not say (/metrics shows only max_model_len, "
    "block size, memory utilization, KV dtype and prefix caching): pass max_num_seqs, "
    "max_num_batched_tokens, enable_chunked_prefill and the like with --set when not vLLM's defaults"
)
# The same with --points, which refuses --set: the flags are the points' own.
UNSTATED_POINT_FLAGS = (
    "a likely cause: the measured servers ran flags the points do not say: add max_num_seqs, "
    "max_num_batched_tokens, enable_chunked_prefill and the like to the points' `flags` when not "
    "vLLM's defaults"
)


def class_medians(errors: Iterable[Error]) -> dict[str, float]:
    """Median |error| per metric class (throughput, ttft, tpot/itl, latency, memory); `starts` left out."""
    groups: dict[str, list[float]] = {}
    for e in errors:
        if e.metric != "starts":
            groups.setdefault(e.fit_class, []).append(abs(e.signed))
    return {c: statistics.median(groups[c]) for c in CLASS_ORDER if c in groups}


def warnings(result: FitResult, points_file: bool = False) -> list[str]:
    """What a user should know before trusting the fitted constants (`points_file`: fitted to --points,
    whose flags the advice points to instead of --set)."""
    out = []
    for name in result.at_bound:
        out.append(f"{name} ended at a bound of its range: the model cannot reach the data there")
    for group in confounded_groups(result.confounded):
        names = ", ".join(group[:-1]) + f" and {group[-1]}"
        out.append(f"{names} move together in this data: only their combination is fitted")
    if result.prior_bound:
        moved = ", ".join(f"{n} ({_change(result, n):+.1%})" for n in result.prior_bound)
        out.append(
            f"the data barely constrains {moved}: the prior weighs on them as much as the data, so "
            "their values are loose (a load that leans on them may be predicted worse)"
        )
    off = False
    for cls, value in class_medians(result.after).items():
        if value > CLASS_BOUND:
            off = True
            out.append(
                f"{cls} points keep a {value:.0%} median error after the fit (above {CLASS_BOUND:.0%})"
            )
    if off and result.at_bound:
        out.append(UNSTATED_POINT_FLAGS if points_file else UNSTATED_FLAGS)
    out += worse_classes(result)
    out += result.notes
    return list(dict.fromkeys(out))  # a group can be reached from more than one of its pairs


def worse_classes(result: FitResult) -> list[str]:
    """A warning per class of points the fit made worse: least squares may trade one class for others."""
    before = class_medians(result.before)
    return [
        f"the fit made {cls} points worse: median |error| {before[cls]:.1%} -> {value:.1%} (traded for "
        "the other classes: check them before trusting these predictions)"
        for cls, value in class_medians(result.after).items()
        if value > before.get(cls, value) + WORSE_BY
    ]


def confounded_groups(pairs: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The confounded pairs joined into groups (connected components), each in first-seen order."""
    groups: list[list[str]] = []
    for a, b in pairs:
        joined = [g for g in groups if a in g or b in g]
        merged = [n for g in joined for n in g]
        merged += [n for n in (a, b) if n not in merged]
        groups = [g for g in groups if g not in joined] + [merged]
    return groups


def constants_table(result: FitResult) -> list[str]:
    """One line per constant the fit could move: prior, fitted, change."""
    lines = [f"{'constant':34} {'prior':>12} {'fitted':>12} {'change':>8}  unit"]
    units = {i.name: i.unit for i in calibration_fields()}
    for name in result.free:
        old, new = getattr(result.prior, name), getattr(result.fitted, name)
        mark = "  (bound)" if name in result.at_bound else ""
        lines.append(f"{name:34} {old:12.5g} {new:12.5g} {_change(result, name):+8.1%}  {units[name]}{mark}")
    return lines


def points_table(before: Sequence[Error], after: Sequence[Error]) -> list[str]:
    """Each measured metric: measured value, signed error before and after the fit."""
    lines = [f"{'point':30} {'metric':24} {'measured':>12} {'before':>8} {'after':>8}"]
    for b, a in zip(before, after, strict=True):
        if b.metric == "starts":
            lines.append(
                f"{b.point:30} {b.metric:24} {b.measured!s:>12} {b.simulated!s:>8} {a.simulated!s:>8}"
            )
            continue
        lines.append(f"{b.point:30} {b.metric:24} {b.measured:12.4g} {b.signed:+8.1%} {a.signed:+8.1%}")
    return lines


def fit_report(result: FitResult, header: Sequence[str] = (), points_file: bool = False) -> str:
    """The whole report as text (what `autotune calibrate` prints and writes next to the calibration;
    `points_file`: fitted to --points)."""
    before, after = class_medians(result.before), class_medians(result.after)
    lines = [*header, ""]
    lines.append(
        f"fit: {len(result.free)} constants free, {result.evaluations} replays, {result.seconds:.1f} s"
    )
    lines += constants_table(result)
    lines.append("")
    lines.append(
        "median |error| by class: " + ", ".join(f"{c} {before[c]:.1%} -> {after[c]:.1%}" for c in after)
    )
    unseen = ", ".join(result.unseen)
    lines.append(f"stayed at their prior (no point depends on them): {unseen or 'none'}")
    found = warnings(result, points_file)
    if found:
        lines.append("")
        lines += [f"warning: {w}" for w in found]
    lines.append("")
    lines += points_table(result.before, result.after)
    return "\n".join(lines) + "\n"


def _change(result: FitResult, name: str) -> float:
    """A constant's relative move from the prior to the fitted value."""
    prior = getattr(result.prior, name)
    return getattr(result.fitted, name) / prior - 1 if prior else 0.0
