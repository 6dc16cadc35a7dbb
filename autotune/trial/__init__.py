"""One trial: a config's capacity search (probes on one started server) and its Ray task."""

from autotune.trial.capacity import find_capacity
from autotune.trial.task import evaluate_trial, run_trial_task

__all__ = ["evaluate_trial", "find_capacity", "run_trial_task"]
