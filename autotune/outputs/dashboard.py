"""optuna-dashboard on a study's storage, served from a thread on 127.0.0.1 (a free port by default),
and what the run writes for it to show: the study's note (markdown: SLOs, progress, best feasible vs the
baseline, the current recommendation and its flags, failures by class), a Pareto figure with
feasibility (optuna-dashboard 0.21 does not read Optuna 5 constraints, so its own plots cannot tell a
feasible trial from one that broke an SLO or failed to start) and, in a guided run, the guide's
predicted vs measured per trial: guide.json's data (outputs/guide_view.py), live from the search while
the run goes, so the note and figure give each trial the prediction the summary and report.html give.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from autotune.core.values import brief, fmt_number

HOST = "127.0.0.1"
NOTE_EVERY_S = 5.0  # the note and figure are rewritten at most this often during a run (~0.1 s each)
FIGURE_ID = "pareto-feasibility"
GUIDE_FIGURE_ID = "guide-predicted-vs-measured"  # a guided run's


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """The dashboard's page loads several API calls at once; one thread each keeps it responsive."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr: it would break the run's progress line."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
        return


@dataclass
class DashboardServer:
    """A running dashboard; `stop()` shuts it down."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        """Where to point a browser."""
        return f"http://{HOST}:{self.server.server_port}/dashboard/"

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self.server.server_port

    def stop(self) -> None:
        """Stop serving and free the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_dashboard(storage: str, port: int = 0) -> DashboardServer:
    """Serve optuna-dashboard for `storage` (an SQLAlchemy URL) in a daemon thread; port 0 = a free one."""
    import optuna_dashboard

    app = optuna_dashboard.wsgi(storage)
    server = make_server(HOST, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="optuna-dashboard", daemon=True)
    thread.start()
    return DashboardServer(server=server, thread=thread)


class StudyNote:
    """Keeps the study's dashboard note and feasibility figure up to date during a run."""

    def __init__(
        self, study: Any, context: dict[str, Any], search: Any = None, run_dir: Path | None = None
    ) -> None:
        """A guided run's section comes from `search` (its GuidedSearch, while it runs), else from
        `run_dir`'s guide.json (a finished run's): none without either."""
        import optuna

        self.study = study
        self.names = list(study.metric_names or [f"objective {i}" for i in range(len(study.directions))])
        self.maximize = [d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions]
        self.context = context
        self.search, self.run_dir = search, run_dir
        self._last = 0.0

    def guide(self) -> dict[str, Any] | None:
        """guide.json's data: as the run will write it (no stop reason yet), or as a finished run did."""
        from autotune.outputs.guide_view import guide_data, read_guide

        if self.search is not None:
            return guide_data(self.search, self.study, None)
        return read_guide(self.run_dir) if self.run_dir is not None else None

    def update(self, force: bool = False) -> None:
        """Rewrite the note and figure (throttled to NOTE_EVERY_S unless forced)."""
        now = time.monotonic()
        if not force and now - self._last < NOTE_EVERY_S:
            return
        self._last = now
        from optuna_dashboard import save_note
        from optuna_dashboard._custom_plot_data import SYSTEM_ATTR_PLOT_DATA, save_graph_object_json

        from autotune.outputs.guide_view import guide_figure
        from autotune.outputs.outcome import outcome
        from autotune.tune.remeasure import StoredRepeats
        from autotune.tune.study import records

        slos = self.context.get("slos", [])
        repeats = StoredRepeats.of(self.study)
        out = outcome(records(self.study), self.names, self.maximize, slos, self.context, repeats=repeats)
        guide = self.guide()
        save_note(self.study, note_markdown(self.study.study_name, out, guide, _pending_baseline(self.study)))
        figures = {FIGURE_ID: pareto_figure(out), GUIDE_FIGURE_ID: guide_figure(guide, self.names[0])}
        for name, figure in figures.items():
            if figure is not None:
                key = f"{SYSTEM_ATTR_PLOT_DATA}{name}:"
                save_graph_object_json(self.study._storage, self.study._study_id, key, json.dumps(figure))


def _pending_baseline(study: Any) -> int | None:
    """The number of vLLM's defaults' trial while it waits or runs (a guided run measures them second)."""
    from optuna.trial import TrialState

    pending = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
    return next((t.number for t in pending if t.user_attrs.get("baseline")), None)


def note_markdown(
    name: str, out: Any, guide: dict[str, Any] | None = None, pending_baseline: int | None = None
) -> str:
    """The study's note: what is tuned, how far the run is, what it recommends so far, what failed; in
    a guided run (`guide`: guide.json's data) the guide's predicted vs measured per trial.
    `pending_baseline`: the defaults' trial while it is measured (before it, nothing compares)."""
    from autotune.outputs.outcome import SIMULATED_NOTE
    from autotune.tune.front import defaults_label

    ctx = out.context
    told = len(out.records)
    feasible = len(out.feasible())
    failed = Counter(r.failure for r in out.records if r.failure)
    lines = [
        f"## autotune: {name}",
        f"{ctx.get('model', '')} on {ctx.get('gpu', '')}, workload {ctx.get('workload', '')} at "
        f"{ctx.get('load', '?')} load, backend {ctx.get('backend', '?')}.",
        "",
        *([f"> **{SIMULATED_NOTE[0].upper()}{SIMULATED_NOTE[1:]}.**", ""] if out.simulated else []),
        f"**SLOs:** {', '.join(out.slos) or 'none'}  ",
        f"**Trials:** {told} told, {feasible} feasible, {sum(failed.values())} failed or rejected "
        f"(updated {time.strftime('%H:%M:%S')})",
        "",
    ]
    base, top = out.baseline, out.highest()
    if top is not None:  # the progress line's best: the recommendation below may be another (a tie)
        unit = out.objective_names[0]
        value = fmt_number((top.values or [0.0])[0])
        change = out.change(top)
        vs = f" ({change * 100:+.1f}% vs the baseline #{base.number})" if change is not None and base else ""
        lines += [f"**Best feasible so far:** trial #{top.number}, {unit} {value}{vs}", ""]
    if base is not None and base.values:
        status = base.status
        base_values = ", ".join(
            f"{n} {fmt_number(v) if base.measured else '-'}"
            for n, v in zip(out.objective_names, base.values, strict=False)
        )
        lines += [
            f"**Baseline ({defaults_label(base)}), trial #{base.number}:** {base_values} ({status})",
            "",
        ]
    verdict = out.verdict()
    if pending_baseline is not None and out.best is not None and (base is None or not base.values):
        verdict = (
            f"Recommended so far: trial #{out.best.number}; vLLM's defaults (trial #{pending_baseline}) are "
            "being measured, and the recommendation compares with them once they are."
        )
    lines += ["### Recommendation", verdict]
    lines += [out.progress_note()] if out.progress_note() else []
    if out.decision.gain is not None and out.decision.gain.percent() not in out.verdict():
        lines.append(f"Gain: {out.gain_text()}")
    lines += [f"**{note}**" for note in out.measurement_notes()]
    if out.best is not None:
        from autotune.outputs.export import command_lines

        # one flag a line: a code block does not wrap, and a one-line command widened the whole note
        # past the window (its text cut off at 1,400 px)
        lines += ["", "```", command_lines(out.best.engine_config()).strip(), "```"]
    if failed:
        lines += ["", "### Failures by class", "| class | trials | message |", "|---|---|---|"]
        for kind, count in failed.most_common():
            message = next((r.message for r in out.records if r.failure == kind and r.message), "")
            lines.append(f"| {kind} | {count} | {brief(message).replace('|', '/')} |")
    from autotune.outputs.guide_view import note_lines

    lines += note_lines(guide)
    lines += [
        "",
        "### Reading the plots",
        "Feasibility is the trial user attr `feasible` (and `failure`); the figure *Pareto front with "
        "feasibility* on the study's main page colours it. A config that failed or was rejected is told "
        f"{_failed_told(out.maximize)}, so it sits in the worst corner of Optuna's own plots instead of "
        "stretching their scales.",
        "",
        # 0.21 computes them with a copy of Optuna 3's Pareto front, which reads no constraints in any
        # storage format (optuna_dashboard/_app.py, _pareto_front.py): the note says so instead.
        "The dashboard's own *best trials* are the Pareto front of every trial, SLO-violating ones "
        "included: optuna-dashboard does not read the SLO constraints there. The feasible front is the "
        "figure above, the recommendation and report.html's.",
    ]
    return "\n".join(lines)


def _failed_told(maximize: list[bool]) -> str:
    """What a failed config is told (objectives.failed_values), by the objectives there are: a throughput
    0, a latency 10% past the worst."""
    told = ["throughput 0"] if any(maximize) else []
    told += ["latencies 10% past the worst measured (or its SLO limit)"] if not all(maximize) else []
    return " and ".join(told)


def pareto_figure(out: Any) -> dict[str, Any]:
    """A plotly figure (as JSON-able data) of the first two objectives, coloured by feasibility."""
    from autotune.outputs.plots import slo_limits
    from autotune.tune.objectives import metric_label

    names = out.objective_names
    x_i = 1 if len(names) > 1 else 0
    measured = [r for r in out.records if r.values and r.measured and r.duplicate_of is None]
    front = {r.number for r in out.front}
    groups = [
        ("violates SLO / aborted", "#c44e52", "x", [r for r in measured if not r.feasible]),
        ("feasible", "#4c72b0", "circle", [r for r in measured if r.feasible and r.number not in front]),
        ("Pareto front (feasible)", "#55a868", "diamond", [r for r in measured if r.number in front]),
        ("recommended", "#dd8452", "star", [out.best] if out.best is not None else []),
    ]
    traces = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": f"{label} ({len(rs)})",
            "x": [r.values[x_i] for r in rs],
            "y": [r.values[0] for r in rs],
            "text": [f"trial #{r.number}" for r in rs],
            "marker": {"color": color, "symbol": symbol, "size": 16 if symbol == "star" else 9},
        }
        for label, color, symbol, rs in groups
    ]
    shapes = []
    limit = slo_limits(out.slos).get(names[x_i])
    if limit is not None:
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": limit,
                "x1": limit,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#c44e52", "dash": "dash"},
            }
        )
    failed = len(out.records) - len(measured)
    title = f"Pareto front with feasibility ({failed} failed, rejected or duplicate trials not drawn)"
    return {
        "data": traces,
        "layout": {
            "title": {"text": title},
            "xaxis": {"title": {"text": metric_label(names[x_i])}},
            "yaxis": {"title": {"text": metric_label(names[0])}},
            "shapes": shapes,
        },
    }
