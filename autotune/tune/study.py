"""The Optuna study of a tuning run: create or resume it, tell results, read its records back.

The driver is the only writer (ask/tell). Every trial carries user attrs that the report, the export
and optuna-dashboard read: `config` (the flags), `config_key`, `feasible`, `failure`, `message`,
`log_tail`, `margin_<slo>` (SLO margins), `metrics`, `gpu_seconds`, `info` (the result's typed parts:
autotune/tune/result_attrs.py), and `baseline` / `duplicate_of`. Feasibility is stored as a user attr
too because optuna-dashboard 0.21 does not show 5.0 constraints. The front and the recommendation are
read from the records by autotune/tune/front.py and autotune/tune/recommendation.py.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError
from autotune.core.secrets import masked
from autotune.measure.capacity_report import CapacityReport
from autotune.measure.load_report import LoadReport
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.server_report import ServerReport
from autotune.measure.slo import Slo
from autotune.store.lease import Driver, claim, current_driver, fail_stale, refuse_live_driver
from autotune.store.storage import check_sqlite_file, connect_storage
from autotune.tune.objectives import ObjectiveSet, constraints, failed_values, is_feasible
from autotune.tune.result_attrs import INFO_ATTR, info_attr, parse_info
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, stored as a study user attr."""
        return {**self.__dict__, "sim_calibration": dict(self.sim_calibration)}


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
    def kept_up(self) -> bool | None:
        """Whether the server kept up with the load: the capacity search's verdict, else the window's."""
        if self.capacity is not None:
            return self.capacity.kept_up
        return self.load.kept_up if self.load is not None else None

    def engine_config(self) -> EngineConfig:
        """The trial's flags as an EngineConfig."""
        return config_from_attr(self.config)


def sqlite_url(run_dir: Path) -> str:
    """The default storage of a run: runs/<study>/study.db."""
    return f"sqlite:///{(run_dir / 'study.db').resolve()}"


def open_study(
    name: str,
    storage: str | optuna.storages.BaseStorage,
    settings: StudySettings,
    sampler: optuna.samplers.BaseSampler,
    resume: bool,
    results_dir: Path | None = None,
    driver: Driver | None = None,
) -> optuna.Study:
    """Create a new study, or resume an existing one with the same settings.

    Resuming refuses while another process drives the study (autotune.store.lease) and fails only the
    trials nobody runs any more. `results_dir` (the run folder): with --resume and no study in the
    storage, results there mean the study was lost, and nothing is overwritten; without --resume, they
    mean the same (a run never overwrites another run's results). With `driver`, the study's lease is
    taken for it (atomically: two runs started together cannot both have it) before any stale trial
    is failed.
    """
    # Errors only: Optuna's warnings are about its internals (a locked SQLite read "falling back to a
    # slower alternative", multi-line): what the user must know, autotune says in its own one line.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if isinstance(storage, str):
        check_sqlite_file(storage, resume)
    where, storage = masked(str(storage)), connect_storage(storage)
    exists = name in optuna.study.get_all_study_names(storage)
    if exists and not resume:
        raise AutotuneError(
            f"study {name!r} already exists in {where}: add --resume to continue it or pick --study"
        )
    if not exists:
        if results_dir is not None and (results_dir / "trials.csv").exists():
            raise AutotuneError(
                f"no study {name!r} in {where}, but {results_dir} holds its results: the storage was lost "
                "or moved; nothing was changed (pass its --storage, or remove the folder to start over)"
            )
        if resume:
            print(f"autotune: no study {name!r} to resume; starting it", file=sys.stderr)
        study = optuna.create_study(
            study_name=name, storage=storage, sampler=sampler, directions=settings.directions
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(settings.objectives)
        study.set_user_attr(SETTINGS_ATTR, settings.to_dict())
        if driver is not None:
            claim(study, driver)
        return study
    study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    check_resume(study, settings)
    previous = current_driver(study)
    if driver is not None:
        claim(study, driver)
    else:
        refuse_live_driver(study)
    charge_dead_driver(study, previous)
    fail_stale(study)
    return study


def charge_dead_driver(study: optuna.Study, previous: Driver | None) -> None:
    """The trials a dead driver left RUNNING on a real backend held their GPUs from launch until it
    died: their `gpu_seconds` counts that time up to its last lease renewal (a lower bound; its servers
    die with it), so the budget and the spend on resume count it. Nothing when that is unknown."""
    died = previous.renewed if previous is not None else 0.0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        launched = trial.user_attrs.get(LAUNCHED_AT_ATTR)
        if died and launched is not None and "config" in trial.user_attrs:
            held = max(0.0, died - float(launched)) * gpus_per_replica(trial.user_attrs["config"])
            study._storage.set_trial_user_attr(trial._trial_id, "gpu_seconds", round(held, 3))


def start_study(
    name: str,
    storage: str | optuna.storages.BaseStorage,
    settings: StudySettings,
    sampler: optuna.samplers.BaseSampler,
    resume: bool,
    baseline: Mapping[str, Any] | None,
    results_dir: Path | None = None,
    driver: Driver | None = None,
) -> optuna.Study:
    """`open_study`, then a new study gets `baseline` (vLLM's default config) as its first trial (None:
    the caller orders it, as the guided search does).

    A resumed study already has its baseline (measured, or still queued): it is not enqueued again,
    unless it was interrupted before it was measured.
    """
    study = open_study(name, storage, settings, sampler, resume, results_dir, driver)
    if baseline is None:
        return study
    if not has_baseline(study):
        study.enqueue_trial(dict(baseline), user_attrs={"baseline": True})
    return study


def has_baseline(study: optuna.Study) -> bool:
    """Whether the study's baseline trial is measured, queued or running. One interrupted before it was
    measured (FAIL) does not count: it is queued again, since every result is compared to it."""
    alive = (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
    return any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False, states=alive))


def check_resume(study: optuna.Study, settings: StudySettings) -> None:
    """A resumed study must optimise the same thing (load_study ignores the directions we would pass)."""
    directions = [d.name.lower() for d in study.directions]
    if directions != settings.directions or (study.metric_names or []) != settings.objectives:
        raise AutotuneError(
            f"study {study.study_name!r} optimises {study.metric_names} ({', '.join(directions)}), not "
            f"{settings.objectives}: use the same --objectives or another --study"
        )
    stored = study.user_attrs.get(SETTINGS_ATTR, {})
    for key in ("slos", "model", "gpu", "workload", "backend"):
        if key in stored and stored[key] != getattr(settings, key):
            raise AutotuneError(
                f"study {study.study_name!r} was run with {key} {stored[key]!r}, not "
                f"{getattr(settings, key)!r}: resume with the same settings or pick another --study"
            )
    _check_same_calibration(study.study_name, stored.get("sim_calibration"), settings)


def _check_same_calibration(name: str, stored: Mapping[str, float] | None, settings: StudySettings) -> None:
    """A simulated study's results come from its calibration: resuming it with other constants would mix
    two simulators. (Studies from before calibrations were recorded have none: nothing to compare.)"""
    if not stored or settings.backend != "sim":
        return
    for key in sorted(set(stored) | set(settings.sim_calibration)):
        old, new = stored.get(key), settings.sim_calibration.get(key)
        if old != new:
            raise AutotuneError(
                f"study {name!r} was simulated with {key} = {old}, not {new}: resume with the same "
                "--sim-calibration (run.json records its values) or pick another --study"
            )


def fail_stale_trials(study: optuna.Study, held_gpu_s: Mapping[int, float] | None = None) -> int:
    """Mark this driver's RUNNING trials FAIL (an interrupted run: their results were never told), each
    with the GPU seconds it held (`held_gpu_s` by trial number; 0 when unknown).

    Every RUNNING trial is this driver's: a study has one driver at a time (autotune.store.lease).
    """
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in stale:
        study._storage.set_trial_user_attr(trial._trial_id, "failure", "interrupted")
        held = (held_gpu_s or {}).get(trial.number, 0.0)
        study._storage.set_trial_user_attr(trial._trial_id, "gpu_seconds", round(held, 3))
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    return len(stale)


def config_attr(config: EngineConfig) -> dict[str, Any]:
    """The flags of a config as a JSON-able dict (model first), stored on each trial."""
    return {"model": config.model, **config.params()}


def gpus_per_replica(config: Mapping[str, Any]) -> int:
    """The GPUs one replica of a config takes: its tensor- times pipeline-parallel size."""
    tp = int(config.get("tensor_parallel_size") or 1)
    return tp * int(config.get("pipeline_parallel_size") or 1)


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
    config = config_attr(result.config)
    gpus = gpus_per_replica(config)
    attrs = {
        "config": config,
        "config_key": key,
        "feasible": is_feasible(cons),
        "failure": str(result.failure) if result.failure else None,
        "message": result.message[:500],
        "gpu_seconds": round(result.gpu_seconds * gpus, 3),
        "gpu_seconds_saved": round(result.saved_s * gpus, 3),  # by early abort
        **{f"margin_{slo.name}": round(cons[slo.name], 4) for slo in slos},
    }
    if result.log_tail:
        attrs["log_tail"] = result.log_tail[-LOG_TAIL_CHARS:]
    if result.benchmark is not None:
        attrs["metrics"] = _jsonable(result.benchmark.to_dict())
    info = info_attr(result)
    if info:
        attrs[INFO_ATTR] = _jsonable(info)
    for name, value in attrs.items():
        trial.set_user_attr(name, value)
    if result.benchmark is None:
        values = failed_values(objectives.objectives, slos, _worst_measured(study, objectives))
    else:
        values = [o.value(result) for o in objectives.objectives]
    return study.tell(trial, values)


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
    """Tell a config already measured: the same values, constraints and attrs, plus `duplicate_of`."""
    for name, value in original.constraints.items():
        trial.set_constraint(name, value)
    for name, value in original.user_attrs.items():
        if name not in ("baseline", "duplicate_of"):
            trial.set_user_attr(name, value)
    trial.set_user_attr("duplicate_of", original.number)
    trial.set_user_attr("gpu_seconds", 0.0)
    trial.set_user_attr("gpu_seconds_saved", 0.0)
    return study.tell(trial, original.values)


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every finished (COMPLETE or FAIL) trial, in trial order.

    A trial that failed before it was told (interrupted, or its driver died) has the `config` it was
    launched with (tune/tuner.py), or none when it was not launched yet: then its config is the study's
    model with the params it was given. Its failure is "interrupted".
    """
    out = []
    model = study.user_attrs.get(SETTINGS_ATTR, {}).get("model", "")
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
                margins={k.removeprefix("margin_"): v for k, v in attrs.items() if k.startswith("margin_")},
                baseline=bool(attrs.get("baseline")),
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
