"""Sample efficiency of autotune's samplers against random search and vLLM's auto_tune.sh (issue 5).

    python benchmarks/sample_efficiency.py            # full run (6 scenarios, 10 seeds, 60 trials)
    python benchmarks/sample_efficiency.py --quick    # 3 scenarios, 3 seeds, 40 trials

For every scenario (benchmarks/scenarios.py) the whole discretized space is evaluated once on the
simulated engine: that exhaustive grid is the ground truth (best feasible output throughput under the
scenario's SLOs, and the feasible Pareto front of throughput / p99 TTFT / p99 ITL). The grid is cached
in runs/sample_efficiency/cache/, so each strategy then looks results up instead of simulating.

The Optuna strategies run autotune's real loop: `Tuner` (autotune/tuner.py) with the sampler from
`make_sampler` and the study from `start_study` (autotune/study.py: vLLM's default config is the
first trial), validity rules, startup screening (autotune/screen.py) and dedupe as in `autotune run`;
only the executor is replaced by a lookup in the grid. A strategy named `NAME-noscreen` is NAME with
`--no-screen`: on the simulated engine the screen shares the engine's memory model and is exact, so
the pair shows what screening saves and what the sampler finds without that oracle. vLLM's
auto_tune.sh is replayed step by step (gpu-memory-utilization back-off, then its 2x4 grid), and its
chosen config is scored on the scenario's objective.

Printed per strategy (medians over scenarios x seeds): trials and simulated GPU-minutes to reach 95 /
98 / 100 % of the oracle's best feasible throughput, the share of runs reaching 98 % within 20 and 40
trials, hypervolume of the feasible front found after 10 / 20 / 40 trials relative to the true front,
the failed launches spent and the suggestions screened before launch; per scenario, the median trials
to 98 % and the worst run's share of failed launches. Results also go to
runs/sample_efficiency/{runs.csv,summary.json}.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import pickle
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna._hypervolume import compute_hypervolume

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scenarios.py next to this file

from scenarios import Scenario, get_scenarios  # noqa: E402

from autotune.backends.base import FailureKind, TrialResult  # noqa: E402
from autotune.backends.sim import SimBackend  # noqa: E402
from autotune.config import EngineConfig  # noqa: E402
from autotune.objectives import constraints, is_feasible, load_objectives  # noqa: E402
from autotune.screen import make_screen  # noqa: E402
from autotune.sim.hardware import get_gpu  # noqa: E402
from autotune.sim.models import get_model  # noqa: E402
from autotune.space import SearchSpace, violations  # noqa: E402
from autotune.study import StudySettings, config_key, make_sampler, start_study  # noqa: E402
from autotune.trial_task import evaluate_trial  # noqa: E402
from autotune.tuner import Tuner, TunerOptions  # noqa: E402

OUT_DIR = Path("runs/sample_efficiency")
TARGETS = (0.95, 0.98, 1.0)
HV_AT = (10, 20, 40)
WITHIN = (20, 40)
OPTUNA_STRATEGIES = ("auto", "tpe", "gp", "nsga2", "random")
NO_SCREEN = "-noscreen"  # suffix: the strategy as `autotune run --no-screen` runs it
DEFAULT_STRATEGIES = (*OPTUNA_STRATEGIES, f"auto{NO_SCREEN}", f"random{NO_SCREEN}")
GP_SEEDS = 3  # GPSampler costs ~0.5 s per trial at 60 trials: fewer seeds keep the run under 20 minutes
AUTO_TUNE_SH = "auto_tune.sh"
WORKLOAD_SEED = 0  # every trial replays the same requests (as `autotune run --seed 0` does)
# What a cached result keeps of a trial's info: what the constraints read (keeping up) and the capacity.
KEPT_INFO = ("backlog_growth", "backlog_allowed", "kept_up", "capacity_rate", "capacity_resolution")
MEASURING = (
    "capacity.py", "steady_state.py", "metrics.py", "early_abort.py", "objectives.py",
    "workload.py", "traces.py", "lengths.py", "evidence.py", "slo.py",
)  # fmt: skip
# auto_tune.sh's defaults (benchmarks/auto_tune/auto_tune.sh in vLLM)
SH_SEQS = (128, 256)
SH_BUDGETS = (512, 1024, 2048, 4096)
SH_UTIL_START, SH_UTIL_STOP = 0.98, 0.90
HV_REF = 1.1  # reference point of the normalized costs (each in [0, 1] over the feasible grid)


# -- ground truth -------------------------------------------------------------------------------------


@dataclass
class Oracle:
    """The exhaustive grid of one scenario: every launched config's result and the truth derived from it."""

    scenario: Scenario
    results: dict[str, TrialResult]  # config key -> result (configs that pass the validity rules)
    invalid: int  # grid points rejected by the validity rules before any launch
    best: float = 0.0  # best feasible output throughput
    baseline: float | None = None  # the vLLM default config's feasible throughput (None: infeasible)
    lo: np.ndarray = field(default_factory=lambda: np.zeros(3))  # normalization of the costs
    hi: np.ndarray = field(default_factory=lambda: np.ones(3))
    hv: float = 1.0  # hypervolume of the true feasible front

    def lookup(self, config: EngineConfig) -> TrialResult:
        """The result of a config; configs outside the grid (auto_tune.sh's) are simulated and kept."""
        key = config_key(config)
        if key not in self.results:
            self.results[key] = simulate(self.scenario, config)
        return self.results[key]

    def feasible(self, result: TrialResult) -> bool:
        """Whether a result meets the scenario's SLOs and ran (autotune's constraint rule)."""
        return is_feasible(constraints(result, self.scenario.slo_list()))

    def costs(self, results: Sequence[TrialResult]) -> np.ndarray:
        """Normalized costs (-throughput, p99 TTFT, p99 ITL), each in [0, 1] over the feasible grid."""
        raw = np.array([_raw_costs(r) for r in results], dtype=float).reshape(-1, 3)
        return (raw - self.lo) / np.where(self.hi > self.lo, self.hi - self.lo, 1.0)

    def hypervolume(self, results: Sequence[TrialResult]) -> float:
        """Hypervolume of the feasible results, relative to the true front's (0..1)."""
        feasible = [r for r in results if self.feasible(r)]
        if not feasible:
            return 0.0
        points = np.minimum(self.costs(feasible), HV_REF)
        return compute_hypervolume(points, np.full(3, HV_REF)) / self.hv


def _raw_costs(result: TrialResult) -> tuple[float, float, float]:
    bench = result.benchmark
    assert bench is not None
    return (-bench.get("output_throughput"), bench.get("p99_ttft_ms"), bench.get("p99_itl_ms"))


def simulate(scenario: Scenario, config: EngineConfig) -> TrialResult:
    """One simulated trial of a config, exactly as `autotune run`'s executor runs it (a capacity search
    when the workload says `load: capacity`). The cache keeps only what scoring needs."""
    result = evaluate_trial(
        SimBackend(scenario.gpu),
        config,
        scenario.workload_spec(),
        scenario.slo_list(),
        WORKLOAD_SEED,
        (),
        None,
    )
    result.log_tail = ""
    result.info = {k: v for k, v in result.info.items() if k in KEPT_INFO}
    return result


def _simulate_job(job: tuple[Scenario, EngineConfig]) -> TrialResult:
    return simulate(*job)


def grid_configs(space: SearchSpace) -> list[EngineConfig]:
    """Every point of the discretized space as a config."""
    grid = space.grid()
    names = list(grid)
    points = [dict(zip(names, values, strict=True)) for values in _product([grid[n] for n in names])]
    return [space.config(p) for p in points]


def _product(lists: list[list[Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for values in lists:
        out = [prefix + (v,) for prefix in out for v in values]
    return out


def build_oracle(scenario: Scenario, cache_dir: Path, pool: ProcessPoolExecutor | None = None) -> Oracle:
    """Evaluate (or load from the cache) the scenario's grid and derive the ground truth.

    The cache is keyed by the scenario and by the source of the code that measures (the simulator,
    the capacity search): results of an older simulator are never reused.
    """
    path = cache_dir / f"{scenario.name}-{scenario.digest()}-{code_digest()}.pkl"
    space = scenario.space()
    max_pos = get_model(scenario.model).max_position_embeddings
    configs = grid_configs(space)
    valid = [c for c in configs if not violations(c, max_pos)]
    if path.is_file():
        results = pickle.loads(path.read_bytes())
    else:
        mapped = pool.map(_simulate_job, [(scenario, c) for c in valid], chunksize=4) if pool else None
        measured = list(mapped) if mapped is not None else [simulate(scenario, c) for c in valid]
        results = {config_key(c): r for c, r in zip(valid, measured, strict=True)}
        check_deterministic(scenario, valid, results)
        cache_dir.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(results))
    oracle = Oracle(scenario=scenario, results=results, invalid=len(configs) - len(valid))
    grid_results = [results[config_key(c)] for c in valid]
    _derive_truth(oracle, grid_results, space, max_pos)
    return oracle


def code_digest() -> str:
    """A short hash of the source that decides a grid's results."""
    root = Path(__file__).resolve().parent.parent / "autotune"
    files = sorted([*root.glob("sim/*.py"), *root.glob("backends/sim.py"), *(root / n for n in MEASURING)])
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def check_deterministic(
    scenario: Scenario, configs: Sequence[EngineConfig], results: dict[str, TrialResult]
) -> None:
    """A cached result stands for every later evaluation only if the simulator is deterministic."""
    for config in configs[:: max(1, len(configs) // 3)]:
        again = simulate(scenario, config)
        first = results[config_key(config)]
        same = (again.failure, again.gpu_seconds) == (first.failure, first.gpu_seconds) and (
            again.benchmark is None or again.benchmark.to_dict() == first.benchmark.to_dict()  # type: ignore[union-attr]
        )
        if not same:
            raise RuntimeError(
                f"{scenario.name}: the simulator is not deterministic for {config_key(config)}"
            )


def _derive_truth(oracle: Oracle, grid: list[TrialResult], space: SearchSpace, max_pos: int) -> None:
    feasible = [r for r in grid if oracle.feasible(r)]
    if not feasible:
        raise RuntimeError(f"scenario {oracle.scenario.name}: no feasible config in the grid")
    raw = np.array([_raw_costs(r) for r in feasible])
    oracle.lo, oracle.hi = raw.min(axis=0), raw.max(axis=0)
    oracle.best = max(r.benchmark.get("output_throughput") for r in feasible)  # type: ignore[union-attr]
    oracle.hv = 1.0
    oracle.hv = oracle.hypervolume(feasible)
    gpu = get_gpu(oracle.scenario.gpu)
    base = oracle.lookup(space.config(space.baseline_params(gpu.memory_gib, max_pos)))
    oracle.baseline = base.benchmark.get("output_throughput") if oracle.feasible(base) else None  # type: ignore[union-attr]


def oracle_summary(oracle: Oracle) -> dict[str, Any]:
    """Grid size, failures, feasibility and how rare the near-best configs are."""
    grid = list(oracle.results.values())
    feasible = [r.benchmark.get("output_throughput") for r in grid if oracle.feasible(r)]  # type: ignore[union-attr]
    total = len(grid) + oracle.invalid
    return {
        "scenario": oracle.scenario.name,
        "grid": total,
        "invalid_rules": oracle.invalid,
        "fail_to_start": sum(1 for r in grid if r.benchmark is None),
        "feasible": len(feasible),
        "best_tok_s": round(oracle.best, 1),
        "baseline_tok_s": "infeasible" if oracle.baseline is None else round(oracle.baseline, 1),
        **{
            f"share_ge_{int(t * 100)}": round(sum(v >= t * oracle.best for v in feasible) / total, 4)
            for t in TARGETS
        },
    }


# -- one run of a strategy ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial (a launched config) of a run cost and found."""

    failed_launch: bool  # the server did not produce a benchmark
    result: TrialResult | None  # None when nothing ran
    gpu_s: float  # GPU seconds (times the TP size) this trial cost
    screened_before: int = 0  # suggestions screened (not launched, not counted) since the previous trial
    duplicates_before: int = 0  # duplicates (free, not counted toward --n-trials) since the previous trial


class LookupExecutor:
    """autotune's Executor interface, answered from the oracle's grid, one trial at a time."""

    capacity = 1

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle
        self._done: list[tuple[int, TrialResult]] = []

    def needs(self, config: EngineConfig) -> int:
        return 1

    def fits(self, config: EngineConfig) -> bool:
        return True

    def can_start(self, config: EngineConfig | None = None) -> bool:
        return not self._done

    def in_flight(self) -> list[tuple[int, EngineConfig]]:
        return []

    def submit(self, number: int, config: EngineConfig, seed: int, trial_dir: Path | None) -> tuple[int, ...]:
        self._done.append((number, self.oracle.lookup(config)))
        return ()

    def wait(self, timeout: float) -> list[tuple[int, TrialResult]]:
        done, self._done = self._done, []
        return done

    def cancel_all(self) -> list[int]:
        return []


def candidate_samplers() -> dict[str, Callable[[int, int, int], optuna.samplers.BaseSampler]]:
    """Samplers tried as the default besides autotune's own (name -> f(n_params, seed, n_trials))."""

    def tpe(startup: int, **extra: Any) -> Callable[[int, int, int], optuna.samplers.BaseSampler]:
        return lambda n_params, seed, n_trials: optuna.samplers.TPESampler(
            seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup, **extra
        )

    return {
        "tpe-s3": tpe(3),
        "tpe-s5": tpe(5),
        "tpe-s5-group": tpe(5, group=True),
        "tpe-s5-ei64": tpe(5, n_ei_candidates=64),
    }


def run_optuna(oracle: Oracle, strategy: str, seed: int, n_trials: int) -> list[TrialOutcome]:
    """One run of `autotune run --sampler STRATEGY --seed SEED` on the grid, as TrialOutcomes.

    `STRATEGY-noscreen` runs it with `--no-screen`.
    """
    scenario = oracle.scenario
    space = scenario.space()
    objectives = load_objectives("default")
    max_pos = get_model(scenario.model).max_position_embeddings
    candidates = candidate_samplers()
    sampler_name = strategy.removesuffix(NO_SCREEN)
    if sampler_name in candidates:
        sampler = candidates[sampler_name](len(space.params), seed, n_trials)
    else:
        sampler = make_sampler(sampler_name, space.grid(), seed, n_trials)
    screen = None if strategy.endswith(NO_SCREEN) else make_screen(scenario.model, scenario.gpu)
    settings = StudySettings(
        objectives=objectives.names,
        directions=objectives.directions,
        slos=[str(slo) for slo in scenario.slo_list()],
        model=scenario.model,
        gpu=scenario.gpu,
        workload=scenario.workload,
        backend="sim",
    )
    # As `autotune run` starts a new study: vLLM's default config is the first trial.
    baseline = space.baseline_params(get_gpu(scenario.gpu).memory_gib, max_pos)
    name = f"{scenario.name}-{strategy}-{seed}"
    study = start_study(name, optuna.storages.InMemoryStorage(), settings, sampler, False, baseline)
    tuner = Tuner(
        study,
        space,
        objectives,
        scenario.slo_list(),
        LookupExecutor(oracle),  # type: ignore[arg-type]
        TunerOptions(n_trials=n_trials, seed=WORKLOAD_SEED),
        max_position_embeddings=max_pos,
        screen=screen,
    )
    tuner.run()
    # Suggestions rejected before launch (vLLM's rules, screening) and duplicates cost no GPU time and
    # do not count toward --n-trials (autotune/tuner.py), so they are not trials here either.
    outcomes, screened, duplicates = [], 0, 0
    for t in study.trials:  # in trial order: the lookup executor runs one trial at a time
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        if "duplicate_of" in t.user_attrs:
            duplicates += 1
        elif t.user_attrs.get("launched", True):
            outcomes.append(_outcome(oracle, t, screened, duplicates))
            screened = duplicates = 0
        else:
            screened += bool(t.user_attrs.get("screened"))
    return outcomes


def _outcome(
    oracle: Oracle, trial: optuna.trial.FrozenTrial, screened_before: int, duplicates_before: int
) -> TrialOutcome:
    attrs = trial.user_attrs
    result = oracle.results[attrs["config_key"]]
    return TrialOutcome(
        failed_launch=_failed_to_start(result),
        result=result,
        gpu_s=float(attrs.get("gpu_seconds", 0.0)),
        screened_before=screened_before,
        duplicates_before=duplicates_before,
    )


def _failed_to_start(result: TrialResult) -> bool:
    return result.benchmark is None and result.failure not in (None, FailureKind.EARLY_ABORT)


def run_auto_tune_sh(oracle: Oracle) -> tuple[list[TrialOutcome], TrialResult | None]:
    """vLLM's auto_tune.sh: utilization back-off with the largest grid values, then its 2x4 grid.

    Its objective is the highest request throughput (no E2EL limit by default); the pick is scored on
    ours. Back-off starts cost their startup time; if nothing starts at >= 0.90 the script exits.
    """
    space = oracle.scenario.space()
    tp = max(1, oracle.scenario.tensor_parallel_size)
    base = space.config({}).replace(enable_chunked_prefill=True, enable_prefix_caching=True, block_size=16)
    outcomes: list[TrialOutcome] = []
    util = SH_UTIL_START
    while True:
        probe = oracle.lookup(
            base.replace(
                max_num_seqs=SH_SEQS[-1], max_num_batched_tokens=SH_BUDGETS[-1], gpu_memory_utilization=util
            )
        )
        started = probe.benchmark is not None
        outcomes.append(TrialOutcome(not started, None, probe.startup_s * tp))
        if started:
            break
        util = round(util - 0.01, 2)
        if util < SH_UTIL_STOP - 1e-9:
            return outcomes, None
    results = []
    for seqs in SH_SEQS:
        for budget in SH_BUDGETS:
            config = base.replace(
                max_num_seqs=seqs, max_num_batched_tokens=budget, gpu_memory_utilization=util
            )
            result = oracle.lookup(config)
            results.append(result)
            outcomes.append(TrialOutcome(_failed_to_start(result), result, result.gpu_seconds * tp))
    ran = [r for r in results if r.benchmark is not None]
    pick = max(ran, key=lambda r: r.benchmark.get("request_throughput"), default=None)  # type: ignore[union-attr]
    return outcomes, pick


# -- scoring ------------------------------------------------------------------------------------------


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


# -- the benchmark ------------------------------------------------------------------------------------


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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 scenarios, 3 seeds, 40 trials")
    parser.add_argument("--scenarios", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--strategies", nargs="*", default=[*DEFAULT_STRATEGIES, AUTO_TUNE_SH])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per strategy and scenario")
    parser.add_argument("--trials", type=int, default=60, help="trial budget per run")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.scenarios = args.scenarios or ["8b-h100-chat", "8b-h100-prefill-tight", "70b-a100-tp2-chat"]
        args.seeds, args.trials = min(args.seeds, 3), min(args.trials, 40)
    return args


def _seeds(strategy: str, seeds: int) -> int:
    return min(seeds, GP_SEEDS) if strategy == "gp" else seeds


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # One thread per worker process: GPSampler's torch would otherwise oversubscribe the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.monotonic()
    scenarios = get_scenarios(args.scenarios)
    cache_dir = args.out / "cache"
    strategies = available_strategies(args.strategies)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        oracles = [build_oracle(scenario, cache_dir, pool) for scenario in scenarios]
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
