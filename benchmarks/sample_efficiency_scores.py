"""The sample-efficiency benchmark's scores: per run (trials and GPU time to the oracle's best,
hypervolume), then medians per strategy and per scenario, printed as tables and written to files.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sample_efficiency_grid import TARGETS, Oracle
from sample_efficiency_runs import TrialOutcome

HV_AT = (10, 20, 40)
WITHIN = (20, 40)


@dataclass
class RunScore:
    """The scores of one run (strategy x scenario x seed)."""

    strategy: str
    scenario: str
    seed: int
    trials: int
    failed_launches: int
    best_share: float  # best feasible throughput found / oracle's
    reach_trials: dict[str, int | None]  # "98" -> first trial (1-based) at >= 98 % of the oracle
    reach_gpu_min: dict[str, float | None]
    hv: dict[str, float]  # "20" -> relative hypervolume after 20 trials
    gpu_min: float
    screened: int = 0  # suggestions screened before launch (not trials)
    duplicates: int = 0  # trials that re-proposed a measured config (no GPU time, but a trial of the budget)


def score_run(
    oracle: Oracle, strategy: str, seed: int, outcomes: list[TrialOutcome], pick: Callable[[int], float]
) -> RunScore:
    """Score a run; `pick(k)` is the feasible throughput the strategy would recommend after k trials."""
    gpu = np.cumsum([o.gpu_s for o in outcomes]) / 60.0
    shares = [pick(k) / oracle.best for k in range(1, len(outcomes) + 1)]
    reach_trials: dict[str, int | None] = {}
    reach_gpu: dict[str, float | None] = {}
    for target in TARGETS:
        k = next((i for i, s in enumerate(shares) if s >= target - 1e-9), None)
        reach_trials[_pct(target)] = None if k is None else k + 1
        reach_gpu[_pct(target)] = None if k is None else round(float(gpu[k]), 2)
    hv = {str(n): oracle.hypervolume([o.result for o in outcomes[:n] if o.result is not None]) for n in HV_AT}
    return RunScore(
        strategy=strategy,
        scenario=oracle.scenario.name,
        seed=seed,
        trials=len(outcomes),
        failed_launches=sum(o.failed_launch for o in outcomes),
        best_share=shares[-1] if shares else 0.0,
        reach_trials=reach_trials,
        reach_gpu_min=reach_gpu,
        hv=hv,
        gpu_min=round(float(gpu[-1]), 2) if len(gpu) else 0.0,
        screened=sum(o.screened_before for o in outcomes),
        duplicates=sum(o.duplicates_before for o in outcomes),
    )


def best_so_far(oracle: Oracle, outcomes: list[TrialOutcome]) -> Callable[[int], float]:
    """The best feasible throughput among the first k trials (what `autotune run` would recommend)."""
    best, running = [], 0.0
    for o in outcomes:
        if o.result is not None and oracle.feasible(o.result):
            running = max(running, o.result.benchmark.get("output_throughput"))  # type: ignore[union-attr]
        best.append(running)
    return lambda k: best[k - 1]


def _pct(target: float) -> str:
    return str(int(round(target * 100)))


def median_or_never(values: Sequence[float | None], digits: int = 1) -> str:
    """Median with unreached runs counted as +inf; 'never' when the median run did not reach."""
    keyed = sorted(math.inf if v is None else v for v in values)
    if not keyed:
        return "-"
    med = statistics.median(keyed)
    return "never" if math.isinf(med) else f"{med:.{digits}f}".rstrip("0").rstrip(".")


def summarize(scores: list[RunScore], n_trials: int) -> list[dict[str, Any]]:
    """One row per strategy: medians over scenarios x seeds."""
    rows = []
    for strategy in dict.fromkeys(s.strategy for s in scores):
        runs = [s for s in scores if s.strategy == strategy]
        row: dict[str, Any] = {"strategy": strategy, "runs": len(runs)}
        for target in TARGETS:
            p = _pct(target)
            row[f"trials_to_{p}"] = median_or_never([r.reach_trials[p] for r in runs])
            row[f"gpu_min_to_{p}"] = median_or_never([r.reach_gpu_min[p] for r in runs])
        for n in WITHIN:
            row[f"reach98_within_{n}"] = _share([(r.reach_trials["98"] or math.inf) <= n for r in runs])
        for n in HV_AT:
            row[f"hv_at_{n}"] = round(statistics.median(r.hv[str(n)] for r in runs), 3)
        row["failed_launches"] = round(statistics.mean(r.failed_launches for r in runs), 1)
        row["failed_share_max"] = round(max(_failed_share(r) for r in runs), 3)
        row["screened"] = round(statistics.mean(r.screened for r in runs), 1)
        row["duplicates"] = round(statistics.mean(r.duplicates for r in runs), 1)
        row["best_share_median"] = round(statistics.median(r.best_share for r in runs), 3)
        rows.append(row)
    return rows


def per_scenario(
    scores: list[RunScore], cell: Callable[[list[RunScore]], str] | None = None
) -> list[dict[str, Any]]:
    """One cell per scenario and strategy: by default the median trials to 98 % (where a strategy wins
    or loses)."""
    cell = cell or (lambda runs: median_or_never([r.reach_trials["98"] for r in runs]))
    rows = []
    for scenario in dict.fromkeys(s.scenario for s in scores):
        row: dict[str, Any] = {"scenario": scenario}
        for strategy in dict.fromkeys(s.strategy for s in scores):
            row[strategy] = cell([s for s in scores if s.strategy == strategy and s.scenario == scenario])
        rows.append(row)
    return rows


def worst_failed_share(runs: list[RunScore]) -> str:
    """The largest share of a run's trials spent on configs that failed to start."""
    return f"{100 * max(map(_failed_share, runs), default=0.0):.0f}%"


def _failed_share(run: RunScore) -> float:
    return run.failed_launches / max(run.trials, 1)


def _share(flags: Sequence[bool]) -> str:
    return f"{100 * sum(flags) / max(len(flags), 1):.0f}%"


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    """A plain fixed-width table."""
    if not rows:
        return
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    print(f"\n{title}")
    print("  ".join(c.rjust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c, "")).rjust(widths[c]) for c in cols))


def write_outputs(out_dir: Path, scores: list[RunScore], summary: dict[str, Any]) -> None:
    """runs.csv (one line per run) and summary.json (the tables and the oracles)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "runs.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["strategy", "scenario", "seed", "trials", "failed_launches", "screened", "best_share", "gpu_min"]
            + [f"trials_to_{_pct(t)}" for t in TARGETS]
            + [f"gpu_min_to_{_pct(t)}" for t in TARGETS]
            + [f"hv_at_{n}" for n in HV_AT]
        )
        for s in scores:
            writer.writerow(
                [
                    s.strategy,
                    s.scenario,
                    s.seed,
                    s.trials,
                    s.failed_launches,
                    s.screened,
                    round(s.best_share, 4),
                    s.gpu_min,
                ]
                + [s.reach_trials[_pct(t)] for t in TARGETS]
                + [s.reach_gpu_min[_pct(t)] for t in TARGETS]
                + [round(s.hv[str(n)], 4) for n in HV_AT]
            )
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
