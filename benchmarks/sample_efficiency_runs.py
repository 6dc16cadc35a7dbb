"""The sample-efficiency benchmark's strategies, run against a scenario's grid (the oracle).

The Optuna strategies run autotune's real loop: `Tuner` (autotune/tune/tuner.py) with the sampler from
`make_sampler` and the study from `start_study` (vLLM's default config is the first trial), validity
rules, startup screening and dedupe as in `autotune run`; only the executor is a lookup in the grid.
vLLM's auto_tune.sh is replayed step by step (gpu-memory-utilization back-off, then its 2x4 grid).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from sample_efficiency_grid import WORKLOAD_SEED, Oracle

from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.result import TrialResult
from autotune.trial.task import SearchPlan
from autotune.tune.objectives import load_objectives
from autotune.tune.run_records import TunerOptions
from autotune.tune.samplers import make_sampler
from autotune.tune.screen import make_screen
from autotune.tune.study import StudySettings
from autotune.tune.study_open import start_study
from autotune.tune.tuner import Tuner

NO_SCREEN = "-noscreen"  # suffix: the strategy as `autotune run --no-screen` runs it
# auto_tune.sh's defaults (benchmarks/auto_tune/auto_tune.sh in vLLM)
SH_SEQS = (128, 256)
SH_BUDGETS = (512, 1024, 2048, 4096)
SH_UTIL_START, SH_UTIL_STOP = 0.98, 0.90


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

    def submit(
        self,
        number: int,
        config: EngineConfig,
        seed: int,
        trial_dir: Path | None,
        plan: SearchPlan | None = None,
    ) -> tuple[int, ...]:
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
    # do not count toward --n-trials (autotune/tune/tuner.py), so they are not trials here either.
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
