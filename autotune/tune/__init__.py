"""The tuning loop: search space, objectives, samplers, the Optuna study, screening, re-measurement,
the recommendation and the live progress."""

from autotune.tune.objectives import ObjectiveSet, load_objectives
from autotune.tune.recommendation import Recommendation, decide
from autotune.tune.space import SearchSpace, load_space
from autotune.tune.study import TrialRecord, records, start_study
from autotune.tune.tuner import Tuner, TunerOptions

__all__ = [
    "ObjectiveSet",
    "Recommendation",
    "SearchSpace",
    "TrialRecord",
    "Tuner",
    "TunerOptions",
    "decide",
    "load_objectives",
    "load_space",
    "records",
    "start_study",
]
