"""The report's figures (matplotlib, written as PNG): every pair of objectives with the SLO limits drawn,
and the capacity probes of the top configs (request rate against p99 latency)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core.atomic import atomic_path
from autotune.measure.capacity_report import ProbeSummary
from autotune.measure.slo import Slo, parse_slos
from autotune.outputs.capacity_words import limited_by
from autotune.tune.objectives import metric_label
from autotune.tune.study import TrialRecord

if TYPE_CHECKING:
    from autotune.outputs.outcome import Outcome

TOP_PROBED = 5  # configs whose capacity probes are drawn
# (the result key each panel plots, its value in a probe)
_PROBE_LATENCIES: tuple[tuple[str, Callable[[ProbeSummary], float | None]], ...] = (
    ("p99_ttft_ms", lambda p: p.p99_ttft_ms),
    ("p99_itl_ms", lambda p: p.p99_itl_ms),
)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def slo_limits(slos: Sequence[str]) -> dict[str, float]:
    """SLO limits by the result key they bound, e.g. {"p99_ttft_ms": 2000.0}."""
    parsed: list[Slo] = parse_slos(list(slos)) if slos else []
    return {slo.key: slo.limit_ms for slo in parsed}


def plot_pairs(path: Path, out: Outcome) -> Path:
    """One panel per pair of objectives: measured trials, the front, baseline and recommendation,
    with each SLO limit as a dashed line on its axis (the feasible side is below it)."""
    plt = _pyplot()
    names = out.objective_names
    pairs = list(itertools.combinations(range(len(names)), 2)) or [(0, 0)]
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.2 * len(pairs), 4.6), dpi=100, squeeze=False)
    measured = [r for r in out.records if r.values and r.measured and r.duplicate_of is None]
    limits = slo_limits(out.slos)
    for ax, (y, x) in zip(axes[0], pairs, strict=True):
        _pair_panel(ax, out, measured, x if x != y else None, y, limits)
    failed = sum(1 for r in out.records if not r.measured)
    fig.suptitle(
        f"{len(out.records)} trials ({failed} failed or rejected, not drawn); "
        f"SLO: {', '.join(out.slos) or 'none'}",
        fontsize=10,
    )
    _legend(axes[0][0], others=axes[0][1:])
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


def _legend(ax: Any, others: Sequence[Any] = ()) -> None:
    """The panel's legend, when anything is labelled (a run with no trial measured has nothing, and
    matplotlib warns on an empty legend), naming what the `others` panels draw too, each label once:
    with two SLOs the second's limit line is on another panel than the first's."""
    handles: dict[str, Any] = {}
    for panel in (ax, *others):
        for handle, label in zip(*panel.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        ax.legend(list(handles.values()), list(handles), loc="best", fontsize=7)


def _pair_panel(
    ax: Any, out: Outcome, measured: list[TrialRecord], x: int | None, y: int, limits: dict[str, float]
) -> None:
    def xy(rs: Sequence[TrialRecord]) -> tuple[list[float], list[float]]:
        xs = [float((r.values or [])[x]) if x is not None else float(r.number) for r in rs]
        return xs, [float((r.values or [])[y]) for r in rs]

    front = {r.number for r in out.front}
    # each group counts the points it draws: the front's feasible points are diamonds, not dots
    groups = [
        ([r for r in measured if not r.feasible], "violates SLO / aborted", "#c44e52", "x"),
        ([r for r in measured if r.feasible and r.number not in front], "feasible", "#4c72b0", "o"),
        (out.front, "Pareto front (feasible)", "#55a868", "D"),
    ]
    for rs, label, color, marker in groups:
        if rs:
            ax.scatter(*xy(rs), label=f"{label} ({len(rs)})", color=color, marker=marker, alpha=0.8, s=28)
    base = out.baseline
    if base is not None and base.values and base.metrics:
        ax.scatter(*xy([base]), s=160, facecolors="none", edgecolors="black", linewidths=2, label="baseline")
    if out.best is not None:
        ax.scatter(*xy([out.best]), s=260, marker="*", color="#dd8452", label="recommended", zorder=5)
    names = out.objective_names
    for axis, index in (("x", x), ("y", y)):
        if index is None:
            continue
        limit = limits.get(names[index])
        if limit is not None:
            line = ax.axvline if axis == "x" else ax.axhline
            line(limit, color="#c44e52", linestyle="--", linewidth=1.2, label=f"SLO {names[index]}")
    ax.set_xlabel(metric_label(names[x]) if x is not None else "trial")
    ax.set_ylabel(metric_label(names[y]))
    ax.grid(alpha=0.3)


def top_probed(out: Outcome, top: int = TOP_PROBED) -> list[TrialRecord]:
    """The best feasible configs (front order, the recommendation first) that carry capacity probes."""
    rest = [r for r in out.front if out.best is None or r is not out.best]
    ranked = ([out.best] if out.best else []) + rest
    return [r for r in ranked if capacity_probes(r)][:top]


def capacity_probes(record: TrialRecord) -> list[ProbeSummary]:
    """The trial's capacity probes, [] when it has none."""
    return list(record.capacity.probes) if record.capacity is not None else []


def plot_probes(path: Path, out: Outcome) -> Path | None:
    """Request rate against p99 TTFT and p99 ITL for the top configs' capacity probes; None without any.

    Every probe is drawn: a filled marker passed, a hollow one did not (missed an SLO, did not keep up,
    or too close to call), an x ended without latencies (drawn at the panel's top). A dotted line marks
    each config's saturation throughput (the most it can serve); the legend says what limits each
    config's capacity. The SLO limits are dashed lines.
    """
    configs = top_probed(out)
    if not configs:
        return None
    plt = _pyplot()
    limits = slo_limits(out.slos)
    fig, axes = plt.subplots(1, len(_PROBE_LATENCIES), figsize=(11, 4.6), dpi=100, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, latency) in zip(axes[0], _PROBE_LATENCIES, strict=True):
        for color, record in zip(colors, configs, strict=False):
            _probe_series(ax, record, latency, color, starred=record is out.best)
        if key in limits:
            ax.axhline(limits[key], color="#c44e52", linestyle="--", linewidth=1.2, label="SLO limit")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(metric_label(key))
        ax.grid(alpha=0.3)
    _legend(axes[0][0])
    fig.suptitle(
        "Capacity probes of the top configs (filled: passed; hollow: missed; x: failed, no latency; "
        "dotted: saturation throughput; a probe of several windows: its worst p99)",
        fontsize=9,
    )
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


def probe_points(
    record: TrialRecord, latency: Callable[[ProbeSummary], float | None]
) -> list[tuple[float, float | None, bool]]:
    """(rate, latency or None, passed) of every probe of a trial, by rate: the failing ones too."""
    points = [(float(p.rate or 0.0), latency(p), p.meets_slos) for p in capacity_probes(record)]
    return sorted(points, key=lambda t: t[0])


def _probe_series(
    ax: Any,
    record: TrialRecord,
    latency: Callable[[ProbeSummary], float | None],
    color: str,
    starred: bool,
) -> None:
    points = probe_points(record, latency)
    measured = [(rate, value, met) for rate, value, met in points if value is not None]
    limit = limited_by(record)
    label = f"#{record.number}" + (" (recommended)" if starred else "") + (f": {limit}" if limit else "")
    if measured:
        rates, values = [r for r, _, _ in measured], [v for _, v, _ in measured]
        ax.plot(rates, values, color=color, linewidth=2.2 if starred else 1.0, label=label)
        label = None
    for rate, value, met in measured:
        ax.scatter([rate], [value], s=36, color=color if met else "white", edgecolors=color, zorder=4)
    lost = [rate for rate, value, _ in points if value is None]
    if lost:  # at the top of the panel: no latency to place it by
        top = ax.get_ylim()[1] if measured else 1.0
        ax.scatter(lost, [top] * len(lost), marker="x", s=40, color=color, zorder=4, label=label)
    saturation = record.capacity.saturation_throughput if record.capacity is not None else None
    if saturation:
        ax.axvline(saturation, color=color, linestyle=":", linewidth=1.0, alpha=0.8)
