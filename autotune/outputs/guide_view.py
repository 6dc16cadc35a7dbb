"""What a guided run shows (docs/guided-search.md): the guide's predicted vs measured value per real
trial (a plot and a table), GPU-hours spent against the budget and why the run stopped.

A guided run writes runs/<study>/guide.json (`guide_data`, commands/run_guide.py); the report
(report.html, best.json) reads it. The dashboard's note and figure show the same data: `guide_data` of
the live search while the run goes, guide.json after it (`autotune dashboard`), so every view of a trial
gives one prediction (the trials' own `guide` attrs hold none for vLLM's defaults, which the guide did
not choose).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.tune.guide_options import RESOLUTION

if TYPE_CHECKING:
    import optuna

    from autotune.tune.guided import GuidedSearch

GUIDE_FILE = "guide.json"
PLOT_FILE = "guide.png"


def guide_data(search: GuidedSearch, study: optuna.Study, stop_reason: str | None) -> dict[str, Any]:
    """guide.json's content: predicted vs measured per real trial (`predicted_vs_measured`), GPU-hours
    spent (the trials' and the re-measurements') against the budget, why the run stopped (None while it
    goes), the guide's speed factor, and vLLM's defaults' prediction when the run ended without
    measuring them (while it goes they may still come: nothing said)."""
    from autotune.tune.remeasure import StoredRepeats

    rows = predicted_vs_measured(search, study)
    repeats_h = StoredRepeats.of(study).gpu_s / 3600
    spent = sum(r["gpu_hours"] for r in rows) + repeats_h
    data = {
        "gpu_hours": round(spent, 4),
        "remeasure_gpu_hours": round(repeats_h, 4),
        "budget_gpu_hours": search.options.gpu_hours,
        "stop_reason": stop_reason,
        "speed_factor": round(search.refit.factor(search.index), 4),
        "trials": rows,
    }
    defaults = unmeasured_defaults(search, study) if stop_reason is not None else None
    if defaults is not None:
        data["defaults"] = defaults
    return data


def predicted_vs_measured(search: GuidedSearch, study: optuna.Study) -> list[dict[str, Any]]:
    """Per real trial: the guide's corrected prediction when it was chosen (for the defaults: its own),
    its own prediction ("raw": at its calibration, before any refit or correction), what it measured,
    its GPU-hours, and its saturation bursts against the guide's replay at its final calibration
    ("bursts": the speed offset and the shape, tune/guide_check.py) (the summary, guide.json and the
    report's plot)."""
    rows = []
    trials = study.get_trials(deepcopy=False)
    for o in search.observations(study):
        rows.append(
            {
                "trial": o.number,
                "predicted": o.chosen.get("predicted", search.own_prediction(o.key)),
                "raw": o.chosen.get("raw", search.own_prediction(o.key)),
                "measured": o.measured,
                "gpu_hours": round(o.gpu_s / 3600, 4),
                "by": o.chosen.get("by") or _not_picked(search, o.key),  # the pick's rule
            }
        )
        check = search.bursts.misfit(o, search.refit, search.index)  # its bursts against the guide's replay
        if check is not None:
            rows[-1]["bursts"] = {"offset": round(check.offset, 4), "shape": round(check.shape, 4)}
        if o.interrupted:  # why: "interrupted", or "budget_spent" (its capacity search hit its cap)
            rows[-1]["interrupted"] = trials[o.number].user_attrs.get("failure") or "interrupted"
    return rows


def unmeasured_defaults(search: GuidedSearch, study: optuna.Study) -> dict[str, Any] | None:
    """vLLM's defaults as the guide predicts them, when the run ended without measuring them (the budget
    could not afford them, or it stopped first): the guide's prediction at its refitted speed
    ("predicted"; None: it predicts they do not start, or meet no rate) and at its own calibration
    ("raw"), whether they start, and what the budget would charge them when more than it had left
    ("over_budget_gpu_hours"). None: they were measured, or the run does not compare with them."""
    key = search.baseline_key
    if key is None or any(o.key == key and not o.interrupted for o in search.observations(study)):
        return None
    prediction = search.prediction(key)
    defaults = {
        "predicted": search.raw(prediction),
        "raw": search.own_prediction(key),
        "starts": prediction.starts if prediction is not None else None,
    }
    over = search.defaults_over_budget(study)
    if over is not None:  # left out: more than the budget had left (GuidedSearch._enqueue_defaults)
        defaults["over_budget_gpu_hours"] = round(over, 2)
    return defaults


def defaults_text(defaults: dict[str, Any]) -> str:
    """The line that says what the guide predicts for vLLM's defaults, which the run did not measure."""
    if defaults.get("predicted") is not None:
        guess = f"the guide predicts {defaults['predicted']:,.1f}"
    elif defaults.get("starts") is False:
        guess = "the guide predicts they do not start"
    else:
        guess = "the guide predicts they meet no rate under the SLOs"
    over = defaults.get("over_budget_gpu_hours")
    why = f"about {over:.2f} GPU-h, more than the budget had left" if over else "the run stopped before them"
    return f"vLLM's defaults: not measured ({why}); {guess}"


def _not_picked(search: GuidedSearch, key: str) -> str | None:
    """Why a trial the guide did not pick was measured (None: not known, e.g. a resumed older study)."""
    return "vLLM's defaults" if key == search.baseline_key else None


def read_guide(run_dir: Path) -> dict[str, Any] | None:
    """guide.json of a guided run (None: the run was not guided, or the file does not parse)."""
    path = Path(run_dir) / GUIDE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("trials"), list) else None


def plot_guide(path: Path, data: dict[str, Any], metric: str) -> Path | None:
    """Predicted (the guide's raw prediction, and corrected by the measurements so far, when the trial
    was chosen) vs measured, one point per real trial that met the SLOs; beside it each trial's error,
    in trial order (configs measured alike share one spot on the first plot); None when none met them."""
    rows = compared(data)
    if not rows:
        return None
    from autotune.outputs.plots import _pyplot

    plt = _pyplot()
    fig, (ax, err) = plt.subplots(1, 2, figsize=(10, 4.6), gridspec_kw={"width_ratios": [1, 1.2]})
    _plot_scatter(ax, rows, metric)
    _plot_errors(err, rows)
    fig.suptitle("Guide: predicted vs measured per real trial", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compared(data: dict[str, Any]) -> list[dict[str, Any]]:
    """guide.json's trials with both a prediction and a measurement (met the SLOs): the points of
    guide.png and of the dashboard's figure alike."""
    return [r for r in data["trials"] if r.get("measured") and r.get("predicted")]


def _plot_scatter(ax: Any, rows: Sequence[dict[str, Any]], metric: str) -> None:
    measured = [r["measured"] for r in rows]
    raw = [r for r in rows if r.get("raw")]  # 0: the raw guide predicted it would miss the SLOs
    ax.scatter(
        [r["raw"] for r in raw], [r["measured"] for r in raw], marker="x", color="#999", label="guide (raw)"
    )
    ax.scatter([r["predicted"] for r in rows], measured, color="#1f77b4", label="guide corrected")
    for r in rows:
        ax.annotate(f"#{r['trial']}", (r["predicted"], r["measured"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")  # fmt: skip
    values = [v for r in rows for v in (r.get("raw"), r["predicted"], r["measured"]) if v]
    lo, hi = min(values) * 0.95, max(values) * 1.05
    ax.plot([lo, hi], [lo, hi], color="#444", linewidth=0.8, label="predicted = measured")
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel=f"predicted {metric}", ylabel=f"measured {metric}")
    ax.legend(fontsize=8)


def _plot_errors(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Each trial's measured value against its predictions, in %, in the order the trials ran: how the
    correction learns, and which misses lie within the capacity search's target resolution."""
    trials = [r["trial"] for r in rows]
    for key, style in (("raw", {"marker": "x", "color": "#999"}), ("predicted", {"color": "#1f77b4"})):
        some = [r for r in rows if r.get(key)]  # a raw 0: predicted to miss the SLOs, no ratio to plot
        errors = [100 * (r["measured"] / r[key] - 1) for r in some]
        label = "vs guide (raw)" if key == "raw" else "vs guide corrected"
        ax.scatter([r["trial"] for r in some], errors, label=label, **style)
    ax.axhline(0, color="#444", linewidth=0.8)
    # the search's target, not any trial's own bracket: the report states the recommendation's (2.8 %,
    # say), which guide.json does not hold, and a bracket may close narrower or, unsure, wider
    ax.axhspan(-100 * RESOLUTION, 100 * RESOLUTION, color="#1f77b4", alpha=0.08,
               label=f"within ±{RESOLUTION:.0%} (the capacity search's target resolution)")  # fmt: skip
    ax.set(xlabel="trial", ylabel="measured vs predicted (%)")
    ax.set_xticks(trials)
    ax.legend(fontsize=8)


def spend_text(data: dict[str, Any]) -> str:
    """'1.23 GPU-h spent of the 2 budgeted (0.40 of them re-measuring the top); stopped: why'."""
    budget = data.get("budget_gpu_hours")
    of = f" of the {budget:g} budgeted" if budget else ""
    repeats = data.get("remeasure_gpu_hours") or 0.0
    within = f" ({repeats:.2f} of them re-measuring the top)" if repeats else ""
    why = data.get("stop_reason") or "--n-trials reached"
    return f"{data.get('gpu_hours', 0.0):.2f} GPU-h spent{of}{within}; stopped: {why}"


def error_text(rows: Sequence[dict[str, Any]]) -> str:
    """The corrected and raw predictions' errors as guide.png plots them (measured / predicted - 1):
    the median and the median of their sizes."""
    pairs = [r for r in rows if r.get("measured") and r.get("predicted") and r.get("raw")]
    if not pairs:
        return ""

    def errors(key: str) -> str:
        values = [r["measured"] / r[key] - 1 for r in pairs]
        sizes = [abs(v) for v in values]
        return f"median {statistics.median(values):+.1%} (size {statistics.median(sizes):.1%})"

    return (
        f"measured vs predicted when each trial was chosen: {errors('predicted')}; "
        f"vs the guide's raw prediction: {errors('raw')}"
    )


def guide_html(run_dir: Path, escape: Any, metric: str) -> str:
    """The report's "Guided search" section (empty for a run that was not guided)."""
    data = read_guide(run_dir)
    if data is None:
        return ""
    import base64

    parts = ["<h2>Guided search</h2>", f"<p>{escape(spend_text(data))}</p>"]
    if data.get("defaults"):
        parts.append(f"<p>{escape(defaults_text(data['defaults']))}.</p>")
    if error_text(data["trials"]):
        parts.append(f"<p class='sub'>{escape(error_text(data['trials']))}</p>")
    png = plot_guide(Path(run_dir) / PLOT_FILE, data, metric)
    if png is not None:
        encoded = base64.b64encode(png.read_bytes()).decode()
        parts.append(f"<p><img alt='guide: predicted vs measured' src='data:image/png;base64,{encoded}'></p>")
    rows = "".join(
        f"<tr><td>#{r['trial']}</td><td>{_num(r.get('raw'))}</td><td>{_num(r.get('predicted'))}</td>"
        f"<td>{_num(r.get('measured'), 'missed the SLOs or failed')}</td><td>{r['gpu_hours']:.2f}</td>"
        f"<td>{escape(r.get('by') or 'not the guide')}</td></tr>"
        for r in data["trials"]
    )
    cells = ("trial", "guide (raw)", "guide corrected", "measured", "GPU-h", "chosen by")
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in cells) + "</tr>"
    return "".join(parts) + f"<table>{head}{rows}</table>"


def note_lines(data: dict[str, Any] | None) -> list[str]:
    """The dashboard note's lines of a guided run (none without guide data): guide.json's trials, each
    with what chose it and the prediction guide.json and the report give it, and vLLM's defaults'
    prediction when they were not measured."""
    if data is None:
        return []
    budget = data.get("budget_gpu_hours")
    of = f" of {budget:g}" if budget else ""
    repeats = data.get("remeasure_gpu_hours") or 0.0
    within = f" ({repeats:.2f} of them re-measuring the top)" if repeats else ""
    lines = ["", "### Guided search", f"**GPU-hours:** {data.get('gpu_hours', 0.0):.2f}{of}{within}  "]
    lines += ["| trial | chosen by | predicted | measured |", "|---|---|---|---|"]
    for r in data["trials"]:
        by = r.get("by") or "not the guide"
        lines.append(f"| #{r['trial']} | {by} | {_num(r.get('predicted'))} | {measured_text(r)} |")
    if data.get("defaults"):
        lines += ["", defaults_text(data["defaults"])]
    return lines


def guide_figure(data: dict[str, Any] | None, metric: str) -> dict[str, Any] | None:
    """The dashboard's plotly figure of a guided run: guide.png's points (`compared`), the guide's
    corrected prediction when each trial was chosen (its own for vLLM's defaults) and its raw one against
    what it measured, with the 3 % resolution about the diagonal (None: no trial met the SLOs yet)."""
    rows = compared(data) if data is not None else []
    if not rows:
        return None
    values = [v for r in rows for v in (r.get("raw"), r["predicted"], r["measured"]) if v]
    lo, hi = min(values) * 0.95, max(values) * 1.05
    line = {"type": "scatter", "mode": "lines", "x": [lo, hi], "hoverinfo": "skip"}
    dotted = {"color": "#999", "dash": "dot"}
    raw = [r for r in rows if r.get("raw")]  # 0: the raw guide predicted it would miss the SLOs
    return {
        "data": [
            {**line, "name": "predicted = measured", "y": [lo, hi], "line": {"color": "#444", "width": 1}},
            *(
                {**line, "name": f"{f - 1:+.0%}", "y": [lo * f, hi * f], "line": dotted}
                for f in (1 + RESOLUTION, 1 - RESOLUTION)
            ),
            {
                "type": "scatter",
                "mode": "markers",
                "name": "guide (raw)",
                "x": [r["raw"] for r in raw],
                "y": [r["measured"] for r in raw],
                "text": [f"#{r['trial']}" for r in raw],
                "marker": {"color": "#999", "symbol": "x", "size": 8},
            },
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": "guide corrected",
                "x": [r["predicted"] for r in rows],
                "y": [r["measured"] for r in rows],
                "text": [f"#{r['trial']}" for r in rows],
                "textposition": "top right",
                "marker": {"color": "#1f77b4", "size": 9},
            },
        ],
        "layout": {
            "title": {"text": "Guide: predicted vs measured per real trial"},
            "xaxis": {"title": {"text": f"predicted {metric}"}, "range": [lo, hi]},
            "yaxis": {"title": {"text": f"measured {metric}"}, "range": [lo, hi]},
        },
    }


def measured_text(row: dict[str, Any]) -> str:
    """What a guide.json trial measured, as the summary and the dashboard's note say it: its value,
    "infeasible" (missed the SLOs or failed), or nothing when it was cut short."""
    if row.get("interrupted"):
        cut = (
            "cut short at its share of --gpu-hours" if row["interrupted"] == "budget_spent" else "interrupted"
        )
        return f"nothing ({cut})"
    return _num(row.get("measured"), "infeasible")


def _num(value: Any, missing: str = "-") -> str:
    return f"{value:,.1f}" if isinstance(value, (int, float)) else missing
