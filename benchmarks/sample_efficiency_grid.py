"""The sample-efficiency benchmark's ground truth: a scenario's exhaustive grid, measured once and cached.

Every point of a scenario's discretized space that passes vLLM's validity rules is measured on the
simulated engine exactly as `autotune run`'s executor measures it (a capacity search where the workload
says `load: capacity`, its fixed load otherwise), and judged with autotune's own constraint rule. The
results are cached in runs/sample_efficiency/cache/, keyed by the scenario and by the source of the
code that measures, so each strategy looks results up instead of simulating.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from optuna._hypervolume import compute_hypervolume
from scenarios import Scenario

from autotune.backends.sim import SimBackend
from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.core.config import EngineConfig
from autotune.measure.result import TrialResult
from autotune.trial.task import evaluate_trial
from autotune.tune.guide import code_digest
from autotune.tune.objectives import constraints, is_feasible
from autotune.tune.space import SearchSpace, violations
from autotune.tune.study import config_key

TARGETS = (0.95, 0.98, 1.0)  # shares of the oracle's best feasible throughput a run is timed to
WORKLOAD_SEED = 0  # every trial replays the same requests (as `autotune run --seed 0` does)
MEASURING = (
    "trial/capacity.py", "trial/probe.py", "measure/steady_state.py", "measure/metrics.py",
    "measure/early_abort.py", "measure/evidence.py", "measure/slo.py", "tune/objectives.py",
    "workloads/spec.py", "workloads/traces.py", "workloads/lengths.py", "core/config.py",
    "measure/result.py", "measure/load_report.py", "measure/capacity_report.py",
)  # fmt: skip
HV_REF = 1.1  # reference point of the normalized costs (each in [0, 1] over the feasible grid)


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
    # What scoring reads: the metrics, keeping up (the constraints) and the capacity, not its probes.
    result.log_tail = ""
    result.server = None
    if result.capacity is not None:
        result.capacity = dataclasses.replace(result.capacity, probes=())
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
    path = cache_dir / f"{scenario.name}-{scenario.digest()}-{grid_digest()}.pkl"
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


def grid_digest() -> str:
    """A short hash of the source that decides a grid's results (8 hex digits: the caches' names)."""
    return code_digest(("backends/sim.py", "catalog", "sim", *MEASURING))[:8]


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
        why = infeasibility(grid, oracle.scenario)
        raise RuntimeError(f"scenario {oracle.scenario.name}: no feasible config in the grid ({why})")
    raw = np.array([_raw_costs(r) for r in feasible])
    oracle.lo, oracle.hi = raw.min(axis=0), raw.max(axis=0)
    oracle.best = max(r.benchmark.get("output_throughput") for r in feasible)  # type: ignore[union-attr]
    oracle.hv = 1.0
    oracle.hv = oracle.hypervolume(feasible)
    gpu = get_gpu(oracle.scenario.gpu)
    base = oracle.lookup(space.config(space.baseline_params(gpu.memory_gib, max_pos)))
    oracle.baseline = base.benchmark.get("output_throughput") if oracle.feasible(base) else None  # type: ignore[union-attr]


def infeasibility(grid: Sequence[TrialResult], scenario: Scenario) -> str:
    """Per constraint (autotune's, in its order): how many configs break it, and the closest value of
    those that meet all the others (an SLO's is its relative margin: +0.04 is 4 % over its limit).

    When a simulator change leaves a scenario with no feasible config, this says which limit to move.
    """
    values = [constraints(r, scenario.slo_list()) for r in grid]
    parts = []
    for key in values[0] if values else {}:
        over = sum(v[key] > 0 for v in values)
        rest_hold = [v[key] for v in values if all(x <= 0 for k, x in v.items() if k != key)]
        closest = f", closest meeting the rest {min(rest_hold):+.2f}" if rest_hold else ""
        parts.append(f"{key}: {over} of {len(values)} over{closest}")
    return "; ".join(parts)


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
