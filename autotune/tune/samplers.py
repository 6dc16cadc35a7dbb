"""The samplers `--sampler` names: which Optuna sampler proposes the next config.

`auto` is the default, chosen by benchmarks/sample_efficiency.py; the others are Optuna's, set up for an
ask/tell loop with a trial budget (autotune/tune/tuner.py asks, the study tells).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import optuna

from autotune.core.errors import AutotuneError

SAMPLERS = ("auto", "tpe", "gp", "nsga2", "random", "grid")
GP_MODULES = ("torch", "scipy.optimize", "scipy.stats")  # what optuna's GPSampler imports when sampling


def auto_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """The default sampler (`--sampler auto`); one place to change when the benchmark picks another.

    Multivariate TPE: handles mixed int/float/categorical spaces, reads 5.0 constraints (infeasible
    trials are ranked by their summed violation), and `constant_liar` keeps parallel workers apart.
    From benchmarks/sample_efficiency.py (6 scenarios x 10 seeds): 5 random trials after the baseline
    and 64 EI candidates reach 98 % of the grid's best in a median 9 trials with startup screening
    (9.5 without), against 13 for a 2-per-parameter start with 24 candidates and 10 for random search.
    """
    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, constant_liar=True, n_startup_trials=5, n_ei_candidates=64
    )


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler for an ask/tell loop.

    GridSampler calls `study.stop()` once every grid point has been tried, which raises outside
    `study.optimize`; the tuner asks `sampler_exhausted(study)` instead and stops asking.
    """

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:  # noqa: D102
        return None

    def all_started(self, study: optuna.Study) -> bool:
        """Whether every grid point has a trial, finished or running: asked again, the grid would
        propose a running point (with trials in parallel, a duplicate to wait on)."""
        started = {
            t.system_attrs["grid_id"]
            for t in study._storage.get_all_trials(study._study_id, deepcopy=False)
            if "grid_id" in t.system_attrs
            and self._same_search_space(t.system_attrs["search_space"])
            and (t.state.is_finished() or t.state == optuna.trial.TrialState.RUNNING)
        }
        return started >= set(range(len(self._all_grids)))


def sampler_exhausted(study: optuna.Study) -> bool:
    """True when the study's sampler has nothing new left to propose (every grid point asked)."""
    sampler = study.sampler
    if isinstance(sampler, AskTellGridSampler):
        return sampler.all_started(study)
    return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study)


def missing_gp_dependency() -> str | None:
    """The first module GPSampler needs that cannot be imported, or None.

    GPSampler imports them lazily: it constructs fine without them and fails at the first sample.
    """
    for module in GP_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            return module
    return None


def fallback_note(name: str) -> str | None:
    """What `make_sampler` uses instead of `name` when a dependency is missing, in words (None: `name`)."""
    missing = missing_gp_dependency() if name == "gp" else None
    if missing is None:
        return None
    return (
        f"the gp sampler needs PyTorch and SciPy (pip install torch scipy), {missing} is missing; using "
        "tpe instead"
    )


def continued_seed(seed: int | None, held: int) -> int | None:
    """The sampler's seed for a study that already holds `held` trials: a resumed run continues past the
    draws its earlier runs made instead of replaying them (a random sampler re-proposed 4 of the 5 configs
    it had measured, each a duplicate); still reproducible for one seed and one study."""
    return None if seed is None else (seed + held) % 2**32


def make_sampler(
    name: str, grid: Mapping[str, list[Any]], seed: int | None, n_trials: int
) -> optuna.samplers.BaseSampler:
    """The sampler for `--sampler NAME` (`grid` needs the discretized space)."""
    if name == "auto":
        return auto_sampler(seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "gp":
        if missing_gp_dependency():  # said once by the run (`fallback_note`)
            return make_sampler("tpe", grid, seed, n_trials)
        return optuna.samplers.GPSampler(seed=seed)
    if name == "nsga2":
        # A generation of a quarter of the budget (8..50): Optuna's default of 50 would be all random.
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(8, min(50, n_trials // 4)))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return AskTellGridSampler(dict(grid), seed=seed)
    raise AutotuneError(f"unknown sampler {name!r} (use {', '.join(SAMPLERS)})")
