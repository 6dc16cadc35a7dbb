"""Opening a tuning run's study: create it, or resume it with the same settings, one driver at a time
(autotune/store/lease.py), the trials a dead driver left running failed and charged the GPU time they
held. The study's records and how results are told: autotune/tune/study.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import qualified_name
from autotune.core.config import gpus_per_replica
from autotune.core.errors import AutotuneError
from autotune.core.secrets import masked
from autotune.store.lease import Driver, claim, current_driver, fail_stale, refuse_live_driver
from autotune.store.storage import check_sqlite_file, connect_storage
from autotune.tune.remeasure import charge_dead_repeats
from autotune.tune.study import LAUNCHED_AT_ATTR, SETTINGS_ATTR, StudySettings, has_baseline


class SettingsDiffer(AutotuneError):
    """A study's recorded settings are not this run's (check_resume). `what` is the clause that says what
    differs ("was run with --seed 3, not 0"), kept apart from the advice: a run that did not ask to
    resume says it with its own (open_study)."""

    def __init__(self, name: str, what: str, advice: str) -> None:
        super().__init__(f"study {name!r} {what}: {advice}")
        self.what = what


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

    Resuming refuses a study the storage does not hold (nothing to resume) or one another process
    drives (autotune.store.lease), and fails only the trials nobody runs any more. `results_dir` (the
    run folder): with no study in the storage, results there mean the study was lost, and nothing is
    overwritten (a run never overwrites another run's results). With `driver`, the study's lease is
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
        _refuse_existing(optuna.load_study(study_name=name, storage=storage), where, settings)
    if not exists:
        if results_dir is not None and (results_dir / "trials.csv").exists():
            raise AutotuneError(
                f"no study {name!r} in {where}, but {results_dir} holds its results: the storage was lost "
                "or moved; nothing was changed (pass its --storage, or remove the folder to start over)"
            )
        if resume:
            raise AutotuneError(f"nothing to resume: no study {name!r} in {where}")
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
    record_guide(study, settings)
    previous = current_driver(study)
    if driver is not None:
        claim(study, driver)
    else:
        refuse_live_driver(study)
    charge_dead_driver(study, previous)
    fail_stale(study)
    return study


def _refuse_existing(study: optuna.Study, where: str, settings: StudySettings) -> None:
    """A new run whose study name is taken: --resume continues that study only when its settings are this
    run's (check_resume); when they differ, say what differs and that this run needs another name (the
    advice to add --resume would only lead to that refusal)."""
    name = study.study_name
    try:
        check_resume(study, settings)
    except SettingsDiffer as differ:
        raise AutotuneError(
            f"study {name!r} already exists in {where} and {differ.what}: this run is another study, "
            "pass --study NAME to name it (--resume would be refused)"
        ) from None
    raise AutotuneError(
        f"study {name!r} already exists in {where}: add --resume to continue it or pick --study"
    )


def charge_dead_driver(study: optuna.Study, previous: Driver | None) -> None:
    """The trials a dead driver left RUNNING on a real backend held their GPUs from launch until it
    died: their `gpu_seconds` counts that time up to its last lease renewal (a lower bound; its servers
    die with it), so the budget and the spend on resume count it; its repeats in flight alike
    (remeasure.charge_dead_repeats). Nothing when that is unknown."""
    died = previous.renewed if previous is not None else 0.0
    charge_dead_repeats(study, died)
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


def check_resume(study: optuna.Study, settings: StudySettings) -> None:
    """A resumed study must optimise the same thing (load_study ignores the directions we would pass),
    with the same settings: SettingsDiffer, one line, on the first that differs."""
    directions = [d.name.lower() for d in study.directions]
    if directions != settings.directions or (study.metric_names or []) != settings.objectives:
        raise SettingsDiffer(
            study.study_name,
            f"optimises {study.metric_names} ({', '.join(directions)}), not {settings.objectives}",
            "use the same --objectives or another --study",
        )
    stored = study.user_attrs.get(SETTINGS_ATTR, {})
    if stored.get("space_digest") and stored["space_digest"] != settings.space_digest:
        raise SettingsDiffer(
            study.study_name,
            "was run with another search space (its tuned or fixed flags differ)",
            "resume with the same --space or pick another --study",
        )
    # Studies from before the load was recorded have none (or an empty one): nothing to compare.
    recorded = [key for key in ("slos", "model", "gpu", "workload", "backend") if key in stored]
    keys = recorded + [key for key in ("load", "image") if stored.get(key)]
    # every one that differs, in one line: a user who changed two should not learn of them one by one
    differ = [k for k in keys if not _same_setting(k, stored[k], getattr(settings, k))]
    if differ:
        raise SettingsDiffer(
            study.study_name,
            "was run with " + "; ".join(f"{k} {stored[k]!r}, not {getattr(settings, k)!r}" for k in differ),
            "resume with the same settings or pick another --study",
        )
    _check_same_workload(study.study_name, stored, settings)
    _check_same_seed(study.study_name, stored.get("seed"), settings.seed)
    _check_still_guided(study.study_name, stored, settings)
    _check_same_calibration(study.study_name, stored.get("sim_calibration"), settings)
    _check_same_noise(study.study_name, stored.get("noise"), settings)


def _same_setting(key: str, stored: Any, given: Any) -> bool:
    """Whether a study's recorded setting is this run's: a GPU by the catalog's name, as --gpu resolves
    it (`a100`, `A100` and `A100-80GB` are one GPU; one outside the catalog by its text); a model as
    --model resolves it (a study from before local folders were recorded absolute has the relative path)."""
    if key == "gpu":
        stored, given = _gpu_name(stored), _gpu_name(given)
    if key == "model":
        stored = qualified_name(stored)
    return bool(stored == given)


def _gpu_name(name: str) -> str:
    try:
        return get_gpu(name).name
    except AutotuneError:
        return name


def _check_same_workload(name: str, stored: Mapping[str, Any], settings: StudySettings) -> None:
    """A study's trials measured one workload: a file of the same name edited since (other lengths,
    rates, count or seed) would mix two in one front. Studies from before its content was recorded
    have none: nothing to compare."""
    digest = stored.get("workload_digest")
    if not digest or digest == settings.workload_digest:
        return
    raise SettingsDiffer(
        name,
        f"was run with workload {settings.workload} of other content (its requests, lengths, rate or seed "
        "differ)",
        "resume with the workload it was run with or pick another --study",
    )


def _check_same_seed(name: str, stored: int | None, given: int | None) -> None:
    """A study's trials drew their requests with its --seed: another one would compare configs measured
    on other requests (studies from before the seed was recorded have none: nothing to compare)."""
    if stored is None or stored == given:
        return
    raise SettingsDiffer(
        name,
        f"was run with --seed {stored}, not {given}",
        f"its trials' requests were drawn with it; resume with --seed {stored} or pick another --study",
    )


def _check_still_guided(name: str, stored: Mapping[str, Any], settings: StudySettings) -> None:
    """A guided study continues guided, within a budget when it had one: unguided trials past its budget
    would contradict its guide's files and spend. A larger (or smaller) --gpu-hours is its own budget
    again; a guide added to an unguided study is recorded (record_guide)."""
    budget = stored.get("gpu_hours")
    dropped = settings.guide != "sim" or (budget is not None and settings.gpu_hours is None)
    if stored.get("guide") != "sim" or not dropped:
        return
    if budget is None:
        raise SettingsDiffer(name, "was run with --guide sim", "pass it again")
    raise SettingsDiffer(
        name,
        f"was run with --guide sim --gpu-hours {budget:g}",
        "pass them again (a larger --gpu-hours continues it)",
    )


def record_guide(study: optuna.Study, settings: StudySettings) -> None:
    """A resumed study records the guide and budget it now runs with (a guide added, a budget raised): the
    next resume keeps them."""
    stored = dict(study.user_attrs.get(SETTINGS_ATTR, {}))
    now = {"guide": settings.guide, "gpu_hours": settings.gpu_hours}
    if settings.guide and any(stored.get(key) != value for key, value in now.items()):
        study.set_user_attr(SETTINGS_ATTR, stored | now)


def _check_same_noise(name: str, stored: float | None, settings: StudySettings) -> None:
    """A simulated study measured with one --noise: resuming it with another would mix noisy and
    noise-free measurements in one front (and re-measure them against each other). Studies from before
    the noise was recorded have none: nothing to compare."""
    if stored is None or settings.backend != "sim" or stored == settings.noise:
        return
    raise SettingsDiffer(
        name,
        f"was simulated with --noise {stored:g}, not {settings.noise or 0:g}",
        "resume with the same --noise or pick another --study",
    )


def _check_same_calibration(name: str, stored: Mapping[str, float] | None, settings: StudySettings) -> None:
    """A simulated study's results come from its calibration: resuming it with other constants would mix
    two simulators. (Studies from before calibrations were recorded have none: nothing to compare.)"""
    if not stored or settings.backend != "sim":
        return
    for key in sorted(set(stored) | set(settings.sim_calibration)):
        old, new = stored.get(key), settings.sim_calibration.get(key)
        if old != new:
            raise SettingsDiffer(
                name,
                f"was simulated with {key} = {old}, not {new}",
                "resume with the same --sim-calibration (run.json records its values) or pick another "
                "--study",
            )
