"""The tuning loop: search space, objectives, samplers, the Optuna study, screening, re-measurement,
the recommendation and the live progress; the guide (the simulated engine's prediction of a space)."""

from autotune.tune.guide import GuideTable, Prediction, predict_space
from autotune.tune.objectives import ObjectiveSet, load_objectives
from autotune.tune.recommendation import Recommendation, decide
from autotune.tune.run_records import TunerOptions
from autotune.tune.space import SearchSpace, load_space
from autotune.tune.study import TrialRecord, records
from autotune.tune.study_open import start_study
from autotune.tune.tuner import Tuner

__all__ = [
    "GuideTable",
    "ObjectiveSet",
    "Prediction",
    "Recommendation",
    "SearchSpace",
    "TrialRecord",
    "Tuner",
    "TunerOptions",
    "decide",
    "load_objectives",
    "load_space",
    "predict_space",
    "records",
    "start_study",
]
