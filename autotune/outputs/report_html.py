"""report.html: one self-contained page a deployer acts on.

Top to bottom: the recommendation (verdict, gain with its interval, the command, the flags changed from
vLLM's defaults) and what to know before acting; cost and sizing; the feasible Pareto front sorted by
the first objective, with units, the recommended row marked (listed after the front when it is not on
it: defaults kept within the margin); failures grouped by class with vLLM's message; the plots (every
pair of objectives with the SLO limits, the capacity probes); all trials.
"""

from __future__ import annotations

import base64
import html
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.core.atomic import atomic_write_text
from autotune.core.config import gpus_per_replica
from autotune.core.values import counted, fmt_number
from autotune.outputs.capacity_words import capacity_text, limited_by
from autotune.outputs.export import render
from autotune.outputs.guide_view import guide_html
from autotune.outputs.outcome import Outcome
from autotune.tune.front import defaults_label, moved_defaults
from autotune.tune.objectives import metric_label
from autotune.tune.progress import short_params
from autotune.tune.study import TrialRecord

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0}
.box{background:#f3f8f3;border:1px solid #9c9;padding:.8em 1em;border-radius:6px}
.warn{background:#fff7e6;border:1px solid #e8b64c;padding:.5em 1em;border-radius:6px}
pre{background:#f4f4f4;padding:.6em;white-space:pre-wrap;word-break:break-all;font-size:12px}
.scroll{overflow-x:auto} table{border-collapse:collapse;font-size:12.5px}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}
td.l,th.l{text-align:left;white-space:normal} tr.rec{background:#fff1c9;font-weight:600}
img{max-width:100%} details{margin-top:.6em}
"""


def write_html(path: Path, out: Outcome) -> Path:
    """Write report.html next to pareto.png (and probes.png when there are probes)."""
    sections = [
        _header(path.parent.name, out),
        _recommendation(out),
        _cost(out),
        _front(out),
        _remeasured(out),
        _failures(out),
        _plots(path.parent),
        guide_html(path.parent, _e, out.objective_names[0]),
        _all_trials(out),
    ]
    page = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>autotune: {_e(path.parent.name)}</title><style>{STYLE}</style></head><body>",
        *sections,
        "</body></html>",
    ]
    atomic_write_text(path, "\n".join(s for s in page if s))
    return path


def _e(value: Any) -> str:
    return html.escape(str(value))


def _header(name: str, out: Outcome) -> str:
    ctx = out.context
    labels = (("model", "model"), ("gpu", "GPU"), ("workload", "workload"))
    what = ", ".join(f"{label} {_e(ctx[key])}" for key, label in labels if ctx.get(key))
    load = f" at {_e(ctx['load'])} load" if ctx.get("load") else ""
    if ctx.get("load") == "capacity" and not out.slos:
        load += " (no SLO: each config's highest rate it keeps up with, served >= 98 % of offered)"
    backend = f"; backend {_e(ctx['backend'])}" if ctx.get("backend") else ""
    slos = _e(", ".join(out.slos) or "none")
    calibration = _calibration_note(ctx.get("sim_calibration"))
    return f"<h1>autotune: {_e(name)}</h1><p class='sub'>{what}{load}; SLO {slos}{backend}{calibration}</p>"


def _calibration_note(values: dict[str, float] | None) -> str:
    """Which simulator constants the run used, when they are not the built-in ones (run.json has all)."""
    from autotune.sim.calibration import DEFAULT_CALIBRATION

    if not values:
        return ""
    built_in = DEFAULT_CALIBRATION.to_dict()
    changed = {k: v for k, v in values.items() if built_in.get(k) != v}
    if not changed:
        return ""
    shown = ", ".join(f"{k} {v:g}" for k, v in list(changed.items())[:4])
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    return f"; simulator calibration: {_e(shown)}{more} (--sim-calibration)"


def _recommendation(out: Outcome) -> str:
    parts = ["<h2>Recommendation</h2><div class='box'>", f"<p><b>{_e(out.verdict())}</b></p>"]
    if out.progress_note():
        parts.append(f"<p>{_e(out.progress_note())}</p>")
    gain = out.decision.gain
    if gain is not None and gain.percent() not in out.verdict():
        parts.append(f"<p>Gain: {_e(out.gain_text())}</p>")
    if out.best is not None:
        parts.append(f"<pre>{_e(render(out.best.engine_config(), 'cmd').strip())}</pre>")
        capacity = capacity_text(out.best, out.slos)
        if capacity:
            parts.append(f"<p>{_e(capacity[0].upper() + capacity[1:])}.</p>")
        parts.append(_changed_flags(out))
        parts.append("<p>Other forms: <code>autotune export RUN --format docker|k8s|helm|yaml</code></p>")
    parts.append("</div>")
    flags = out.flags()
    if flags:
        items = "".join(f"<li>{_e(f)}</li>" for f in flags)
        parts.append(f"<div class='warn'><b>Before you deploy</b><ul>{items}</ul></div>")
    return "".join(parts)


def _changed_flags(out: Outcome) -> str:
    best, base = out.best, out.baseline
    if best is None:
        return ""
    defaults = base.config if base is not None else {}
    moved = moved_defaults(base)  # flags the space moved off vLLM's defaults: their own value beside
    rows = []
    for name, value in best.config.items():
        if name == "model":
            continue
        default = defaults.get(name, "")
        mark = " class='rec'" if default != "" and default != value else ""
        own = f" (vLLM's: {moved[name]})" if name in moved else ""
        rows.append(
            f"<tr{mark}><td class='l'>--{_e(name.replace('_', '-'))}</td><td>{_e(value)}</td>"
            f"<td>{_e(default)}{_e(own)}</td></tr>"
        )
    label = "vLLM default" if not moved else defaults_label(base)
    head = f"<tr><th class='l'>flag</th><th>recommended</th><th>{_e(label)} (baseline)</th></tr>"
    summary = "<summary>Flags (changed ones highlighted)</summary>"
    return f"<details open>{summary}<table>{head}{''.join(rows)}</table></details>"


def _cost(out: Outcome) -> str:
    parts = []
    if out.cost is not None:
        parts.append(f"<p>{_e(out.cost.text()[0].upper() + out.cost.text()[1:])}</p>")
    if out.sizing is not None:
        parts.append(f"<p>For {_e(out.sizing.text())}</p>")
    return "<h2>Cost</h2>" + "".join(parts) if parts else ""


def _front(out: Outcome) -> str:
    if not out.front:
        return "<h2>Feasible Pareto front</h2><p>Empty: no trial met the SLOs.</p>"
    sign = -1.0 if out.maximize[0] else 1.0
    rows = sorted(out.front, key=lambda r: sign * (r.values or [0.0])[0])
    head = ["", "trial", "GPUs", *(metric_label(n) for n in out.objective_names), "vs baseline"]
    head += ["per GPU vs baseline"] if _per_gpu_column(out) else []
    head += ["capacity (req/s)", "limited by"] if out.searched() else []
    head += ["config"]
    body = [_front_row(out, r) for r in rows]
    pick = off_front(out, rows)
    apart = ""
    if pick is not None:  # listed after the front, marked: the row the verdict names is never missing
        body.append(_front_row(out, pick))
        apart = f" The last row: {_e(off_front_note(out, pick))}."
    order = "highest" if out.maximize[0] else "lowest"
    title = (
        f"<h2>Feasible Pareto front</h2><p class='sub'>{len(rows)} configs, {order} "
        f"{_e(out.objective_names[0])} first; the recommended one is marked ★.{apart} GPUs: per replica "
        f"(tensor x pipeline parallel size).</p>"
    )
    return title + _table(head, body, left={len(head) - 1})


def off_front(out: Outcome, shown: Sequence[TrialRecord]) -> TrialRecord | None:
    """The recommendation when a listing of the front leaves it out (None when it is among `shown`):
    vLLM's defaults kept because the best config found beats them by less than the measurement's margin
    (a higher config then dominates them), or a pick by the mean of re-measured runs. Each listing of
    the front (report.html's, the summary's) adds it after the front, marked, with `off_front_note`."""
    best = out.best
    if best is None or any(r.number == best.number for r in shown):
        return None
    return best


def off_front_note(out: Outcome, pick: TrialRecord) -> str:
    """Why the recommendation is listed apart from the front: kept or picked, and not on it."""
    where = (
        "further down the front" if any(r.number == pick.number for r in out.front) else "not on the front"
    )
    who = f"trial #{pick.number}" + (f" ({defaults_label(pick)})" if pick.baseline else "")
    if pick.baseline and out.decision.keeps_defaults:
        why = "kept because no config found beats it by more than the measurement's margin"
    elif out.remeasured():
        why = "picked by the mean of its runs"
    else:
        why = "picked by the tie rule"
    return f"recommended, {where}: {who}, {why}"


def _remeasured(out: Outcome) -> str:
    """The re-measured configs' runs and means, best mean first: what the pick among them rests on."""
    runs = out.remeasured()
    if not runs:
        return ""
    name = out.objective_names[0]
    rows = []
    for r, values in runs:
        recommended = out.best is not None and r.number == out.best.number
        label = f"#{r.number}" + (f" ({defaults_label(r)})" if r.baseline else "")
        cells = ["★" if recommended else "", label, ", ".join(fmt_number(v) for v in values)]
        rows.append(("rec" if recommended else "", [*cells, fmt_number(statistics.fmean(values))]))
    head = ["", "trial", f"{metric_label(name)}: each run (the first, then the repeats)", "mean"]
    title = (
        "<h2>Re-measured</h2><p class='sub'>The top configs and the baseline measured again with other "
        "seeds; the pick among them is by the mean of their runs, not the first run.</p>"
    )
    return title + _table(head, rows)


def _front_row(out: Outcome, r: TrialRecord) -> tuple[str, list[str]]:
    recommended = out.best is not None and r.number == out.best.number
    capacity = r.capacity.rate if r.capacity is not None else None
    cells = [
        "★" if recommended else "",
        f"#{r.number}" + (f" ({defaults_label(r)})" if r.baseline else ""),
        str(gpus_per_replica(r.config)),
        *(fmt_number(v) for v in r.values or []),
        _pct(out.change(r)),
        *([_pct(out.gain_per_gpu(r))] if _per_gpu_column(out) else []),
        *([fmt_number(capacity), limited_by(r)] if out.searched() else []),
        short_params(r.params),
    ]
    return ("rec" if recommended else "", cells)


def _per_gpu_column(out: Outcome) -> bool:
    """Per-GPU gains are shown beside per-replica ones when configs take more than one GPU."""
    return out.multi_gpu() and out.per_replica()


def _pct(change: float | None) -> str:
    return f"{change * 100:+.1f}%" if change is not None else ""


def _table(head: list[str], rows: list[tuple[str, list[str]]], left: set[int] | None = None) -> str:
    left = left or set()
    th = "".join(f"<th{' class=l' if i in left else ''}>{_e(h)}</th>" for i, h in enumerate(head))
    trs = []
    for css, cells in rows:
        tds = "".join(f"<td{' class=l' if i in left else ''}>{_e(c)}</td>" for i, c in enumerate(cells))
        trs.append(f"<tr class='{css}'>{tds}</tr>")
    return f"<div class='scroll'><table><tr>{th}</tr>{''.join(trs)}</table></div>"


def _failures(out: Outcome) -> str:
    groups: dict[str, list[TrialRecord]] = defaultdict(list)
    for r in out.records:
        if r.failure and r.duplicate_of is None:
            groups[r.failure].append(r)
    if not groups:
        return f"<h2>Failures</h2><p>None: {_e(_all_started(out))}</p>"
    rows = []
    for kind, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        screened = sum(1 for r in rs if r.screened)
        rejected = sum(1 for r in rs if not r.launched) - screened
        trials = ", ".join(f"#{r.number}" for r in rs[:12]) + (" ..." if len(rs) > 12 else "")
        notes = [f"{screened} predicted, not launched"] if screened else []
        notes += [f"{rejected} rejected before launch"] if rejected else []
        note = f" ({'; '.join(notes)})" if notes else ""
        counts = [r.message for r in rs if r.message]
        # dict keeps first-seen order, so a tie goes to the earliest trial's message whatever the hash seed
        messages = sorted(dict.fromkeys(counts), key=lambda m: -counts.count(m))
        rows.append(("", [kind, f"{len(rs)}{note}", trials, messages[0][:400] if messages else ""]))
    head = ["class", "trials", "which", "vLLM's message (most frequent)"]
    return "<h2>Failures by class</h2>" + _table(head, rows, left={0, 2, 3})


def _all_started(out: Outcome) -> str:
    """What the Failures section says when no config failed: every config started, and those early abort
    stopped once their verdict was certain are counted as the summary counts them (CostView.aborted):
    "finished its benchmark" alone contradicts the summary's "saved ... by early abort (4 trials)"."""
    stopped = out.cost.aborted
    if not stopped:
        return "every config started and finished its benchmark."
    if any(r.capacity is not None for r in out.records):
        return (
            "every config started and finished its capacity search; early abort stopped a probe in "
            f"{counted(stopped, 'trial')} once the verdict on it was certain."
        )
    return (
        f"every config started; early abort stopped {counted(stopped, 'benchmark')} once the verdict on "
        "them was certain, and the others finished."
    )


def _plots(run_dir: Path) -> str:
    parts = []
    for name, alt in (("pareto.png", "objectives pairwise"), ("probes.png", "capacity probes")):
        png = run_dir / name
        if png.exists():
            data = base64.b64encode(png.read_bytes()).decode()
            parts.append(f"<p><img alt='{alt}' src='data:image/png;base64,{data}'></p>")
    return "<h2>Plots</h2>" + "".join(parts) if parts else ""


def _all_trials(out: Outcome) -> str:
    head = ["trial", "state", *(metric_label(n) for n in out.objective_names), "result", "config"]
    rows = []
    for r in out.records:
        status = r.status
        if r.duplicate_of is not None:
            status += f" (same config as #{r.duplicate_of})"
        values = [fmt_number(v) if r.measured else "" for v in r.values or [None] * len(out.objective_names)]
        css = "rec" if out.best is not None and r.number == out.best.number else ""
        rows.append((css, [f"#{r.number}", r.state.lower(), *values, status, short_params(r.params)]))
    n = len(head)
    return (
        f"<details><summary>All {len(rows)} trials</summary>"
        + _table(head, rows, left={n - 2, n - 1})
        + "<p>Every trial with its metrics and SLO margins: trials.csv.</p></details>"
    )
