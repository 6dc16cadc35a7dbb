"""The guide: the simulated engine's prediction of every config of a search space, before any GPU trial.

For each point of the space's grid (`GRID_STEPS` values at most per stepped range, powers of two for
log ints, see SearchSpace.grid): whether it starts (vLLM's validity rules, then the memory model, with
the failure vLLM would report), and for those that do the guide's fast estimate
(autotune/tune/guide_estimate.py): capacity under the SLOs, throughput and p99 TTFT/ITL there, the knee.
Configs are estimated by class (those that differ only in their KV pool share runs), classes spread
over worker processes.

The table is cached in <runs-dir>/guide/<key>.json, the key a hash of what a prediction depends on: the
model, GPU and fixed flags, the grid, the workload, the SLOs, the simulator's calibration, the guide's
settings and the source of the code that predicts. A second run with the same inputs reads it back.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.core.atomic import atomic_write_text
from autotune.core.config import EngineConfig
from autotune.core.errors import EngineStartupError, FailureKind
from autotune.core.json_out import json_text
from autotune.core.procs import map_in_workers
from autotune.measure.slo import Slo
from autotune.sim.engine import SimEngine
from autotune.tune.guide_estimate import Estimator, GuideSettings, Pool
from autotune.tune.objectives import Objective, ObjectiveSet
from autotune.tune.space import SearchSpace, violations
from autotune.tune.study import config_key

DEFAULT_OBJECTIVE = Objective("output_throughput", "maximize")
GRID_STEPS = 5  # values of a stepped range (gpu_memory_utilization 0.80..0.96 by 0.01: 0.80, 0.84, ...)
CACHE_DIR = "guide"
# The source a prediction depends on (under autotune/): its hash is part of the cache key.
PREDICTING = ("sim", "catalog", "workloads", "measure", "core/config.py", "trial/capacity.py")
PREDICTING += ("tune/guide.py", "tune/guide_estimate.py", "tune/space.py")


@dataclass(frozen=True)
class Prediction:
    """The guide's prediction for one config of the grid."""

    key: str  # config_key of the config (tune/study.py)
    params: dict[str, Any]  # the grid point: the space's tuned flags
    starts: bool
    failure: str | None = None  # FailureKind value when it does not start (invalid_config, kv_cache_oom...)
    message: str = ""  # vLLM's message for that failure
    capacity_rate: float = 0.0  # req/s meeting every SLO (0: none)
    output_throughput: float = 0.0  # tok/s sustained at capacity
    p99_ttft_ms: float | None = None  # at capacity
    p99_itl_ms: float | None = None
    knee_rate: float | None = None  # req/s where p99 TTFT takes off (None: not seen)
    metrics: dict[str, float] = field(default_factory=dict)  # vllm bench serve keys at capacity

    def value(self, objective: Objective, tp: int = 1) -> float | None:
        """The objective's predicted value (None: the config does not start or meets no rate). `tp`: the
        space's fixed tensor parallel size; a config that tunes it divides a per-GPU metric by its own."""
        metric = objective.metric.removesuffix("_per_gpu")
        value = self.metrics.get(metric) if self.capacity_rate > 0 else None
        if value is None:
            return None
        gpus = int(self.params.get("tensor_parallel_size", tp))
        return value / gpus if objective.metric.endswith("_per_gpu") else value


@dataclass
class GuideTable:
    """Every grid point's prediction, with lookup by config and a ranking by objective."""

    predictions: list[Prediction]
    tensor_parallel_size: int = 1
    cache_path: Path | None = None
    from_cache: bool = False
    cpu_s: float = 0.0  # CPU seconds the predictions took (all processes; 0 when read from the cache)
    objectives: tuple[Objective, ...] = ()  # the study's: the first is `ranking`'s default
    # The factor its fast estimates were scaled by to the full search's scale (tune/guide_refine.py):
    # the median over the configs searched in full; 1.0 for the fast estimate's own table.
    estimate_scale: float = 1.0
    # Each config searched in full: its own full search over its fast estimate.
    searched_scales: dict[str, float] = field(default_factory=dict)
    _by_key: dict[str, Prediction] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_key = {p.key: p for p in self.predictions}

    def lookup(self, config: EngineConfig | str) -> Prediction | None:
        """The prediction of a config (or its config_key); None when it is not a grid point."""
        return self._by_key.get(config if isinstance(config, str) else config_key(config))

    def scale_of(self, key: str) -> float:
        """The factor from a config's fast estimate to this table's prediction of it."""
        return self.searched_scales.get(key, self.estimate_scale)

    def estimate_error(self) -> float | None:
        """The fast estimate's error where it was measured: the sd of log(full search / fast estimate)
        over the configs searched in full (None: fewer than two were)."""
        logs = [math.log(r) for r in self.searched_scales.values()]
        return statistics.pstdev(logs) if len(logs) >= 2 else None

    def ranking(self, objective: Objective | None = None) -> list[Prediction]:
        """Configs that meet the SLOs at some rate, best first by the objective's predicted value (by
        default the first of `objectives`, else output throughput)."""
        objective = objective or (self.objectives[0] if self.objectives else DEFAULT_OBJECTIVE)
        scored = [(p, p.value(objective, self.tensor_parallel_size)) for p in self.predictions]
        ranked = [(p, v) for p, v in scored if v is not None]
        ranked.sort(key=lambda pv: -pv[1] if objective.maximize else pv[1])
        return [p for p, _ in ranked]

    def to_json(self) -> str:
        """The table as the cache file stores it."""
        data = {
            "tensor_parallel_size": self.tensor_parallel_size,
            "cpu_s": round(self.cpu_s, 3),
            "estimate_scale": self.estimate_scale,
            "searched_scales": self.searched_scales,
            "predictions": [asdict(p) for p in self.predictions],
        }
        return json_text(data, indent=0)

    @classmethod
    def from_json(cls, text: str, path: Path | None = None) -> GuideTable:
        """A table read back from its cache file."""
        data = json.loads(text)
        predictions = [Prediction(**p) for p in data["predictions"]]
        return cls(
            predictions,
            data["tensor_parallel_size"],
            path,
            from_cache=True,
            estimate_scale=float(data.get("estimate_scale", 1.0)),
            searched_scales={k: float(v) for k, v in data.get("searched_scales", {}).items()},
        )


@dataclass(frozen=True)
class Member:
    """A grid point that starts, as its class's worker estimates it."""

    index: int  # in the grid
    params: dict[str, Any]
    key: str
    resolved: EngineConfig  # with vLLM's defaults filled in, as the engine runs it
    pool: Pool


def predict_space(
    space: SearchSpace,
    workload: Any,
    slos: Sequence[Slo],
    objectives: ObjectiveSet | None = None,
    gpu: str | None = None,
    calibration: object | None = None,
    runs_dir: Path = Path("runs"),
    processes: int | None = None,
    settings: GuideSettings = GuideSettings(),  # noqa: B008 (frozen)
    progress: Callable[[int, int], None] | None = None,
) -> GuideTable:
    """The guide's table for every grid point of `space` on `gpu` (default the space's), read from
    <runs_dir>/guide/ when it was made before with the same inputs. `objectives` order the table's
    ranking (`GuideTable.ranking`) and change no prediction. `calibration` goes to the simulator.
    `progress(done, total)` hears how many configs are predicted as they are. `processes`: worker
    processes at the lowest CPU priority (default: every core this process may use)."""
    space = space.with_overrides(gpu=gpu)
    grid = space.grid(GRID_STEPS)
    points = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    key = cache_key(space, grid, workload, slos, calibration, settings)
    path = Path(runs_dir) / CACHE_DIR / f"{key}.json"
    if path.is_file():
        table = GuideTable.from_json(path.read_text(), path)
    else:
        table = _predict(space, points, workload, slos, calibration, settings, processes, progress)
        table.cache_path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, table.to_json())
    table.objectives = tuple(objectives.objectives) if objectives is not None else ()
    return table


def predict_points(
    space: SearchSpace,
    points: list[dict[str, Any]],
    workload: Any,
    slos: Sequence[Slo],
    calibration: object | None = None,
    settings: GuideSettings = GuideSettings(),  # noqa: B008 (frozen)
) -> GuideTable:
    """The guide's predictions of a few configs off the grid (vLLM's defaults), in this process, uncached."""
    return _predict(space, points, workload, slos, calibration, settings, processes=1)


def cache_key(
    space: SearchSpace,
    grid: dict[str, list[Any]],
    workload: Any,
    slos: Sequence[Slo],
    calibration: object | None,
    settings: GuideSettings,
) -> str:
    """A short hash of everything the predictions depend on (module docstring)."""
    inputs = {
        "model": space.model,
        "gpu": space.gpu,
        "fixed": space.fixed,
        "grid": grid,
        "workload": _workload_key(workload),
        "slos": [str(s) for s in slos],
        "calibration": repr(calibration),
        "settings": asdict(settings),
        "code": code_digest(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _workload_key(workload: Any) -> str:
    """The workload spec, and the content of a file it reads lengths from (a JSONL or trace CSV)."""
    files = [getattr(workload, "jsonl", None), getattr(getattr(workload, "trace", None), "name", None)]
    contents = [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files if f and Path(f).is_file()]
    return repr(workload) + "".join(contents)


def code_digest(names: Sequence[str] = PREDICTING) -> str:
    """A hash of the source the predictions depend on (`names`: packages and modules of autotune/)."""
    root = Path(__file__).resolve().parents[1]
    files: list[Path] = []
    for name in names:
        files += sorted((root / name).glob("*.py")) if (root / name).is_dir() else [root / name]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _predict(
    space: SearchSpace,
    points: list[dict[str, Any]],
    workload: Any,
    slos: Sequence[Slo],
    calibration: object | None,
    settings: GuideSettings,
    processes: int | None,
    progress: Callable[[int, int], None] | None = None,
) -> GuideTable:
    """Startup verdicts here, estimates by class on `processes` workers (1: in this process; None:
    every usable core); the
    table's `cpu_s` counts both."""
    start = time.process_time()
    gpu, model = get_gpu(space.gpu), get_model(space.model)
    predictions: dict[int, Prediction] = {}
    classes: dict[str, list[Member]] = {}
    for i, params in enumerate(points):
        config = space.config(params)
        problems = violations(config, model.max_position_embeddings)
        if problems:
            predictions[i] = _failed(config, params, FailureKind.INVALID_CONFIG, problems[0])
            continue
        try:
            engine = SimEngine(config, gpu)
        except EngineStartupError as exc:
            predictions[i] = _failed(config, params, FailureKind(exc.kind), str(exc))
            continue
        pool = Pool.of(engine.config, engine.memory, workload.shares_prefixes)
        classes.setdefault(pool.behaviour, []).append(
            Member(i, params, config_key(config), engine.config, pool)
        )
    # The dearest classes first, so the workers finish together: a run's CPU cost grows with the
    # sequences it holds a step (max_num_seqs), a class's with its members.
    ordered = sorted(
        classes.values(), key=lambda members: (-(members[0].resolved.max_num_seqs or 0), -len(members))
    )
    jobs = [(members, space.gpu, workload, list(slos), settings, calibration) for members in ordered]
    finished = len(predictions)  # the configs that do not start are predicted already

    def done(i: int) -> None:
        nonlocal finished
        finished += len(jobs[i][0])
        if progress is not None:
            progress(finished, len(points))

    cpu_s = time.process_time() - start  # the startup verdicts; each job counts its own time
    for estimated, job_cpu_s in map_in_workers(_estimate_class, jobs, processes, done, background=True):
        cpu_s += job_cpu_s
        predictions.update(estimated)
    tp = int(space.fixed.get("tensor_parallel_size", 1))
    return GuideTable([predictions[i] for i in range(len(points))], tp, cpu_s=cpu_s)


def _estimate_class(
    members: list[Member],
    gpu: str,
    workload: Any,
    slos: list[Slo],
    settings: GuideSettings,
    calibration: object | None,
) -> tuple[dict[int, Prediction], float]:
    """The predictions of one class, and the CPU seconds they took. The largest KV pool goes first: its
    runs are the likeliest to be shared."""
    start = time.process_time()
    estimator = Estimator(get_gpu(gpu), workload, slos, settings, calibration)
    members = sorted(members, key=lambda m: -m.pool.num_blocks * m.pool.block_size)
    out = {}
    for m in members:
        e = estimator.estimate(m.resolved, m.pool, estimator.scan(m.resolved, m.pool))
        out[m.index] = Prediction(
            key=m.key,
            params=m.params,
            starts=True,
            capacity_rate=round(e.capacity_rate, 4),
            output_throughput=e.metrics.get("output_throughput", 0.0),
            p99_ttft_ms=e.metrics.get("p99_ttft_ms"),
            p99_itl_ms=e.metrics.get("p99_itl_ms"),
            knee_rate=round(e.knee_rate, 4) if e.knee_rate is not None else None,
            metrics=e.metrics,
        )
    return out, time.process_time() - start


def _failed(config: EngineConfig, params: dict[str, Any], kind: FailureKind, message: str) -> Prediction:
    return Prediction(key=config_key(config), params=params, starts=False, failure=str(kind), message=message)
