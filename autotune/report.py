"""The results of a run: trials.csv, pareto.csv, best.json, best.sh, pareto.png, report.html, and the
terminal summary (the feasible Pareto front and the recommended flags).

How the recommendation is picked (study.recommend): among feasible trials on the Pareto front, the
highest primary objective (output throughput by default); configs within 1% of it count as a tie,
broken by the next objectives in order (p99 TTFT, then p99 ITL). The baseline is trial 0, vLLM's
defaults for the GPU; gains are against its value (when the baseline itself violates the SLOs, that is
said, and the gain is against its raw throughput).
"""

from __future__ import annotations

import base64
import html
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.export import render, serve_flags
from autotune.progress import short_params
from autotune.recommendation import Recommendation, decide
from autotune.study import TrialRecord, baseline, pareto_front

SUMMARY_METRICS = ("request_throughput", "p99_tpot_ms", "p99_e2el_ms", "num_preemptions", "capacity_rate")


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


def outcome(
    records: list[TrialRecord],
    objective_names: list[str],
    maximize: list[bool],
    slos: list[str],
    remeasured: dict[str, list[float]] | None = None,
) -> Outcome:
    """Front, recommendation and baseline of a study's records."""
    decision = decide(records, maximize, objective_names, remeasured)
    return Outcome(
        records=records,
        front=pareto_front(records, maximize),
        best=decision.trial,
        baseline=baseline(records),
        objective_names=objective_names,
        maximize=maximize,
        slos=slos,
        decision=decision,
    )


def front_table(out: Outcome, limit: int = 15) -> str:
    """The feasible Pareto front as a text table, the recommendation marked with *."""
    if not out.front:
        return "Pareto front: empty (no feasible trial)."
    headers = ["", "trial", *out.objective_names, "vs baseline", "config"]
    rows = []
    for r in out.front[:limit]:
        mark = "*" if out.best and r.number == out.best.number else ""
        values = [_fmt(v) for v in r.values or []]
        gain = out.gain(r)
        rows.append(
            [mark, f"#{r.number}", *values, _gain_text(gain) if gain is not None else "-", _params_text(r)]
        )
    if (
        out.baseline
        and out.baseline.values
        and all(r.number != out.baseline.number for r in out.front[:limit])
    ):
        status = "feasible" if out.baseline.feasible else out.baseline.failure or "violates SLO"
        values = [_fmt(v) for v in out.baseline.values]
        rows.append(
            ["", f"#{out.baseline.number}", *values, f"baseline ({status})", _params_text(out.baseline)]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]
    shown = f", top {limit} by {out.objective_names[0]} shown" if len(out.front) > limit else ""
    counts = f"{len(out.front)} points; {len(out.feasible())} of {len(out.records)} trials feasible{shown}"
    title = f"Feasible Pareto front ({counts}):"
    return "\n".join([title, *lines])


def summary_text(out: Outcome) -> str:
    """What `autotune run` prints at the end: the front, the verdict and the recommended flags."""
    parts = [front_table(out), "", out.verdict()]
    if out.best is not None:
        parts.append("  " + shlex.join(["vllm", "serve", *out.best.engine_config().to_args()]))
    return "\n".join(parts)


def write_all(run_dir: Path, out: Outcome) -> list[Path]:
    """Write every result file into the run folder; returns their paths."""
    import pandas as pd

    run_dir.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([_row(r, out) for r in out.records])
    paths = [run_dir / "trials.csv", run_dir / "pareto.csv"]
    frame.to_csv(paths[0], index=False)
    front_numbers = {r.number for r in out.front}
    front = frame[frame["trial"].isin(front_numbers)] if len(frame) else frame
    front.to_csv(paths[1], index=False)
    paths.append(_write_best(run_dir, out))
    if out.best is not None:
        paths.append(_write_best_sh(run_dir, out.best))
    paths.append(plot_front(run_dir / "pareto.png", out))
    paths.append(_write_html(run_dir / "report.html", out, front, frame))
    return paths


def _row(r: TrialRecord, out: Outcome) -> dict[str, Any]:
    row: dict[str, Any] = {
        "trial": r.number,
        "state": r.state,
        "baseline": r.baseline,
        "feasible": r.feasible,
        "pareto": any(f.number == r.number for f in out.front),
        "duplicate_of": r.duplicate_of,
        "reason": r.failure or ("" if r.feasible else "violates SLO"),
        "message": r.message,
    }
    row.update(r.params)
    for name, value in zip(out.objective_names, r.values or [None] * len(out.objective_names), strict=False):
        row[name] = value if r.failure is None or r.metrics else None
    row.update({f"margin_{k}": v for k, v in r.margins.items()})
    for key in SUMMARY_METRICS:
        value = r.metrics.get(key, r.user_attrs.get("info", {}).get(key))
        if value is not None:
            row[key] = value
    row["gpu_seconds"] = r.gpu_seconds
    row["gpu_seconds_saved"] = r.gpu_seconds_saved
    # where it ran (Ray's placement): the node and the devices it was pinned to, as CUDA_VISIBLE_DEVICES
    row["node_ip"] = r.user_attrs.get("node_ip")
    row["node_id"] = r.user_attrs.get("node_id")
    gpu_ids = r.user_attrs.get("gpu_ids")
    row["gpu_ids"] = ",".join(map(str, gpu_ids)) if gpu_ids else None
    return row


def _write_best(run_dir: Path, out: Outcome) -> Path:
    path = run_dir / "best.json"
    data: dict[str, Any] = {"verdict": out.verdict(), "slos": out.slos, "objectives": out.objective_names}
    data["how"] = (
        f"highest feasible {out.objective_names[0]} on the Pareto front (ties within the capacity resolution "
        "go to the lowest latencies together); vLLM's defaults are kept unless the gain clears the "
        "measurement's resolution or noise"
    )
    gain = out.decision.gain
    data["keeps_defaults"] = out.decision.keeps_defaults
    if out.decision.candidate is not None:
        data["best_found"] = out.decision.candidate.number
    if gain is not None:
        data["gain"] = {
            "metric": gain.metric,
            "ratio": round(gain.ratio, 4),
            "interval": [round(gain.low, 4), round(gain.high, 4)],
            "margin": round(gain.margin, 4),
            "significant": gain.significant,
            "how": gain.how,
        }
    if out.best is not None:
        config = out.best.engine_config()
        data |= {
            "trial": out.best.number,
            "config": out.best.config,
            "flags": serve_flags(config),
            "command": render(config, "cmd").strip(),
            "values": dict(zip(out.objective_names, out.best.values or [], strict=False)),
            "gain_vs_baseline": out.gain(out.best),
            "metrics": out.best.metrics,
            "info": out.best.user_attrs.get("info", {}),
        }
    if out.baseline is not None:
        data["baseline"] = {
            "trial": out.baseline.number,
            "feasible": out.baseline.feasible,
            "failure": out.baseline.failure,
            "config": out.baseline.config,
            "values": dict(zip(out.objective_names, out.baseline.values or [], strict=False)),
        }
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def _write_best_sh(run_dir: Path, best: TrialRecord) -> Path:
    path = run_dir / "best.sh"
    command = render(best.engine_config(), "cmd").strip()
    path.write_text(
        "#!/bin/sh\n"
        f"# autotune recommendation: trial #{best.number} of {run_dir.name}. Extra args are appended.\n"
        f'exec {command} "$@"\n'
    )
    path.chmod(0o755)
    return path


def plot_front(path: Path, out: Outcome) -> Path:
    """Scatter of every trial that ran (second objective vs first), the front and the baseline marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=100)
    measured = [r for r in out.records if r.values and r.metrics and r.duplicate_of is None]
    use_second = len(out.objective_names) > 1

    def xy(rs: Sequence[TrialRecord]) -> tuple[list[float], list[float]]:
        xs = [(r.values or [0, 0])[1] if use_second else r.number for r in rs]
        return xs, [(r.values or [0])[0] for r in rs]

    groups = [
        ([r for r in measured if not r.feasible], "violates SLO", "#c44e52", "x"),
        ([r for r in measured if r.feasible], "feasible", "#4c72b0", "o"),
        (out.front, "Pareto front", "#55a868", "D"),
    ]
    for rs, label, color, marker in groups:
        if rs:
            xs, ys = xy(rs)
            ax.scatter(xs, ys, label=f"{label} ({len(rs)})", color=color, marker=marker, alpha=0.8)
    if out.baseline is not None and out.baseline.values and out.baseline.metrics:
        xs, ys = xy([out.baseline])
        ax.scatter(
            xs,
            ys,
            s=180,
            facecolors="none",
            edgecolors="black",
            linewidths=2,
            label="baseline (vLLM default)",
        )
    if out.best is not None:
        xs, ys = xy([out.best])
        ax.scatter(xs, ys, s=260, marker="*", color="#dd8452", label="recommended", zorder=5)
    ax.set_xlabel(out.objective_names[1] if use_second else "trial")
    ax.set_ylabel(out.objective_names[0])
    failed = sum(1 for r in out.records if not r.metrics)
    hidden = f"; front over {len(out.objective_names)} objectives" if len(out.objective_names) > 2 else ""
    ax.set_title(
        f"{len(out.records)} trials ({failed} failed or rejected, not shown){hidden}; "
        f"SLO: {', '.join(out.slos) or 'none'}",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _write_html(path: Path, out: Outcome, front: Any, trials: Any) -> Path:
    png = path.parent / "pareto.png"
    image = base64.b64encode(png.read_bytes()).decode() if png.exists() else ""
    command = render(out.best.engine_config(), "cmd").strip() if out.best else ""
    body = [
        "<!doctype html><html><head><meta charset='utf-8'><title>autotune report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}",
        "td,th{border:1px solid #ccc;padding:2px 6px}code{background:#f4f4f4;padding:4px}</style>",
        "</head><body>",
        f"<h1>autotune: {html.escape(path.parent.name)}</h1>",
        f"<p>{html.escape(out.verdict())}</p>",
        f"<p><code>{html.escape(command)}</code></p>" if command else "",
        f"<p>SLOs: {html.escape(', '.join(out.slos) or 'none')}</p>",
        f"<img alt='Pareto front' src='data:image/png;base64,{image}'>" if image else "",
        "<h2>Feasible Pareto front</h2>",
        front.to_html(index=False, na_rep="") if len(front) else "<p>empty</p>",
        "<h2>All trials</h2>",
        trials.to_html(index=False, na_rep="") if len(trials) else "<p>none</p>",
        "</body></html>",
    ]
    path.write_text("\n".join(body))
    return path


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"


def _change(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old else f"{new:,.4g} (baseline 0)"


def _gain_text(gain: float | None) -> str:
    return f"{gain * 100:+.1f}%" if gain is not None else "-"


def _params_text(r: TrialRecord) -> str:
    return short_params(r.params)
