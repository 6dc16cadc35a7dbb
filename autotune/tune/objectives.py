"""What a study optimises (objectives/*.yaml) and how a TrialResult becomes Optuna values and constraints.

Constraints are told in one fixed order on every trial (GPSampler needs the same keys each time):
one per SLO (its margin, <= 0 holds); then `load_kept_up`: how much the requests in the server grew
over the measured window beyond what is allowed (2 %, or the count's noise): a run that did not keep
up with its offered load does not meet its SLOs at that load, however its latencies look (0 when the
run cannot tell); then
`config_failed` (1 when the config did not produce a benchmark). A failed config is a violation of
every constraint, so samplers learn to avoid it (they rank infeasible trials by their violation, not
by their values).

Its objective values must be finite (Optuna rejects NaN on COMPLETE trials) and are what
optuna-dashboard plots, which does not read constraints: a 1e6 ms latency put every real trial flat on
the axis. So they are told *just past the measured range*: throughputs 0, each latency 10% above the
larger of the worst value measured so far in the study and its SLO limit (FAILED_LATENCY_MS when the
study has neither yet). A failed config then sits in the worst corner of every plot, never off-scale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.bundled import bundled_dir
from autotune.core.config import gpus_per_replica
from autotune.core.errors import AutotuneError, FailureKind
from autotune.core.inputs import not_a_directory, read_yaml
from autotune.measure.metrics import GOODPUT_METRICS, LATENCY_METRICS, PERCENTILES
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo, goodput_bounds, parse_slos

OBJECTIVES_DIR = bundled_dir("objectives")
DIRECTIONS = ("maximize", "minimize")
FILE_KEYS = ("objectives", "slos", "description")
FAILED_KEY = "config_failed"
KEPT_UP_KEY = "load_kept_up"
# Constraint value of each SLO for a config that produced no benchmark: "100x over every limit", so it
# ranks below any config that ran (TPE orders infeasible trials by their summed violation).
FAILED_SLO_MARGIN = 100.0
# A failed config's latency before anything was measured and without an SLO on it: 10 s is past any
# interactive latency yet keeps a plot's scale readable.
FAILED_LATENCY_MS = 10_000.0
FAILED_LATENCY_OVER = 1.1  # a failed config's latency: 10% past the worst measured (or the SLO limit)
PER_GPU = "_per_gpu"
_THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")
_LATENCY_KEYS = tuple(
    f"{stat}_{metric}_ms"
    for metric in LATENCY_METRICS
    for stat in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))
)
METRICS = (*_THROUGHPUTS, *(t + PER_GPU for t in _THROUGHPUTS), *_LATENCY_KEYS)


@dataclass(frozen=True)
class Objective:
    """One metric to maximize or minimize, by its vllm bench serve key (or a throughput `_per_gpu`)."""

    metric: str
    direction: str

    @property
    def maximize(self) -> bool:
        """True for throughput-like objectives."""
        return self.direction == "maximize"

    def value(self, result: TrialResult) -> float:
        """The objective's value for a trial; pessimistic when the trial has no benchmark."""
        if result.benchmark is None:
            return 0.0 if self.maximize else FAILED_LATENCY_MS
        if self.metric.endswith(PER_GPU):
            base = result.benchmark.get(self.metric.removesuffix(PER_GPU)) or 0.0
            return float(base) / gpus_per_replica(result.config.params())
        value = result.benchmark.get(self.metric)
        return float(value) if value is not None else (0.0 if self.maximize else FAILED_LATENCY_MS)


def metric_unit(metric: str) -> str:
    """The unit of a result key: "ms" for latencies, "req/s" or "tok/s" for throughputs ("/GPU" per GPU)."""
    if metric.endswith("_ms"):
        return "ms"
    base = metric.removesuffix(PER_GPU)
    unit = "req/s" if base in ("request_throughput", "request_goodput") else "tok/s"
    return unit + ("/GPU" if metric.endswith(PER_GPU) else "")


def metric_label(metric: str) -> str:
    """A result key with its unit for an axis or a column, e.g. "p99_ttft (ms)"."""
    return f"{metric.removesuffix('_ms')} ({metric_unit(metric)})"


def failed_values(
    objectives: Sequence[Objective], slos: Sequence[Slo], worst: Mapping[str, float]
) -> list[float]:
    """The values told for a config without a benchmark: 0 throughput, latencies just past the worst.

    `worst` maps a metric to the worst (highest) value measured so far in the study.
    """
    limits = {slo.key: slo.limit_ms for slo in slos}
    values = []
    for objective in objectives:
        if objective.maximize:
            values.append(0.0)
            continue
        ceiling = max(worst.get(objective.metric, 0.0), limits.get(objective.metric, 0.0))
        values.append(round(ceiling * FAILED_LATENCY_OVER, 3) if ceiling > 0 else FAILED_LATENCY_MS)
    return values


@dataclass(frozen=True)
class ObjectiveSet:
    """The objectives and the default SLOs of an objectives file."""

    objectives: tuple[Objective, ...]
    slos: tuple[Slo, ...] = ()
    source: str = ""

    @property
    def directions(self) -> list[str]:
        """Optuna study directions, in objective order."""
        return [o.direction for o in self.objectives]

    @property
    def names(self) -> list[str]:
        """Metric names (set on the study so the dashboard shows them)."""
        return [o.metric for o in self.objectives]


def load_objectives(path_or_name: str | Path = "default") -> ObjectiveSet:
    """Read an objectives YAML file (or a bare name from objectives/); AutotuneError on bad input."""
    path = Path(path_or_name)
    if not path.is_file() and path.suffix == "" and path.parent == Path("."):
        path = OBJECTIVES_DIR / f"{path.name}.yaml"
    if not path.is_file():
        not_a_directory(path, "objectives")
        raise AutotuneError(f"objectives file not found: {path_or_name}")
    data = read_yaml(path, "objectives")
    return objectives_from_dict(data, source=str(path))


def objectives_from_dict(data: Any, source: str = "<dict>") -> ObjectiveSet:
    """Build an ObjectiveSet from parsed YAML."""
    if not isinstance(data, dict) or not isinstance(data.get("objectives"), list) or not data["objectives"]:
        raise AutotuneError(
            f"objectives {source}: expected 'objectives:' with a list of {{metric, direction}}"
        )
    unknown = sorted(str(k) for k in data if k not in FILE_KEYS)
    if unknown:
        raise AutotuneError(
            f"objectives {source}: unknown key(s) {', '.join(unknown)} (known: {', '.join(FILE_KEYS)})"
        )
    objectives = []
    for item in data["objectives"]:
        if not isinstance(item, dict) or set(item) != {"metric", "direction"}:
            raise AutotuneError(f"objectives {source}: each objective needs exactly metric and direction")
        if item["metric"] not in METRICS:
            raise AutotuneError(
                f"objectives {source}: unknown metric {item['metric']!r} (e.g. output_throughput)"
            )
        if item["direction"] not in DIRECTIONS:
            raise AutotuneError(f"objectives {source}: direction must be maximize or minimize")
        objectives.append(Objective(metric=item["metric"], direction=item["direction"]))
    if len({o.metric for o in objectives}) != len(objectives):
        raise AutotuneError(f"objectives {source}: a metric is listed twice")
    _check_one_statistic([o.metric for o in objectives], source)
    raw_slos = data.get("slos") or []
    if isinstance(raw_slos, str):
        raw_slos = [raw_slos]
    if not isinstance(raw_slos, list) or not all(isinstance(s, str) for s in raw_slos):
        raise AutotuneError(f"objectives {source}: slos must be a list of SLO strings, e.g. [ttft_p99=2s]")
    try:
        slos = parse_slos(raw_slos)
    except AutotuneError as exc:
        raise AutotuneError(f"objectives {source}: {exc}") from None
    return ObjectiveSet(objectives=tuple(objectives), slos=tuple(slos), source=source)


def _check_one_statistic(metrics: Sequence[str], source: str) -> None:
    """AutotuneError when a latency's median and p50 are both listed: vllm bench serve reports the one
    statistic under both names, so the study would have two identical objectives."""
    for metric in metrics:
        if metric.startswith("p50_") and f"median_{metric.removeprefix('p50_')}" in metrics:
            raise AutotuneError(
                f"objectives {source}: {metric} and median_{metric.removeprefix('p50_')} are one statistic "
                "(median and p50): keep one"
            )


def check_goodput(objectives: ObjectiveSet, slos: Sequence[Slo]) -> None:
    """AutotuneError when an objective is request_goodput (or per GPU) and no SLO bounds ttft, tpot or
    e2el: goodput counts the requests meeting those (`vllm bench serve --goodput`), so without one every
    trial would read 0 and the study could rank nothing."""
    goodput = next((o.metric for o in objectives.objectives if o.metric.startswith("request_goodput")), None)
    if goodput is not None and goodput_bounds(slos) is None:
        raise AutotuneError(
            f"objectives {objectives.source}: {goodput} needs an SLO on {', '.join(GOODPUT_METRICS)} "
            "(--slo or the file's slos), e.g. --slo ttft_p99=2s"
        )


def constraint_keys(slos: Sequence[Slo]) -> list[str]:
    """The constraint names told on every trial, in their fixed order."""
    return [slo.name for slo in slos] + [KEPT_UP_KEY, FAILED_KEY]


def constraints(result: TrialResult, slos: Sequence[Slo]) -> dict[str, float]:
    """Constraint values (<= 0 holds) in the order of `constraint_keys`.

    An early abort keeps its partial metrics: its SLO margins are real, and it is marked infeasible
    even if the partial metrics happen to meet the SLOs (the backend stopped it because they could not).
    """
    values: dict[str, float] = {}
    if result.benchmark is None:
        for slo in slos:
            values[slo.name] = FAILED_SLO_MARGIN
        values[KEPT_UP_KEY] = 1.0
        values[FAILED_KEY] = 1.0
        return values
    for slo in slos:
        values[slo.name] = float(slo.margin(result.benchmark))
    steady = result.load.steady if result.load is not None else None
    if result.capacity is not None:  # a capacity search judged keeping up at its rate (capacity.py)
        values[KEPT_UP_KEY] = 1.0 if result.capacity.kept_up is False else 0.0
    elif steady is not None:
        values[KEPT_UP_KEY] = float(steady.backlog_growth) - float(steady.backlog_allowed)
    else:
        values[KEPT_UP_KEY] = 0.0
    aborted = result.failure == FailureKind.EARLY_ABORT and all(v <= 0 for v in values.values())
    # A capacity search that confirmed no rate found no capacity: its lowest window may read under the
    # limits, too close to them to call (trial/capacity.py), but that is no config meeting the SLOs.
    no_rate = result.capacity is not None and result.capacity.rate <= 0
    failed = result.failure not in (None, FailureKind.EARLY_ABORT) or aborted or no_rate
    values[FAILED_KEY] = 1.0 if failed else 0.0
    return values


def is_feasible(constraint_values: Mapping[str, float]) -> bool:
    """Optuna's rule: every constraint value <= 0."""
    return all(v <= 0 for v in constraint_values.values())
