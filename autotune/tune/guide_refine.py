"""The guide's top, refined before the first GPU trial: the configs the fast estimate ranks highest,
measured on the simulated engine by the capacity search a real trial runs.

The fast estimate (tune/guide_estimate.py) probes rates on a ladder 2.9 % apart with short windows:
configs tie at its top (12 on the L4 case, 210 on the default space, docs/guided-search-evidence.md), and it
differs from the full search by 3.5-7.4 % median (docs/simulator.md, "Guide"). Which of the tied
configs the first GPU trial measured was then the table's order: on the L4 a token budget 5.4 % below
the best (docs/guided-search-evidence.md), even on a GPU that behaves as the model. The full search costs 1-8
CPU-s a config: affordable for the top of the table, not for the space.

The refined table: its top `top` configs by the fast estimate carry the full search's prediction; every
other config's objective is scaled by the median ratio of the full search to the fast estimate over the
refined ones (at the top the fast estimate reads 5 % high on the 70B case, within 1 % on the 8B
cases of docs/guided-search-evidence.md), so refined and unrefined configs compare on one scale. Each refined
config keeps its own ratio, with which the speed refit (tune/guide_refit.py) moves its full search's
value as the factor moves its fast estimate. Cached next to the table
(<runs-dir>/guide/<key>.top<N>-<code>.json).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.backends.sim import SimBackend
from autotune.core.atomic import atomic_write_text
from autotune.core.procs import map_in_workers
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.trial.capacity import find_capacity
from autotune.tune.guide import GuideTable, Prediction
from autotune.tune.objectives import Objective, constraints, is_feasible
from autotune.tune.space import SearchSpace
from autotune.tune.study import config_key

REFINE_TOP = 16  # configs searched in full: the L4 case's tie at the top (12) and the next rung
SEARCH_SEED = 0  # the seed a trial's search runs with by default


def refine_table(
    table: GuideTable,
    space: SearchSpace,
    workload: Any,
    slos: Sequence[Slo],
    objective: Objective,
    calibration: Calibration | None = None,
    top: int = REFINE_TOP,
    processes: int | None = None,
) -> GuideTable:
    """`table` with its `top` best configs by `objective` predicted by the full capacity search on the
    simulated engine at `calibration`, the others rescaled to them (module docstring); read from the
    cache when it was made before. `top` 0 or no config meeting the SLOs: `table` itself."""
    ranked = table.ranking(objective)[:top]
    if not ranked:
        return table
    path = _cache_path(table, objective, top)
    if path is not None and path.is_file():
        refined = GuideTable.from_json(path.read_text(), path)
    else:
        points = [p.params for p in ranked]
        found, cpu_s = search_points(space, points, workload, slos, calibration, processes)
        refined = _merge(table, dict(zip((p.key for p in ranked), found, strict=True)), objective)
        refined.cpu_s = table.cpu_s + cpu_s  # the searches' own, in whichever process ran them
        if path is not None:
            refined.cache_path = path
            atomic_write_text(path, refined.to_json())
    refined.objectives = table.objectives
    return refined


def search_points(
    space: SearchSpace,
    points: list[dict[str, Any]],
    workload: Any,
    slos: Sequence[Slo],
    calibration: Calibration | None = None,
    processes: int | None = None,
) -> tuple[list[Prediction], float]:
    """Each config's full capacity search on the simulated engine (noise off), as a Prediction, in
    order; and the CPU seconds the searches took (every process)."""
    cal = calibration or DEFAULT_CALIBRATION
    jobs = [(space, params, workload, list(slos), cal) for params in points]
    results = map_in_workers(_search, jobs, processes, background=True)
    return [p for p, _ in results], sum(s for _, s in results)


def _search(
    space: SearchSpace, params: dict[str, Any], workload: Any, slos: list[Slo], calibration: Calibration
) -> tuple[Prediction, float]:
    """One config's search, as a worker process runs it: its prediction and CPU seconds."""
    start = time.process_time()
    config = space.config(params)
    backend = SimBackend(space.gpu, calibration=calibration)
    result = find_capacity(backend, config, workload, slos, seed=SEARCH_SEED)
    return _prediction(config_key(config), params, result, slos), time.process_time() - start


def _prediction(key: str, params: dict[str, Any], result: TrialResult, slos: Sequence[Slo]) -> Prediction:
    """A search's outcome as the guide's table holds it: capacity 0 when no rate met the SLOs."""
    if result.failure is not None and result.benchmark is None:
        failure = str(result.failure)
        return Prediction(key, params, starts=False, failure=failure, message=result.message)
    bench = result.benchmark.to_dict() if result.benchmark is not None else {}
    metrics = {
        k: round(float(v), 4)
        for k, v in bench.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    met = result.capacity is not None and result.ok and is_feasible(constraints(result, slos))
    return Prediction(
        key,
        params,
        starts=True,
        capacity_rate=round(result.capacity.rate, 4) if met and result.capacity is not None else 0.0,
        output_throughput=metrics.get("output_throughput", 0.0),
        p99_ttft_ms=metrics.get("p99_ttft_ms"),
        p99_itl_ms=metrics.get("p99_itl_ms"),
        metrics=metrics,
    )


def _merge(table: GuideTable, searched: dict[str, Prediction], objective: Objective) -> GuideTable:
    """The table with `searched` in place of the fast estimates, the rest scaled to the searched ones."""
    tp = table.tensor_parallel_size
    ratios = {}
    for key, found in searched.items():
        fast, full = table.lookup(key), found.value(objective, tp)
        fast_value = fast.value(objective, tp) if fast is not None else None
        if fast_value and full:
            ratios[key] = full / fast_value
    ratio = math.exp(statistics.median(math.log(r) for r in ratios.values())) if ratios else 1.0
    predictions = [searched.get(p.key) or scaled(p, ratio, objective) for p in table.predictions]
    return GuideTable(predictions, tp, cpu_s=table.cpu_s, estimate_scale=ratio, searched_scales=ratios)


def scaled(prediction: Prediction, ratio: float, objective: Objective) -> Prediction:
    """A fast estimate moved by `ratio` on the objective's scale. For a throughput objective the rate and
    every throughput move together (each is the rate times tokens per request)."""
    if not prediction.starts or prediction.capacity_rate <= 0 or ratio == 1.0:
        return prediction
    metric = objective.metric.removesuffix("_per_gpu")
    throughput = metric.endswith("_throughput")
    names = [k for k in prediction.metrics if k.endswith("_throughput")] if throughput else [metric]
    metrics = {**prediction.metrics, **{k: round(prediction.metrics[k] * ratio, 4) for k in names}}
    if not throughput:
        return dataclasses.replace(prediction, metrics=metrics)
    return dataclasses.replace(
        prediction,
        capacity_rate=round(prediction.capacity_rate * ratio, 4),
        output_throughput=metrics.get("output_throughput", prediction.output_throughput),
        metrics=metrics,
    )


def _cache_path(table: GuideTable, objective: Objective, top: int) -> Path | None:
    """Next to the table's cache file, keyed by the objective, `top` and this module's source."""
    if table.cache_path is None:
        return None
    source = Path(__file__).read_bytes()
    digest = hashlib.sha256(source + repr((objective, top, SEARCH_SEED)).encode()).hexdigest()[:10]
    return table.cache_path.with_name(f"{table.cache_path.stem}.top{top}-{digest}.json")
