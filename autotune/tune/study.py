"""The Optuna study of a tuning run: tell results, read its records back (opening it:
autotune/tune/study_open.py).

The driver is the only writer (ask/tell). Every trial carries user attrs that the report, the export
and optuna-dashboard read: `config` (the flags), `config_key`, `feasible`, `failure`, `message`,
`log_tail`, `margin_<slo>` (SLO margins), `metrics`, `gpu_seconds`, `info` (the result's typed parts:
autotune/tune/result_attrs.py), and `baseline` / `duplicate_of`. Feasibility is stored as a user attr
too because optuna-dashboard 0.21 does not show 5.0 constraints. The front and the recommendation are
read from the records by autotune/tune/front.py and autotune/tune/recommendation.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import EngineConfig, gpus_per_replica
from autotune.measure.capacity_report import CapacityReport
from autotune.measure.load_report import LoadReport
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.server_report import ServerReport
from autotune.measure.slo import Slo
from autotune.tune.objectives import ObjectiveSet, constraints, failed_values, is_feasible
from autotune.tune.result_attrs import INFO_ATTR, PLACEMENT_ATTRS, info_attr, parse_info, placement_attrs
from autotune.tune.space import plain_params

LOG_TAIL_CHARS = 2000
SETTINGS_ATTR = "autotune"
LAUNCHED_AT_ATTR = "launched_at"  # a real-backend trial's launch, time.time(): what a dead driver's held


@dataclass(frozen=True)
class StudySettings:
    """What defines a study; a resumed study must have the same."""

    objectives: list[str]
    directions: list[str]
    slos: list[str]
    model: str
    gpu: str
    workload: str
    backend: str
    # The simulator's constants (every value, not a file name): what a sim run's results came from,
    # and what a real run's estimates and screen used.
    sim_calibration: dict[str, float] = field(default_factory=dict)
    load: str = ""  # how each config is measured: capacity or fixed (empty: not recorded)
    space_digest: str = ""  # SearchSpace.digest(): the flags tuned and fixed (empty: not recorded)
    workload_digest: str = ""  # workload_digest(): the requests' content (empty: not recorded)
    noise: float | None = None  # the simulated backend's --noise (None: not recorded)
    guide: str = ""  # "sim": a guided run, "none": not (empty: not recorded)
    gpu_hours: float | None = None  # a guided run's --gpu-hours (None: no budget, or not recorded)
    seed: int | None = None  # --seed: the sampler's and the requests' (None: not recorded)
    # vLLM's own defaults of the tuned flags the space does not allow (SearchSpace.moved_defaults): the
    # baseline trial took the nearest allowed values instead (empty: none moved, or not recorded).
    baseline_moved: dict[str, Any] = field(default_factory=dict)
    # The docker backend's --image: what the trials ran, and what `export` deploys (empty: another
    # backend, or not recorded).
    image: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, stored as a study user attr (an image only where there is one)."""
        data = {
            **self.__dict__,
            "sim_calibration": dict(self.sim_calibration),
            "baseline_moved": dict(self.baseline_moved),
        }
        if not self.image:
            del data["image"]
        return data


@dataclass
class TrialRecord:
    """A finished trial as the report and the export see it."""

    number: int
    state: str
    values: list[float] | None
    params: dict[str, Any]
    config: dict[str, Any]
    feasible: bool
    failure: str | None = None
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    margins: dict[str, float] = field(default_factory=dict)
    baseline: bool = False
    # the baseline's: vLLM's own defaults of the flags the space moved (StudySettings.baseline_moved)
    vllm_defaults: dict[str, Any] = field(default_factory=dict)
    duplicate_of: int | None = None
    gpu_seconds: float = 0.0
    gpu_seconds_saved: float = 0.0  # what early abort spared this trial
    user_attrs: dict[str, Any] = field(default_factory=dict)
    launched: bool = True  # False: told before launch (invalid, screened, or no longer fits the GPUs)
    screened: bool = False  # predicted by the memory model to fail to start (not launched)
    # The result's typed parts, parsed once from the attrs (autotune/tune/result_attrs.py).
    server: ServerReport | None = None
    load: LoadReport | None = None
    capacity: CapacityReport | None = None
    placement: Placement | None = None
    info: dict[str, Any] = field(default_factory=dict)  # the `info` attr as stored (best.json copies it)

    @property
    def status(self) -> str:
        """ "feasible", or why not in a few words (unmet_reason)."""
        return (
            "feasible"
            if self.feasible
            else unmet_reason(self.failure, self.margins, self.capacity, self.kept_up)
        )

    @property
    def measured(self) -> bool:
        """Whether its values and metrics were measured: False for a failure before any request completed,
        whose values are placeholders (the sampler's for a config that never ran; vLLM's 0 req/s and 0 ms
        percentiles of nothing for a server that died before a request finished)."""
        return self.failure is None or bool(self.metrics.get("completed"))

    @property
    def kept_up(self) -> bool | None:
        """Whether the server kept up with the load: the capacity search's verdict, else the window's."""
        if self.capacity is not None:
            return self.capacity.kept_up
        return self.load.kept_up if self.load is not None else None

    def engine_config(self) -> EngineConfig:
        """The trial's flags as an EngineConfig."""
        return config_from_attr(self.config)


NO_RATE = "no rate confirmed"


def margins_of(attrs: Mapping[str, Any]) -> dict[str, float]:
    """A told trial's SLO margins ((value - limit) / limit, by SLO name) from its user attrs."""
    return {k.removeprefix("margin_"): v for k, v in attrs.items() if k.startswith("margin_")}


def unmet_reason(
    failure: str | None, margins: Mapping[str, float], capacity: CapacityReport | None, kept_up: bool | None
) -> str:
    """Why an infeasible trial is: its failure, else an SLO its window missed, else not keeping up, else
    (NO_RATE) a capacity search whose lowest window met every SLO too narrowly to call at its confidence:
    its margins read under the limits, yet it confirmed no rate (tune/objectives.py, constraints)."""
    if failure:
        return failure
    if kept_up is False:  # the pace is the cause: latencies of a growing queue miss their SLOs too
        return "did not keep up"
    if any(m > 0 for m in margins.values()):
        return "violates SLO"
    if capacity is not None and capacity.rate <= 0:
        return f"{NO_RATE} (its lowest rate too close to the SLOs to call)"
    return "violates SLO"


def has_baseline(study: optuna.Study) -> bool:
    """Whether the study's baseline trial is measured, queued or running. One interrupted before it was
    measured (FAIL) does not count: it is queued again, since every result is compared to it."""
    alive = (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
    return any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False, states=alive))


def fail_stale_trials(
    study: optuna.Study,
    held_gpu_s: Mapping[int, float] | None = None,
    placements: Mapping[int, Placement] | None = None,
) -> int:
    """Mark this driver's RUNNING trials FAIL (an interrupted run: their results were never told), each
    with the GPU seconds it held (`held_gpu_s` by trial number; 0 when unknown) and where it ran
    (`placements`, when known).

    Every RUNNING trial is this driver's: a study has one driver at a time (autotune.store.lease).
    """
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in stale:
        study._storage.set_trial_user_attr(trial._trial_id, "failure", "interrupted")
        held = (held_gpu_s or {}).get(trial.number, 0.0)
        study._storage.set_trial_user_attr(trial._trial_id, "gpu_seconds", round(held, 3))
        where = (placements or {}).get(trial.number)
        for name, value in (placement_attrs(where) if where is not None else {}).items():
            study._storage.set_trial_user_attr(trial._trial_id, name, value)
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    return len(stale)


def config_attr(config: EngineConfig) -> dict[str, Any]:
    """The flags of a config as a JSON-able dict (model first), stored on each trial."""
    return {"model": config.model, **config.params()}


def held_gpu_seconds(since: float, config: Mapping[str, Any]) -> float:
    """The GPU time a server of `config` launched at `since` (time.monotonic()) has held until now: on a
    real backend a run cut short spent it, though it measured nothing."""
    return (time.monotonic() - since) * gpus_per_replica(config)


def config_from_attr(attr: Mapping[str, Any]) -> EngineConfig:
    """Inverse of `config_attr`."""
    values = dict(attr)
    return EngineConfig(model=values.pop("model")).replace(**values)


def config_key(config: EngineConfig) -> str:
    """Identity of a config for dedupe (the resolved flags, sorted)."""
    return json.dumps(config_attr(config), sort_keys=True, default=str)


def tell_result(
    study: optuna.Study,
    trial: optuna.Trial,
    result: TrialResult,
    objectives: ObjectiveSet,
    slos: Sequence[Slo],
    key: str,
) -> FrozenTrial:
    """Tell one evaluated config: constraints in fixed order, user attrs, then the objective values."""
    cons = constraints(result, slos)
    for name, value in cons.items():
        trial.set_constraint(name, value)
    attrs = _result_attrs(result, key)
    attrs["feasible"] = is_feasible(cons)
    attrs |= {f"margin_{slo.name}": round(cons[slo.name], 4) for slo in slos}
    for name, value in attrs.items():
        trial.set_user_attr(name, value)
    if result.benchmark is None:
        values = failed_values(objectives.objectives, slos, _worst_measured(study, objectives))
    else:
        values = [o.value(result) for o in objectives.objectives]
    return study.tell(trial, values)


def tell_cut_short(study: optuna.Study, trial: optuna.Trial, result: TrialResult, key: str) -> FrozenTrial:
    """Tell a trial the run's budget cut short before it reached a verdict (FailureKind.BUDGET_SPENT):
    FAIL, like an interrupted one (no sampler learns from it, the budget counts its GPU time), with what
    it measured kept in its attrs."""
    for name, value in _result_attrs(result, key).items():
        trial.set_user_attr(name, value)
    return study.tell(trial, state=TrialState.FAIL)


def _result_attrs(result: TrialResult, key: str) -> dict[str, Any]:
    """A result's user attrs: its config, failure, GPU time, server log tail, metrics and typed parts."""
    config = config_attr(result.config)
    gpus = gpus_per_replica(config)
    attrs = {
        "config": config,
        "config_key": key,
        "failure": str(result.failure) if result.failure else None,
        "message": result.message[:500],
        "gpu_seconds": round(result.gpu_seconds * gpus, 3),
        "gpu_seconds_saved": round(result.saved_s * gpus, 3),  # by early abort
    }
    if result.log_tail:
        attrs["log_tail"] = result.log_tail[-LOG_TAIL_CHARS:]
    if result.benchmark is not None:
        attrs["metrics"] = _jsonable(result.benchmark.to_dict())
    info = info_attr(result)
    if info:
        attrs[INFO_ATTR] = _jsonable(info)
    return attrs


def _worst_measured(study: optuna.Study, objectives: ObjectiveSet) -> dict[str, float]:
    """The highest value of each minimized objective among the study's measured trials."""
    worst: dict[str, float] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if not t.values or "metrics" not in t.user_attrs:
            continue
        for objective, value in zip(objectives.objectives, t.values, strict=False):
            if not objective.maximize:
                worst[objective.metric] = max(worst.get(objective.metric, value), value)
    return worst


def tell_duplicate(study: optuna.Study, trial: optuna.Trial, original: FrozenTrial) -> FrozenTrial:
    """Tell a config already measured: the same values, constraints and attrs, plus `duplicate_of`; not
    where and when the original ran (a duplicate is launched nowhere)."""
    for name, value in original.constraints.items():
        trial.set_constraint(name, value)
    for name, value in original.user_attrs.items():
        if name == INFO_ATTR:
            value = {k: v for k, v in value.items() if k not in (*PLACEMENT_ATTRS, "ran_at")}
        if name not in ("baseline", "duplicate_of", *PLACEMENT_ATTRS):
            trial.set_user_attr(name, value)
    trial.set_user_attr("duplicate_of", original.number)
    trial.set_user_attr("gpu_seconds", 0.0)
    trial.set_user_attr("gpu_seconds_saved", 0.0)
    if original.state == TrialState.FAIL:  # cut short by the budget (tell_cut_short): no values to copy
        return study.tell(trial, state=TrialState.FAIL)
    return study.tell(trial, original.values)


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every finished (COMPLETE or FAIL) trial, in trial order.

    A trial that failed before it was told (interrupted, or its driver died) has the `config` it was
    launched with (tune/tuner.py), or none when it was not launched yet: then its config is the study's
    model with the params it was given. Its failure is "interrupted".
    """
    out = []
    settings = study.user_attrs.get(SETTINGS_ATTR, {})
    model, moved = settings.get("model", ""), dict(settings.get("baseline_moved") or {})
    for t in study.get_trials(deepcopy=False):
        if t.state not in (TrialState.COMPLETE, TrialState.FAIL):
            continue
        attrs = t.user_attrs
        if "config" not in attrs:
            if t.state != TrialState.FAIL:
                continue
            attrs = {"config": {"model": model, **plain_params(t.params)}, "failure": "interrupted", **attrs}
        stored = parse_info(attrs)
        out.append(
            TrialRecord(
                number=t.number,
                state=t.state.name,
                values=list(t.values) if t.values else None,
                params=plain_params(t.params),  # 0.95, not Optuna's 0.9500000000000001
                config=dict(attrs["config"]),
                feasible=t.state == TrialState.COMPLETE and bool(attrs.get("feasible")),
                failure=attrs.get("failure"),
                message=attrs.get("message", ""),
                metrics=dict(attrs.get("metrics", {})),
                margins=margins_of(attrs),
                baseline=bool(attrs.get("baseline")),
                vllm_defaults=moved if attrs.get("baseline") else {},
                duplicate_of=attrs.get("duplicate_of"),
                gpu_seconds=float(attrs.get("gpu_seconds", 0.0)),
                gpu_seconds_saved=float(attrs.get("gpu_seconds_saved", 0.0)),
                user_attrs=dict(attrs),
                launched=bool(attrs.get("launched", True)),
                screened=bool(attrs.get("screened")),
                server=stored.server,
                load=stored.load,
                capacity=stored.capacity,
                placement=stored.placement,
                info=dict(attrs.get(INFO_ATTR) or {}),
            )
        )
    return out


def _jsonable(data: Mapping[str, Any]) -> dict[str, Any]:
    """Round floats and drop values JSON cannot hold (storage keeps user attrs as JSON)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, float):
            out[key] = round(value, 4) if value == value and abs(value) != float("inf") else None
        elif isinstance(value, (int, str, bool)) or value is None:
            out[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str)) for v in value):
            out[key] = list(value)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, Mapping) for v in value):
            out[key] = [_jsonable(v) for v in value]  # e.g. capacity_probes: the report plots them
        elif isinstance(value, dict):
            out[key] = _jsonable(value)
        else:
            out[key] = str(value)
    return out
