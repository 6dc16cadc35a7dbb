"""The results of a run: trials.csv, pareto.csv, best.json, best.sh, pareto.png (every pair of
objectives), probes.png (capacity probes of the top configs), report.html (report_html.py), and the
terminal summary (the feasible Pareto front and the recommended flags).

How the recommendation is picked: autotune.tune.recommendation.decide (the best config on the Pareto front,
unless its gain over vLLM's defaults, the baseline trial, is within the measurement's resolution or noise).
"""

from __future__ import annotations

import dataclasses
import errno
import shlex
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from autotune.core.atomic import atomic_write_text
from autotune.core.config import gpus_per_replica
from autotune.core.json_out import json_text
from autotune.core.values import counted, fmt_number
from autotune.outputs.capacity_words import capacity_text, limited_by
from autotune.outputs.export import render, serve_flags
from autotune.outputs.guide_view import read_guide
from autotune.outputs.outcome import SIMULATED_NOTE, Outcome
from autotune.outputs.plots import plot_pairs, plot_probes
from autotune.outputs.report_html import off_front, off_front_note, write_html
from autotune.tune.front import defaults_label
from autotune.tune.progress import short_params
from autotune.tune.recommendation import latencies_break_ties, runs_of, tie_breakers
from autotune.tune.study import TrialRecord

SUMMARY_METRICS = ("request_throughput", "p99_tpot_ms", "p99_e2el_ms", "num_preemptions", "capacity_rate")
RESULT_FILES = ("trials.csv", "pareto.csv", "best.json", "best.sh", "pareto.png", "probes.png", "report.html")


def front_table(out: Outcome, limit: int = 15) -> str:
    """The feasible Pareto front as a text table, the recommendation marked with * (listed after the
    front when it is not on it: kept defaults); GPUs per replica when a config takes more than one, what
    limits capacity when trials searched it."""
    if not out.front:
        return "Pareto front: empty (no feasible trial)."
    extra = _extra_columns(out)
    headers = ["", "trial", *out.objective_names, "vs baseline", *extra, "config"]

    def row(r: TrialRecord, mark: str, gain: str, shown: bool = True) -> list[str]:
        values = [_fmt(v) if shown else "-" for v in r.values or []]
        return [mark, f"#{r.number}", *values, gain, *[f(r) for f in extra.values()], _params_text(r)]

    best = out.best.number if out.best else None
    rows = [row(r, "*" if r.number == best else "", _gain_text(out.change(r))) for r in out.front[:limit]]
    pick = off_front(out, out.front[:limit])
    if pick is not None:  # listed after the front, marked: the row the verdict names is never missing
        rows.append(row(pick, "*", "baseline (kept)" if pick.baseline else _gain_text(out.change(pick))))
    base = out.baseline
    listed = [*out.front[:limit], *([pick] if pick is not None else [])]
    if base and base.values and all(r.number != base.number for r in listed):
        rows.append(row(base, "", f"baseline ({base.status})", shown=base.measured))
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]
    if base and not base.feasible and len(rows) > len(listed):
        # the infeasible baseline is a reference, not part of a table titled "feasible"
        lines.insert(-1, "Not feasible, for reference:")
    if pick is not None:  # its own heading, after the header line and the front's rows
        note = off_front_note(out, pick)
        lines.insert(1 + len(out.front[:limit]), f"{note[0].upper()}{note[1:]}:")
    shown = f", top {limit} by {out.objective_names[0]} shown" if len(out.front) > limit else ""
    # feasible() leaves duplicates out (each repeats an earlier trial's result): so does the count of all
    dups = sum(r.duplicate_of is not None for r in out.records)
    left_out = f" ({counted(dups, 'duplicate')} left out)" if dups else ""
    feasible = f"{len(out.feasible())} of {len(out.records) - dups} trials feasible"
    counts = f"{counted(len(out.front), 'point')}; {feasible}"
    counts += left_out + shown
    title = f"Feasible Pareto front ({counts}):"
    return "\n".join([title, *lines])


def summary_text(out: Outcome) -> str:
    """What `autotune run` prints at the end: the front, the verdict and the recommended flags."""
    parts = [front_table(out), "", out.verdict()]
    if out.progress_note():
        parts.append(f"  {out.progress_note()}")
    gain = out.decision.gain
    if gain is not None and gain.percent() not in out.verdict():
        parts.append(f"  gain: {out.gain_text()}")
    if out.best is not None:
        parts.append("  " + shlex.join(["vllm", "serve", *out.best.engine_config().to_args()]))
        capacity = capacity_text(out.best, out.slos)
        if capacity:
            parts.append(f"  {capacity[0].upper()}{capacity[1:]}.")
    if out.sizing is not None:
        parts.append(f"  for {out.sizing.text()}")
    parts += [f"  {note}" for note in out.measurement_notes()]
    if out.simulated:
        parts.append(f"  {SIMULATED_NOTE[0].upper()}{SIMULATED_NOTE[1:]}.")
    return "\n".join(parts)


def write_all(run_dir: Path, out: Outcome) -> list[Path]:
    """Write every result file into the run folder; returns their paths.

    One run's set, never two runs' mixed: an earlier write's files go first, so a write cut short (a
    full disk, a kill) leaves files missing, never stale ones beside new ones (a resume's trials.csv had
    8 trials beside the best.sh of 6). Each file is written whole (atomic_write_text)."""
    import pandas as pd

    run_dir.mkdir(parents=True, exist_ok=True)
    _clear_previous(run_dir)
    rows = [_row(r, out) for r in out.records]
    frame = pd.DataFrame(rows)
    for name in _integer_columns(rows):
        # pandas turns a whole-number column with a gap into floats (duplicate_of 1.0): keep it whole
        frame[name] = pd.array([row.get(name) for row in rows], dtype="Int64")
    paths = [run_dir / "trials.csv", run_dir / "pareto.csv"]
    atomic_write_text(paths[0], frame.to_csv(index=False))
    front_numbers = {r.number for r in out.front}
    front = frame[frame["trial"].isin(front_numbers)] if len(frame) else frame
    atomic_write_text(paths[1], front.to_csv(index=False))
    paths.append(_write_best(run_dir, out))
    if out.best is not None:
        paths.append(_write_best_sh(run_dir, out.best, out.simulated))
    paths.append(plot_pairs(run_dir / "pareto.png", out))
    probes = plot_probes(run_dir / "probes.png", out)
    if probes is not None:
        paths.append(probes)
    paths.append(write_html(run_dir / "report.html", out))
    return paths


def _clear_previous(run_dir: Path) -> None:
    """Remove the result files an earlier write left (none when one of their names is not a file: the
    write then fails before it changes anything)."""
    paths = [run_dir / name for name in RESULT_FILES]
    blocked = next((p for p in paths if p.exists() and not p.is_file()), None)
    if blocked is not None:
        raise IsADirectoryError(errno.EISDIR, "a result file's name is taken by a folder", str(blocked))
    for path in paths:
        path.unlink(missing_ok=True)


def _row(r: TrialRecord, out: Outcome) -> dict[str, Any]:
    row: dict[str, Any] = {
        "trial": r.number,
        "state": r.state,
        "baseline": r.baseline,
        "feasible": r.feasible,
        "pareto": any(f.number == r.number for f in out.front),
        "duplicate_of": r.duplicate_of,
        "reason": "" if r.feasible else r.status,
        "message": r.message,
    }
    row.update(r.params)
    # A failure before any measurement was told placeholder values (a throughput of 0, margins of 100 for
    # the sampler's constraints, 0 ms for latencies of no request): an empty cell says nothing was measured.
    measured = r.measured
    for name, value in zip(out.objective_names, r.values or [None] * len(out.objective_names), strict=False):
        row[name] = value if measured else None
    if out.repeats.values.get(str(r.number)) and r.values:  # the mean the pick rests on, beside run 1's
        runs = runs_of(r, out.repeats.values)
        row |= {"remeasured_runs": len(runs), "remeasured_mean": statistics.fmean(runs)}
    row.update({f"margin_{k}": v if measured else None for k, v in r.margins.items()})
    fallback = _summary_fallbacks(r)
    for key in SUMMARY_METRICS:
        value = r.metrics[key] if key in r.metrics and measured else fallback.get(key)
        if value is not None:
            row[key] = value
    row["gpus_per_replica"] = gpus_per_replica(r.config) if r.config else None
    row["gpu_seconds"] = r.gpu_seconds
    row["gpu_seconds_saved"] = r.gpu_seconds_saved
    # where it ran (Ray's placement): the node and the devices it was pinned to, as CUDA_VISIBLE_DEVICES
    where = r.placement
    row["node_ip"] = where.node_ip if where is not None else None
    row["node_id"] = where.node_id if where is not None else None
    gpu_ids = where.gpu_ids if where is not None else None
    row["gpu_ids"] = ",".join(map(str, gpu_ids)) if gpu_ids else None
    return row


def _integer_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The columns whose values are all whole numbers where given (trial numbers, counts, int flags)."""
    names = dict.fromkeys(name for row in rows for name in row)  # in column order
    return [name for name in names if _whole_numbers([row.get(name) for row in rows])]


def _whole_numbers(values: list[Any]) -> bool:
    """True when the values are ints or missing, at least one given (bools are not numbers here)."""
    given = [v for v in values if v is not None]
    return bool(given) and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in given)


def _extra_columns(out: Outcome) -> dict[str, Any]:
    """The front table's optional columns, by header: GPUs per replica (when a config takes more than
    one), what limits capacity (when trials searched it)."""
    columns: dict[str, Any] = {}
    if out.multi_gpu():
        columns["GPUs"] = lambda r: str(gpus_per_replica(r.config))
        if out.per_replica():
            columns["per GPU vs baseline"] = lambda r: _gain_text(out.gain_per_gpu(r))
    if out.searched():
        columns["limited by"] = lambda r: limited_by(r) or "-"
    return columns


def _summary_fallbacks(r: TrialRecord) -> dict[str, Any]:
    """The summary columns a trial's metrics may lack: its engine's preemptions, its capacity."""
    engine = r.server.engine if r.server is not None else None
    return {
        "num_preemptions": engine.num_preemptions if engine is not None else None,
        "capacity_rate": r.capacity.rate if r.capacity is not None else None,
    }


def _ties_go(objective_names: list[str]) -> str:
    """best.json's "how" on ties: to the objectives after the first, named unless they are latencies."""
    if latencies_break_ties(objective_names):
        return " (ties within the capacity resolution go to the lowest latencies together)"
    by = tie_breakers(objective_names)
    return f" (ties within the capacity resolution go to {by})" if by else ""


def _write_best(run_dir: Path, out: Outcome) -> Path:
    path = run_dir / "best.json"
    data: dict[str, Any] = {"verdict": out.verdict(), "slos": out.slos, "objectives": out.objective_names}
    data["simulated"] = out.simulated
    if out.simulated:
        data["simulated_note"] = SIMULATED_NOTE
    data["how"] = (
        f"{'highest' if out.maximize[0] else 'lowest'} feasible {out.objective_names[0]} on the Pareto front"
        f"{_ties_go(out.objective_names)}; vLLM's defaults are kept unless the gain clears the "
        "measurement's resolution or noise"
    )
    gain = out.decision.gain
    data["keeps_defaults"] = out.decision.keeps_defaults
    guide = read_guide(run_dir)
    if guide is not None:  # a guided run: predicted vs measured per trial, spend, why it stopped
        data["guide"] = {
            k: guide.get(k)
            for k in ("gpu_hours", "remeasure_gpu_hours", "budget_gpu_hours", "stop_reason", "trials")
        }
        if guide.get("defaults"):  # vLLM's defaults, not measured: the guide's prediction of them
            data["guide"]["defaults"] = guide["defaults"]
    if out.progress_note():
        data["progress_note"] = out.progress_note()
    if out.remeasured():  # each re-measured config's runs and the mean that ranked it
        data["remeasured"] = {
            "metric": out.objective_names[0],
            "trials": {
                str(r.number): {"runs": runs, "mean": statistics.fmean(runs)} for r, runs in out.remeasured()
            },
        }
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
        if not gain.maximize:  # ratio is baseline / value; the reduction is gain_vs_baseline's figure
            data["gain"]["reduction"] = round(gain.reduction(gain.ratio), 4)
            data["gain"]["reduction_interval"] = [round(gain.reduction(x), 4) for x in (gain.low, gain.high)]
    if out.best is not None:
        config = out.best.engine_config()
        data |= {
            "trial": out.best.number,
            "config": out.best.config,
            "flags": serve_flags(config),
            "command": render(config, "cmd").strip(),
            "values": dict(zip(out.objective_names, out.best.values or [], strict=False)),
            "gpus_per_replica": gpus_per_replica(out.best.config),
            "gain_vs_baseline": out.gain(out.best),
            "flags_to_know": out.flags(),
            "metrics": out.best.metrics,
            "info": out.best.info,
        }
        if out.best.capacity is not None:
            c = out.best.capacity
            data["capacity"] = {
                "rate": c.rate,
                "bracket": c.bracket,
                "saturation_throughput": c.saturation_throughput,
                "limited_by": list(c.limited_by) if c.limited_by is not None else None,
                "text": capacity_text(out.best, out.slos),
            }
    if out.baseline is not None:
        data["baseline"] = {
            "trial": out.baseline.number,
            "feasible": out.baseline.feasible,
            "failure": out.baseline.failure,
            "config": out.baseline.config,
            "values": dict(zip(out.objective_names, out.baseline.values or [], strict=False)),
            "gpus_per_replica": gpus_per_replica(out.baseline.config),
            "label": defaults_label(out.baseline),
        }
    if out.sizing is not None:
        data["sizing"] = dataclasses.asdict(out.sizing)
    if out.cost is not None:
        data["cost"] = dataclasses.asdict(out.cost)
    atomic_write_text(path, json_text(data, indent=2, default=str) + "\n")
    return path


def _write_best_sh(run_dir: Path, best: TrialRecord, simulated: bool) -> Path:
    path = run_dir / "best.sh"
    command = render(best.engine_config(), "cmd").strip()
    note = f"# {SIMULATED_NOTE}\n" if simulated else ""
    atomic_write_text(
        path,
        "#!/bin/sh\n"
        f"# autotune recommendation: trial #{best.number} of {run_dir.name}. Extra args are appended.\n"
        f"{note}"
        f'exec {command} "$@"\n',
        mode=0o755,
    )
    return path


def _fmt(value: float) -> str:
    return fmt_number(value)


def _gain_text(gain: float | None) -> str:
    return f"{gain * 100:+.1f}%" if gain is not None else "-"


def _params_text(r: TrialRecord) -> str:
    return short_params(r.params)
