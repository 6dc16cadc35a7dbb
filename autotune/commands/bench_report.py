"""What `autotune bench` prints: vllm bench serve's metrics (a table, or JSON with its keys), the config
that was measured, a verdict per SLO and on keeping up with the load, and with `--capacity` the search's
outcome and every probe.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

from autotune.commands.client_cap import held_back_note
from autotune.core.json_out import json_text
from autotune.measure.capacity_report import CapacityReport
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.trial.capacity import SATURATION_MARGIN

THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")
SIMULATED_NOTE = "simulated: these figures come from autotune's simulated engine; confirm them on a GPU"
# Why a fixed-rate run has no verdict on keeping up (autotune/measure/steady_state.py `measure_window`).
TOO_SHORT = (
    "the run is too short to tell: too few requests in the window judged, which starts after the warm-up "
    "or else two request lifetimes in, or a backlog that grew within that window's noise but too far "
    "into it to call kept up"
)


def print_report(
    result: TrialResult,
    head: dict[str, Any],
    config: dict[str, Any],
    slos: Sequence[Slo],
    as_json: bool,
    offered: float | None = None,
) -> int:
    """Print the result; 0 when it ran and every verdict passed, else 1 (the reason on stderr).
    `offered`: the requests' arrival rate, for the note on a concurrency cap that held them back."""
    if result.failure is not None:
        # Why, always on stderr: what follows (if anything) is the partial metrics of a failed run.
        print(f"autotune bench: {result.failure}: {result.message}", file=sys.stderr)
        if result.server is not None and result.server.log_path:  # a launched server's, kept for this
            print(f"autotune bench: the server's log: {result.server.log_path}", file=sys.stderr)
    if result.benchmark is None:
        error = {**head, "config": config, "error": str(result.failure), "message": result.message}
        if result.capacity is not None:
            error["capacity"] = dataclasses.asdict(result.capacity)
        if as_json:
            print(json_text(error, indent=2, default=str))
        return 1
    report = {**head, "config": config, **result.benchmark.to_dict()}
    if result.failure is not None:
        report["failure"] = str(result.failure)
        report["failure_message"] = result.message
    if result.capacity is not None:
        report["capacity"] = dataclasses.asdict(result.capacity)
        window_keys(report, result.capacity)
    elif result.load is not None and result.load.steady is not None:
        steady = result.load.steady
        report["load_verdict"] = {
            "kept_up": steady.kept_up,
            "offered_rate": steady.offered_rate,
            "served_rate": steady.served_rate,
            "backlog_growth": steady.backlog_growth,
            "backlog_allowed": steady.backlog_allowed,
        }
    if slos:
        report["slo_verdicts"] = slo_verdicts(result, slos)
    note = held_back_note(report, offered)
    if note:  # stderr, as bench's JSON has no place for notes
        print(f"autotune bench: note: {note}", file=sys.stderr)
    if as_json:
        print(json_text(report, indent=2, default=str))
    else:
        print(format_table(report, slos))
    failed = result.failure is not None or not passed(report)
    if result.capacity is not None and result.capacity.rate <= 0:
        failed = True
    return 1 if failed else 0


def window_keys(report: dict[str, Any], capacity: CapacityReport) -> None:
    """Set vllm bench serve's load keys of `report` as vLLM defines them for the window a capacity
    search's metrics come from (`metrics_source`): the rate it was offered, its requests, and its
    throughputs as measured over it (completed / duration). The trial's throughputs, sustained at the
    capacity (what `run` reports), move to the capacity block's `sustained`."""
    probed = [p.rate for p in capacity.probes]
    report["request_rate"] = capacity.rate if capacity.rate > 0 else min(probed, default=math.inf)
    report["num_prompts"] = report["completed"] + report["failed"]
    if capacity.rate > 0 and report["duration"] > 0:
        # sustained: the window's figures per request x the capacity; its own: x its arrival rate
        sustained = {k: report[k] for k in THROUGHPUTS}
        scale = report["completed"] / report["duration"] / sustained["request_throughput"]
        report |= {k: None if v is None else v * scale for k, v in sustained.items()}
        report["capacity"]["sustained"] = sustained


def slo_verdicts(result: TrialResult, slos: Sequence[Slo]) -> list[dict[str, Any]]:
    """Each SLO against the run's value: [{"slo", "metric", "value_ms", "limit_ms", "met"}]."""
    bench = result.benchmark
    if bench is None:
        return []
    verdicts = []
    for slo in slos:
        value = float(bench.get(slo.key))
        verdicts.append(
            {"slo": str(slo), "metric": slo.key, "value_ms": value, "limit_ms": slo.limit_ms}
            | {"met": value <= slo.limit_ms}
        )
    return verdicts


def passed(report: dict[str, Any]) -> bool:
    """Every SLO met and the load kept up with (a run nothing judged passes)."""
    load = report.get("load_verdict")
    return all(v["met"] for v in report.get("slo_verdicts", [])) and (load is None or load["kept_up"])


def format_table(report: dict[str, Any], slos: Sequence[Slo] = ()) -> str:
    """A readable summary in the layout of `vllm bench serve`, then the verdicts."""
    rows: list[tuple[str, Any]] = [
        ("Backend / GPU", f"{report.get('server', report['backend'])} / {report['gpu']}"),
        ("Model", report["model_id"]),
        ("Workload", report["workload"]),
        ("Successful requests", report["completed"]),
        ("Failed requests", report["failed"]),
        ("Benchmark duration (s)", f"{report['duration']:.2f}"),
        ("Total input tokens", report["total_input_tokens"]),
        ("Total generated tokens", report["total_output_tokens"]),
        ("Request throughput (req/s)", f"{report['request_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{report['output_throughput']:.2f}"),
        ("Total token throughput (tok/s)", f"{report['total_token_throughput']:.2f}"),
    ]
    if report.get("request_goodput") is not None:
        rows.append(("Request goodput (req/s)", f"{report['request_goodput']:.2f}"))
    for metric, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
    ):
        rows.append((f"--- {title} ---", ""))
        for stat in ("mean", "median", "p99"):
            rows.append(
                (f"{stat.capitalize()} {metric.upper()} (ms)", f"{report[f'{stat}_{metric}_ms']:.2f}")
            )
    engine = ("num_preemptions", "num_gpu_blocks", "peak_kv_cache_usage", "peak_num_requests_running")
    extras = [k for k in engine if k in report]
    if extras:
        rows.append(("--- Engine ---", ""))
        rows += [(k, f"{report[k]:.4g}" if isinstance(report[k], float) else report[k]) for k in extras]
    verdicts = verdict_rows(report)
    if verdicts:
        rows.append(("--- Verdict ---", ""))
        rows += verdicts
    lines = ["=" * 18 + " Serving Benchmark Result " + "=" * 18, *config_lines(report)]
    if report.get("simulated"):
        lines.append(SIMULATED_NOTE)
    if "capacity" in report:
        lines += capacity_lines(report["capacity"], slos)
        lines.append(metrics_source(report["capacity"]))
    lines += [f"{name:<42}{value}" if value != "" else f"{name:-^62}" for name, value in rows]
    lines.append("=" * 62)
    return "\n".join(lines)


def config_lines(report: dict[str, Any]) -> list[str]:
    """The measured config: the server's as it reports it (--url), else the launched one's in full."""
    flags = " ".join(f"{k}={v}" for k, v in report["config"].items())
    if report.get("backend") != "url":
        return [f"config (defaults included): {flags}"]
    lines = [f"config (as the server reports it): {flags or 'nothing'}"]
    if report.get("config_unknown"):
        lines.append(f"not reported by the server: {', '.join(report['config_unknown'])}")
    return lines


def verdict_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The verdicts as table rows: keeping up with the load, then each SLO."""
    rows = []
    load = report.get("load_verdict")
    if load is not None:
        # the verdict is the backlog's: a short window's served rate lags its arrivals by the requests
        # still in the server, which a server keeping up also has
        word = "yes" if load["kept_up"] else "NO"
        growth = f"backlog {load['backlog_growth']:+.1%} of arrivals, {load['backlog_allowed']:.1%} allowed"
        served = f"{load['served_rate']:.2f} of {load['offered_rate']:.2f} req/s served"
        rows.append(("Kept up with the load", f"{word} ({growth}; {served})"))
    elif _open_loop(report):
        # said, not left out: a verdict-less fixed-rate run would read as one that passed unjudged
        rows.append(("Kept up with the load", f"not judged ({TOO_SHORT})"))
    for v in report.get("slo_verdicts", []):
        word, sign = ("PASS", "<=") if v["met"] else ("FAIL", ">")
        value = f"{v['metric']} {v['value_ms']:.2f} {sign} {v['limit_ms']:g}"
        rows.append((f"SLO {v['slo']}", f"{word} ({value})"))
    return rows


def _open_loop(report: dict[str, Any]) -> bool:
    """An open-loop run that completed (arrivals over time, no concurrency cap, no capacity search): one
    that a long enough window judges on keeping up. A trace replayed at its own times is one though its
    request_rate is inf."""
    fixed = "capacity" not in report and "failure" not in report
    return fixed and report.get("load_kind") == "open"


def _unmeasured_top(c: CapacityReport) -> str:
    """What a bracket's top is when no probe failed there: the saturation throughput's margin, or the
    queue ceiling that a TTFT or E2EL SLO imposes (trial/capacity.py `queue_ceiling`), the lower."""
    sat, high = c.saturation_throughput, c.bracket[1] if c.bracket else None
    # the search rounds the bracket to 4 decimals (and a stored saturation throughput may be too): equal
    # within that, at any rate, rather than within a relative share that low rates' rounding exceeds
    if sat and high and abs(high - SATURATION_MARGIN * sat) <= 2e-4:
        return f"its top is {SATURATION_MARGIN:g}x the saturation throughput, not a measured rate"
    return (
        "its top is the highest rate whose queue settles within a probe: a TTFT or E2EL SLO cannot be "
        "confirmed above it"
    )


def capacity_lines(capacity: dict[str, Any], slos: Sequence[Slo]) -> list[str]:
    """The search in words, then one line per probe (as stored: `CapacityReport` as a dict)."""
    c = CapacityReport(
        **{f.name: capacity[f.name] for f in dataclasses.fields(CapacityReport)} | {"probes": ()}
    )
    within = f" within {', '.join(str(s) for s in slos)}" if slos else " kept up with (no SLO)"
    if c.rate <= 0:
        lines = [f"Capacity: no rate passed{within}"]
    else:
        bracket = ""
        if c.bracket is not None and c.resolution is not None:
            top = "" if c.bound_measured else f"; {_unmeasured_top(c)}"
            bracket = f" (bracket {c.bracket[0]:.2f}-{c.bracket[1]:.2f} req/s, {c.resolution:.1%}{top})"
        lines = [f"Capacity: {c.rate:.2f} req/s{within}{bracket}"]
    if c.limited_by:
        lines.append(f"Limited by: {' and '.join(c.limited_by)}")
    if c.saturation_throughput:
        lines.append(f"Saturation throughput (every request at once): {c.saturation_throughput:.2f} req/s")
    if c.stopped_by:
        lines.append(f"The search stopped early: {c.stopped_by}")
    lines.append(f"{'rate':>8}  {'served':>8}  {'p99 TTFT ms':>11}  {'p99 ITL ms':>10}  windows  verdict")
    for p in sorted(capacity["probes"], key=lambda p: p["rate"]):
        failure = f" ({p['failure']})" if p.get("failure") else ""
        lines.append(
            f"{p['rate']:>8.2f}  {_num(p['served_rate']):>8}  {_num(p['p99_ttft_ms']):>11}  "
            f"{_num(p['p99_itl_ms']):>10}  {p['windows'] or 0:>7}  {(p['verdict'] or '').upper()}{failure}"
        )
    if any((p["windows"] or 0) > 1 for p in capacity["probes"]):
        lines.append(f"{'':>8}  (p99s of several windows: the worst one's; the verdict pools them all)")
    return lines


def metrics_source(capacity: dict[str, Any]) -> str:
    """Which run a capacity search's metrics are (trial/capacity.py `find_capacity`): the window at the
    capacity, else (no rate passed) the lowest probe's, else (nothing probed) the saturation burst's."""
    if capacity["rate"] > 0:
        sustained = capacity.get("sustained", {}).get("output_throughput")
        at = (
            f"; sustained at the capacity, as run reports it: {sustained:.2f} output tok/s"
            if sustained
            else ""
        )
        return (
            f"The metrics below are the window at the capacity, {capacity['rate']:.2f} req/s (throughputs: "
            f"as measured over it{at})."
        )
    rates = [p["rate"] for p in capacity["probes"]]
    if rates:
        return (
            f"No rate passed: the metrics below are the window at the lowest rate probed, {min(rates):.2f} "
            "req/s (throughputs: as measured there)."
        )
    return "No rate was probed: the metrics below are the saturation run's (every request at once)."


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
