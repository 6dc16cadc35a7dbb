"""Sample efficiency of autotune's samplers against random search and vLLM's auto_tune.sh (issue 5).

    python benchmarks/sample_efficiency.py            # full run (6 scenarios, 10 seeds, 60 trials)
    python benchmarks/sample_efficiency.py --quick    # 3 scenarios, 3 seeds, 40 trials

For every scenario (benchmarks/scenarios.py) the whole discretized space is evaluated once on the
simulated engine: that exhaustive grid is the ground truth (best feasible output throughput under the
scenario's SLOs, and the feasible Pareto front of throughput / p99 TTFT / p99 ITL). The grid is cached
in runs/sample_efficiency/cache/, so each strategy then looks results up instead of simulating.

The Optuna strategies run autotune's real loop: `Tuner` (autotune/tune/tuner.py) with the sampler from
`make_sampler` (autotune/tune/samplers.py) and the study from `start_study` (autotune/tune/study_open.py:
vLLM's default config is the first trial), validity rules, startup screening (autotune/tune/screen.py)
and dedupe as in `autotune run`; only the executor is replaced by a lookup in the grid. A strategy named
`NAME-noscreen` is NAME with `--no-screen`: on the simulated engine the screen shares the engine's memory
model and is exact, so the pair shows what screening saves and what the sampler finds without that
oracle. vLLM's auto_tune.sh is replayed step by step (gpu-memory-utilization back-off, then its 2x4
grid), and its chosen config is scored on the scenario's objective.

Printed per strategy (medians over scenarios x seeds): trials and simulated GPU-minutes to reach 95 /
98 / 100 % of the oracle's best feasible throughput, the share of runs reaching 98 % within 20 and 40
trials, hypervolume of the feasible front found after 10 / 20 / 40 trials relative to the true front,
the failed launches spent and the suggestions screened before launch; per scenario, the median trials
to 98 % and the worst run's share of failed launches. Results also go to
runs/sample_efficiency/{runs.csv,summary.json}.

The parts: sample_efficiency_grid.py (the oracle: the grid, its truth and its cache),
sample_efficiency_runs.py (the strategies' runs), sample_efficiency_scores.py (scores, tables, files).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scenarios.py and the parts next to this file

from arguments import Parser, add_names, folder, whole  # noqa: E402
from sample_efficiency_grid import Oracle, build_oracle, oracle_summary  # noqa: E402
from sample_efficiency_runs import NO_SCREEN, candidate_samplers, run_auto_tune_sh, run_optuna  # noqa: E402
from sample_efficiency_scores import (  # noqa: E402
    RunScore,
    best_so_far,
    per_scenario,
    print_table,
    score_run,
    summarize,
    worst_failed_share,
    write_outputs,
)
from scenarios import SCENARIOS, Scenario, get_scenarios  # noqa: E402

from autotune.tune.samplers import SAMPLERS  # noqa: E402

OUT_DIR = Path("runs/sample_efficiency")
OPTUNA_STRATEGIES = ("auto", "tpe", "gp", "nsga2", "random")
DEFAULT_STRATEGIES = (*OPTUNA_STRATEGIES, f"auto{NO_SCREEN}", f"random{NO_SCREEN}")
GP_SEEDS = 3  # GPSampler costs ~0.5 s per trial at 60 trials: fewer seeds keep the run under 20 minutes
AUTO_TUNE_SH = "auto_tune.sh"


@dataclass(frozen=True)
class Job:
    """All seeds of one strategy on one scenario (one worker process loads the grid once)."""

    scenario: str
    strategy: str
    seeds: tuple[int, ...]
    n_trials: int
    cache_dir: str


def run_job(job: Job) -> list[RunScore]:
    """Run and score one job (in a worker process)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    oracle = build_oracle(get_scenarios([job.scenario])[0], Path(job.cache_dir))
    if job.strategy == AUTO_TUNE_SH:
        outcomes, chosen = run_auto_tune_sh(oracle)
        value = chosen.benchmark.get("output_throughput") if chosen and oracle.feasible(chosen) else 0.0  # type: ignore[union-attr]
        # Its answer exists only when the whole procedure has run: score it at the last trial.
        last = len(outcomes)
        return [score_run(oracle, job.strategy, 0, outcomes, lambda k: value if k == last else 0.0)]
    scores = []
    for seed in job.seeds:
        outcomes = run_optuna(oracle, job.strategy, seed, job.n_trials)
        scores.append(score_run(oracle, job.strategy, seed, outcomes, best_so_far(oracle, outcomes)))
    return scores


def available_strategies(requested: Sequence[str]) -> list[str]:
    """The strategies to run; GP only when PyTorch is installed (Optuna's GPSampler needs it)."""
    out = []
    for name in requested:
        if name == "gp":
            try:
                import torch  # noqa: F401
            except ImportError:
                print("sample_efficiency: PyTorch is not installed: skipping gp", file=sys.stderr)
                continue
        out.append(name)
    return out


def known_strategies() -> list[str]:
    """Every strategy run_job runs: a sampler of `autotune run --sampler` or a candidate of
    sample_efficiency_runs.py, each also as NAME-noscreen, and vLLM's auto_tune.sh."""
    names = (*SAMPLERS, *candidate_samplers())
    return [*(name + screen for name in names for screen in ("", NO_SCREEN)), AUTO_TUNE_SH]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = Parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="3 scenarios, 3 seeds, 40 trials")
    add_names(parser, "--scenarios", [s.name for s in SCENARIOS], "default: all")
    default = [*DEFAULT_STRATEGIES, AUTO_TUNE_SH]
    about = f"to score (none: only build the grids and print the ground truth; default: {' '.join(default)})"
    add_names(parser, "--strategies", known_strategies(), about, default=default)
    parser.add_argument("--seeds", type=whole(1), default=10, help="seeds per strategy and scenario")
    parser.add_argument("--trials", type=whole(1), default=60, help="trial budget per run")
    parser.add_argument("--jobs", type=whole(1), default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--out", type=folder, default=OUT_DIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.scenarios = args.scenarios or ["8b-h100-chat", "8b-h100-prefill-tight", "70b-a100-tp2-chat"]
        args.seeds, args.trials = min(args.seeds, 3), min(args.trials, 40)
    return args


def _seeds(strategy: str, seeds: int) -> int:
    return min(seeds, GP_SEEDS) if strategy == "gp" else seeds


def _timed_oracle(scenario: Scenario, cache_dir: Path, pool: ProcessPoolExecutor) -> Oracle:
    """build_oracle, saying on stderr how long the grid took (a capacity grid takes minutes)."""
    began = time.monotonic()
    oracle = build_oracle(scenario, cache_dir, pool)
    print(f"sample_efficiency: grid {scenario.name}: {time.monotonic() - began:.0f} s", file=sys.stderr)
    return oracle


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # One thread per worker process: GPSampler's torch would otherwise oversubscribe the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.monotonic()
    scenarios = get_scenarios(args.scenarios)
    cache_dir = args.out / "cache"
    strategies = available_strategies(args.strategies)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        oracles = [_timed_oracle(scenario, cache_dir, pool) for scenario in scenarios]
        grid_s = time.monotonic() - start
        truth = [oracle_summary(o) for o in oracles]
        print_table(truth, f"Ground truth (exhaustive grid, {grid_s:.0f} s incl. cache)")
        jobs = [
            Job(s.name, strategy, tuple(range(_seeds(strategy, args.seeds))), args.trials, str(cache_dir))
            for strategy in strategies
            for s in scenarios
        ]
        # Slow samplers first so the pool's tail is short.
        jobs.sort(key=lambda j: j.strategy != "gp")
        scores = [score for batch in pool.map(run_job, jobs) for score in batch]
    if not strategies:  # only the grids: an earlier run's results stay as they are
        print(f"\ngrids built and cached in {cache_dir}/ ({time.monotonic() - start:.0f} s); no strategy run")
        return 0
    rows = summarize(scores, args.trials)
    print_table(rows, f"Per strategy: medians over scenarios x seeds ({args.trials}-trial budget)")
    by_scenario = per_scenario(scores)
    print_table(by_scenario, "Median trials to 98 % of the oracle, per scenario")
    failed_by_scenario = per_scenario(scores, worst_failed_share)
    print_table(failed_by_scenario, "Worst run's share of trials spent on failed launches, per scenario")
    wall = time.monotonic() - start
    print(f"\nwall time {wall:.0f} s ({len(scenarios)} scenarios, {args.seeds} seeds, {args.jobs} processes)")
    summary = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "wall_s": round(wall, 1),
        "ground_truth": truth,
        "strategies": rows,
        "per_scenario": by_scenario,
        "failed_share_per_scenario": failed_by_scenario,
        "runs": [asdict(s) for s in scores],
    }
    write_outputs(args.out, scores, summary)
    print(f"results: {args.out}/runs.csv, {args.out}/summary.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
