"""The study's finished real trials as the guided search sees them (tune/guided.py): each one's config,
the guide's prediction, what it measured and cost, and its saturation bursts (tune/guide_check.py)."""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from autotune.core.errors import STARTUP_FAILURES
from autotune.tune.guide_budget import Observation
from autotune.tune.result_attrs import INFO_ATTR, bursts
from autotune.tune.space import SearchSpace
from autotune.tune.study import config_key

ATTR = "guide"  # the trial user attr with the guide's prediction when the trial was chosen


def observations(
    study: optuna.Study, space: SearchSpace, predicted: Callable[[str], float | None]
) -> list[Observation]:
    """The study's finished real trials (launched, not duplicates), oldest first, with `predicted(key)`
    the guide's prediction of each; a trial cut short with GPU time spent (tune/tuner.py) too, as
    `interrupted`: the budget counts it, nothing else."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        attrs = t.user_attrs
        if t.state == TrialState.FAIL:
            if float(attrs.get("gpu_seconds", 0.0)) > 0:
                out.append(_interrupted(t, space, predicted))
            continue
        if not attrs.get("launched", True) or "duplicate_of" in attrs or "config_key" not in attrs:
            continue
        key = attrs["config_key"]
        measured = t.values[0] if attrs.get("feasible") and t.values else None
        out.append(
            Observation(
                t.number,
                key,
                dict(t.params),
                predicted(key),
                measured if measured is not None and measured > 0 else None,
                float(attrs.get("gpu_seconds", 0.0)),
                dict(attrs.get(ATTR) or {}),
                attrs.get("failure") not in STARTUP_FAILURES,
                bursts=bursts(attrs.get(INFO_ATTR) or {}),
            )
        )
    return out


def unlaunched_keys(study: optuna.Study) -> set[str]:
    """The configs the study told without launching them: invalid for vLLM, too large for the GPUs, or
    predicted by the run's startup screen not to start (tune/tuner.py). Asked again they would be told
    the same, so the guide does not pick them again (its own memory model may say they start: the
    screen's calibration is the backend's)."""
    return {
        t.user_attrs["config_key"]
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
        if t.user_attrs.get("launched") is False and "config_key" in t.user_attrs
    }


def _interrupted(
    trial: optuna.trial.FrozenTrial, space: SearchSpace, predicted: Callable[[str], float | None]
) -> Observation:
    key = config_key(space.config(trial.params))
    gpu_s, chosen = float(trial.user_attrs["gpu_seconds"]), dict(trial.user_attrs.get(ATTR) or {})
    params, predicted_value = dict(trial.params), predicted(key)
    return Observation(trial.number, key, params, predicted_value, None, gpu_s, chosen, False, True)
