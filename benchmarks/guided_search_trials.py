"""Real trials for benchmarks/guided_search.py: the capacity search a trial runs (trial/capacity.py) on
the simulated engine with a reality's calibration and 2 % noise, its cost the simulated GPU time that
search charges (startup + saturation + probe windows, x TP), cached on disk per (reality, config, seed,
hint) so that reruns and strategies that measure the same config pay once.

Ground truth: the same search on seeds no strategy uses (their mean), noise off unless asked, over the
union of every config any strategy measured and the reality's own top TRUTH_TOP by its fast estimate
(the exhaustive grid costs ~0.5-2 CPU-s a config x 980 configs x 11 realities: hours on this machine).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guide_accuracy import MEASURING

from autotune.backends.sim import SimBackend
from autotune.core.atomic import atomic_write_text
from autotune.sim.calibration import Calibration
from autotune.sim.noise import NoiseModel
from autotune.trial.capacity import CapacitySearch, find_capacity
from autotune.tune.objectives import Objective, constraints, is_feasible

NOISE = 0.02
TRUTH_SEED = 10**6  # far from the strategies' seeds (0, 1, ...) and their windows' (seed + window)
TRUTH_TOP = 50  # the reality's own best configs by its fast estimate, always in the truth set
# The source a search's result depends on, the cache's key: what a capacity search runs on the simulated
# engine (guide_accuracy.MEASURING), and the objective and failure kinds a trial is told with; not the
# guide's code, whose changes leave every search as it was.
SEARCHING = (*MEASURING, "core", "backends/base.py", "tune/objectives.py")


@dataclass(frozen=True)
class TruthSpec:
    """How the ground truth is measured: the mean of `seeds` searches, with `noise` (0: noise-free)."""

    seeds: int = 1
    noise: float = 0.0

    def __str__(self) -> str:
        noise = f"noise {self.noise:g}" if self.noise else "noise off"
        return f"truth over {self.seeds} seed{'s' if self.seeds > 1 else ''}, {noise}"


@dataclass(frozen=True)
class Measured:
    """One capacity search: the objective's value (0: failed or met no rate), its GPU seconds (x TP),
    its capacity rate (req/s), how many probes it ran and its saturation bursts."""

    value: float
    gpu_s: float
    rate: float = 0.0
    probes: int = 0
    bursts: list[dict[str, Any]] = field(default_factory=list)  # its saturation bursts, as a study has them


@dataclass(frozen=True)
class Job:
    """What one search needs (picklable, for the worker processes)."""

    case: Any  # guide_accuracy.Case
    calibration: Calibration
    params: dict[str, Any]
    seed: int
    noise: float
    hint: float | None
    objective: Objective


def run_job(job: Job) -> Measured:
    """One capacity search of `job.params` on the reality (a worker process's task)."""
    space = job.case.space()
    config = space.config(job.params)
    backend = SimBackend(space.gpu, NoiseModel(job.noise), job.calibration)
    slos = job.case.scenario.slo_list()
    search = CapacitySearch(hint_rate=job.hint)
    result = find_capacity(backend, config, job.case.workload(), slos, seed=job.seed, search=search)
    tp = max(1, config.tensor_parallel_size)
    ok = result.ok and is_feasible(constraints(result, slos))
    cap = result.capacity
    value = job.objective.value(result) if ok else 0.0
    rate = cap.rate if cap is not None else 0.0
    bursts = [dataclasses.asdict(b) for b in cap.bursts] if cap is not None else []
    return Measured(value, result.gpu_seconds * tp, rate, len(cap.probes) if cap is not None else 0, bursts)


class Trials:
    """The cached searches of one case under one reality (a JSON file per pair)."""

    def __init__(self, path: Path, case: Any, calibration: Calibration, objective: Objective) -> None:
        self.path, self.case, self.calibration, self.objective = path, case, calibration, objective
        self.cache: dict[str, Measured] = {}
        if path.exists():
            self.cache = {k: Measured(*v) for k, v in json.loads(path.read_text()).items()}
        self._dirty = False

    @staticmethod
    def slot(key: str, seed: int, noise: float, hint: float | None) -> str:
        return f"{key}|{seed}|{noise:g}|{'' if hint is None else f'{hint:.4g}'}"

    def measure(self, key: str, params: Mapping[str, Any], seed: int, hint: float | None = None) -> Measured:
        """A strategy's trial: the search with noise on (run here, or read from the cache)."""
        return self.many([(key, params)], seed, NOISE, hint, processes=1)[key]

    def many(
        self,
        items: Sequence[tuple[str, Mapping[str, Any]]],
        seed: int,
        noise: float,
        hint: float | None = None,
        processes: int = 1,
    ) -> dict[str, Measured]:
        """Searches of several configs (one seed), the missing ones on `processes` workers."""
        missing = [(k, p) for k, p in items if self.slot(k, seed, noise, hint) not in self.cache]
        cal, objective = self.calibration, self.objective
        jobs = [Job(self.case, cal, dict(p), seed, noise, hint, objective) for _, p in missing]
        if jobs:
            if processes > 1 and len(jobs) > 1:
                with ProcessPoolExecutor(processes) as pool:
                    done = list(pool.map(run_job, jobs, chunksize=4))
            else:
                done = [run_job(j) for j in jobs]
            for (key, _), measured in zip(missing, done, strict=True):
                self.cache[self.slot(key, seed, noise, hint)] = measured
            self._dirty = True
        return {k: self.cache[self.slot(k, seed, noise, hint)] for k, _ in items}

    def truth(
        self, items: Iterable[tuple[str, Mapping[str, Any]]], processes: int, spec: TruthSpec
    ) -> dict[str, float]:
        """Every config in `items` searched on `spec.seeds` seeds no strategy uses: key -> its mean value.
        One search spreads 2-5 % over seeds (median; 11-14 % p90 on the L4 case), and the best of many
        near-tied configs' single searches is the luckiest draw: more seeds, a truer best. With
        `spec.noise` the searches carry the trials' noise: near an SLO's limit a noisy GPU sustains less
        than a noise-free engine, and by how much differs between configs."""
        unique = list(dict(items).items())
        found = [self.many(unique, TRUTH_SEED + i, spec.noise, None, processes) for i in range(spec.seeds)]
        return {k: sum(f[k].value for f in found) / spec.seeds for k, _ in unique}

    def save(self) -> None:
        if self._dirty:
            data = {k: list(dataclasses.astuple(m)) for k, m in self.cache.items()}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(data, separators=(",", ":")))
            self._dirty = False
