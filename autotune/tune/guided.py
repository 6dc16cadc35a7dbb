"""Guided search: real trials chosen from the guide's whole-space prediction, corrected by what the real
trials measured so far, within a GPU-hour budget and with an honest stop (docs/guided-search.md).

The guide (tune/guide.py) predicts every grid config on the simulator, in CPU seconds. After each
real trial its speed factor is refitted to every measurement and the space re-predicted when it moved
(tune/guide_refit.py). Each real trial's objective value then gives a residual log(measured /
predicted); a Gaussian process over the
configs' features (tune/guide_residual.py) spreads it over the space: corrected prediction =
predicted x exp(posterior mean), its uncertainty the posterior sd. The next trial is the untried
config with the highest expected improvement over the incumbent (the best measured value as the model
believes it, after the measurement's learned noise; the highest corrected prediction once the budget
affords at most EXPLOIT_LEFT more trials). Trial #0 is the guide's best prediction and
vLLM's defaults come second (every result is compared to them): where the guide ranks well the first
trial is already the answer, and the defaults, often the dearest search of all (a low capacity is a
long window), no longer stand before it (docs/guided-search.md). The run stops when
- the next trial would pass `--gpu-hours` (tune/guide_budget.py: the dearest trial so far, scaled to its
  predicted rate; trials still running are charged the same), or
- no untried config's 95 % upper bound beats the incumbent by more than the measurement's
  resolution (the guide predicts nothing better is left); the bound is the residual model's, or, once
  the guide's model replays every measured trial's saturation bursts (tune/guide_check.py), for a
  config within the batches measured the guide's own: its prediction corrected by the trials' common
  level (their residuals there are the GPU's speed and the measurement's noise), plus the fast
  estimate's error unless searched in full; where only that error keeps the run going, the configs it
  covers are searched in full on the simulator (CPU-seconds, `_settle`), or
- every config the guide predicts to meet the SLOs was measured.
Trials live in the Optuna study (the chosen params are enqueued, with the prediction as a user attr),
and the state is rebuilt from the study's finished trials at every step, so `--resume` needs nothing else.
The real measurement alone gives a config's verdict: the guide only decides what to measure.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune.core.config import gpus_per_replica
from autotune.trial.task import SearchPlan
from autotune.tune.guide import GuideTable, Prediction
from autotune.tune.guide_belief import GuideBelief
from autotune.tune.guide_budget import Budget, Observation
from autotune.tune.guide_check import BurstCheck
from autotune.tune.guide_features import grid_positions
from autotune.tune.guide_observed import ATTR, unlaunched_keys
from autotune.tune.guide_options import GuidedOptions
from autotune.tune.guide_refit import Refit
from autotune.tune.guide_residual import expected_improvement
from autotune.tune.objectives import Objective
from autotune.tune.space import SearchSpace
from autotune.tune.study import config_key, has_baseline

HINT_BELOW = 0.1  # a bracketed search's first probe: at most this far (log) below the corrected capacity
MIN_MEASURED = 2  # the guide's first pick and the defaults, at least, before the stop rule may end a run
# With this many trials or fewer left in the budget (this one included) the pick is the corrected mean's
# best: what exploration would teach has no trial left to pay off (the 70B case,
# docs/guided-search-evidence.md)
EXPLOIT_LEFT = 2
# Untried configs searched in full on the simulator per step, where the fast estimate's error alone keeps the
# stop from ending the run (_settle): CPU-seconds each, against a GPU trial's hours
SETTLE_MAX = 64


class GuidedSearch(GuideBelief):
    """Chooses the next real trial from what the guide believes of each config (module docstring)."""

    def __init__(
        self,
        table: GuideTable,
        space: SearchSpace,
        objective: Objective,
        options: GuidedOptions = GuidedOptions(),  # noqa: B008 (frozen)
        extra: Mapping[str, Prediction] | None = None,
        refit: Refit | None = None,
        baseline: Mapping[str, Any] | None = None,
    ) -> None:
        """`baseline`: vLLM's default params, which the search enqueues after its first pick (None: the
        study holds them already, or the run compares with nothing)."""
        super().__init__(table, space, objective, options, extra)
        self.refit = refit  # None: the guide keeps its calibration, the residual model alone corrects it
        self.baseline = dict(baseline) if baseline is not None else None
        # the pre-run estimate is vLLM's defaults' search: a pick is charged it scaled by their predictions
        self.budget = Budget(
            options.gpu_hours, options.first_trial_gpu_s, objective.maximize, self._defaults_value()
        )
        self.stop_reason: str | None = None
        # The stop holds but trials still run: start nothing more, and decide once their measurements
        # are in (one may move the guide's speed, and with it the bound)
        self.holding = False
        self.bursts = BurstCheck()  # the measured trials' bursts replayed (tune/guide_check.py)

    def hint_rate(self, trial: optuna.Trial) -> float | None:
        """The capacity (req/s) the guide predicted, corrected, when it chose `trial`: its capacity
        search brackets it (CapacitySearch.hint_rate). None: not the guide's pick, or bracketing off."""
        attrs = trial.user_attrs.get(ATTR) or {}
        rate = attrs.get("rate") if self.options.bracket else None
        if not rate:
            return None
        # One sd below (at most HINT_BELOW): a probe at the predicted capacity is the threshold itself,
        # too close to call, and one above it steps down through failing windows; below, a clear pass.
        return float(rate) * math.exp(-min(float(attrs.get("sd", 0.0)), HINT_BELOW))

    def plan(
        self, study: optuna.Study, trial: optuna.Trial, spent_s: float, reserved_s: float | None, slots: int
    ) -> SearchPlan:
        """What `trial`'s capacity search starts from (hint_rate) and may spend per GPU: its share of the
        budget (Budget.trial_cap_s) among the `slots` trials of its size that may start now and the
        budget affords, or alone where the budget waits for its cost before starting another."""
        hint = self.hint_rate(trial)
        if self.options.gpu_hours is None:
            return SearchPlan(hint)
        observed = self.observations(study)
        # free GPUs beyond what the budget affords start nothing: they must not halve this trial's share
        affordable = self.budget.trials_left(observed, None, reserved_s=reserved_s or 0.0)
        sharing = 1 if self.budget.waits(observed, 1) else max(1, int(min(slots, affordable)))
        cap_s = self.budget.trial_cap_s(spent_s, reserved_s or 0.0, sharing) or 0.0
        gpus = gpus_per_replica(self.space.config(trial.params).params())
        return SearchPlan(hint, cap_s / gpus)

    # -- choosing and stopping ------------------------------------------------------------------------
    def step(
        self, study: optuna.Study, busy: Collection[str] = (), reserved_s: float | None = None
    ) -> str | None:
        """Enqueue the next config to measure, or return why the run stops. Nothing is enqueued while a
        trial waits in the study (the defaults, or an earlier pick not yet asked), nor while the stop
        holds with trials running (`holding`: it is decided once they end). `reserved_s`: the
        running trials' budget caps (tune/guide_budget.py), charged instead of a next trial's each."""
        self.holding = False
        if any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
            return None
        observed = self.observations(study)
        # before the stop rule: with nothing left to spend, the budget is why the run ends
        self.stop_reason = self.budget.spent_out(observed)
        if self.stop_reason:
            return self.stop_reason
        if self.refit is not None and self._recalibrate(observed):
            observed = self.observations(study)  # residuals against the re-predicted space
        due = self._defaults_due(study, bool(observed or busy))
        if due and self._enqueue_defaults(study, observed, len(busy), reserved_s) is None:
            return None  # the defaults go next (ones the budget cannot afford are left out: a pick instead)
        self.stop_reason = self._choose(study, observed, set(busy), reserved_s)
        return self.stop_reason

    def waits(self, study: optuna.Study, busy: int, reserved_s: float | None = None) -> bool:
        """Whether to start nothing more until one of the `busy` running trials ends (Budget.waits)."""
        return self.budget.waits(self.observations(study), busy, reserved_s)

    @property
    def baseline_key(self) -> str | None:
        """The config key of vLLM's defaults (None: the search does not enqueue them)."""
        return config_key(self.space.config(self.baseline)) if self.baseline is not None else None

    def _defaults_due(self, study: optuna.Study, started: bool) -> bool:
        """The defaults go next: the first pick has started and the study has no baseline trial
        (study.has_baseline: one interrupted before it was measured is queued again)."""
        return self.baseline is not None and started and not has_baseline(study)

    def _enqueue_defaults(
        self, study: optuna.Study, observed: Sequence[Observation], busy: int, reserved_s: float | None
    ) -> str | None:
        """Enqueue vLLM's defaults (None), or say why the budget cannot afford them. A low predicted
        capacity is a long search: defaults the budget cannot afford are left out, and the run goes on
        with the picks it can afford rather than ending with budget unspent (the summary says what they
        would cost: `defaults_over_budget`)."""
        over_budget = self.budget.stop(observed, self._defaults_value(), busy, "vLLM's defaults", reserved_s)
        if over_budget:
            return over_budget
        study.enqueue_trial(dict(self.baseline or {}), user_attrs={"baseline": True}, skip_if_exists=False)
        return None

    def _defaults_value(self) -> float | None:
        """vLLM's defaults' value as the guide predicts it now (None: not predicted to meet the SLOs)."""
        return self.raw(self.prediction(self.baseline_key)) if self.baseline_key is not None else None

    def defaults_over_budget(self, study: optuna.Study) -> float | None:
        """What the budget would charge vLLM's defaults now, in GPU-hours, when that is more than it has
        left (None: it affords them, or there is no budget)."""
        observed = self.observations(study)
        if not self.budget.stop(observed, self._defaults_value(), 0):
            return None
        return self.budget.next_cost_s(observed, self._defaults_value()) / 3600

    def _recalibrate(self, observed: Sequence[Observation]) -> bool:
        """Refit the guide's speed factor to every measurement; re-predict the space when it moved."""
        assert self.refit is not None
        measured = [(o.key, o.params, o.measured) for o in observed if o.measured is not None]
        index = self.refit.fit(measured, near=self.index)  # type: ignore[arg-type]
        if index == self.index:
            return False
        self.index = index
        table, extra = self._base
        if index != 0:
            points = self.refit.points(index, [p.params for p in extra.values()])
            table, extra = self.refit.table(index), {p.key: p for p in points}
        self.use_table(table, extra)
        return True

    def _choose(
        self, study: optuna.Study, observed: Sequence[Observation], busy: set[str], reserved_s: float | None
    ) -> str | None:
        tried = {o.key for o in observed if not o.interrupted} | busy | unlaunched_keys(study)
        free = self._free(tried)
        if not free:
            return self._none_left(study, observed, busy)
        worst = (
            self.bursts.verdict(observed, self.refit, self.index, MIN_MEASURED)
            if self.options.check_bursts
            else None
        )
        model = self.model(observed)
        # an adequate model's residuals within the bursts' batches: its speed level and the noise
        level = self.model(observed, local=False) if worst is not None and self.options.level else None
        mean, sd = self.believed(observed, free, model, level)
        best = self.incumbent(observed, level or model)
        stoppable = best is not None and len(observed) >= MIN_MEASURED
        error = self._base[0].estimate_error()
        if worst is not None and stoppable and self._settle(observed, free, mean, best, error):  # type: ignore[arg-type]
            free = self._free(tried)
            if not free:
                return self._none_left(study, observed, busy)
            mean, sd = self.believed(observed, free, model, level)
        upper = self._upper(observed, free, mean, sd, error if worst is not None else None)
        bound = float(np.max(upper))  # the best any untried config may be (95 %)
        if stoppable:
            target = best + math.log1p(self.options.resolution)  # type: ignore[operator]
            if bound < target and busy:
                self.holding = True
                return None
            if bound < target:
                checked = f", fitting every trial's bursts ({worst.shape:.1%} RMS)," if worst else ""
                return (
                    f"the guide{checked} predicts no untried config beats the best measured by more than "
                    f"{self.options.resolution:.0%} (95 % bound {math.exp(self.sign * bound):,.1f}; "
                    f"{self._incumbent_text(observed, best)}{self._settled_text()})"  # type: ignore[arg-type]
                )
        left = self.budget.trials_left(observed, math.exp(self.sign * float(np.max(mean))), len(busy))
        exploit = best is None or left <= EXPLOIT_LEFT
        scores = mean if exploit else expected_improvement(mean, sd, best)  # type: ignore[arg-type]
        tolerance = math.log1p(self.options.resolution) if exploit and self.options.resolution_ties else 0.0
        pick = free[self._argmax(scores, free, tolerance)]
        chosen = self.candidates[pick]
        at = free.index(pick)
        corrected = math.exp(self.sign * mean[at])
        over_budget = self.budget.stop(observed, corrected, len(busy), reserved_s=reserved_s)
        if over_budget:
            return over_budget + self._outlook(bound, best, observed)
        attrs = {"predicted": round(corrected, 4), "raw": round(self.own_prediction(chosen.key) or 0.0, 4)}
        attrs["speed_factor"] = round(self.refit.factor(self.index), 4) if self.refit else 1.0
        attrs["by"] = "best predicted" if exploit else "expected improvement"
        attrs["sd"] = round(float(sd[at]), 4)
        if self.objective.maximize and chosen.capacity_rate > 0:
            # the corrected capacity: a throughput scales with the rate (a capacity search's hint_rate)
            attrs["rate"] = round(chosen.capacity_rate * corrected / (self.raw(chosen) or corrected), 4)
        user_attrs: dict[str, Any] = {ATTR: attrs}
        if chosen.key == self.baseline_key and self._defaults_due(study, True):
            user_attrs["baseline"] = True  # the guide's pick is vLLM's defaults: they are measured once
        study.enqueue_trial(dict(chosen.params), user_attrs=user_attrs, skip_if_exists=False)
        return None

    def _none_left(self, study: optuna.Study, observed: Sequence[Observation], busy: set[str]) -> str | None:
        """Why the run stops with no untried candidate; where the guide predicts none meets the SLOs and
        nothing was measured, vLLM's defaults are enqueued instead (None): that verdict is a real
        measurement's to give, and one that meets them refits the guide's speed."""
        if self.candidates:
            return "every config the guide predicts to meet the SLOs has been measured"
        if not observed and not busy and self._defaults_due(study, True):
            return self._enqueue_defaults(study, observed, 0, None)
        defaults = [o for o in observed if o.key == self.baseline_key and not o.interrupted]
        confirmed = (
            "; vLLM's defaults, measured, meet none either" if defaults and not defaults[0].measured else ""
        )
        return (
            f"the guide predicts no config of the space meets the SLOs{confirmed} (at the speed the "
            "measurements show): loosen the SLOs, or widen the space"
        )

    def _free(self, tried: Collection[str]) -> list[int]:
        """The candidates not measured nor running, that the guide predicts to meet the SLOs."""
        return [
            i
            for i, p in enumerate(self.candidates)
            if p.key not in tried and self.raw(self.prediction(p.key)) is not None
        ]

    def _upper(
        self,
        observed: Sequence[Observation],
        free: Sequence[int],
        mean: np.ndarray,
        sd: np.ndarray,
        error: float | None,
    ) -> np.ndarray:
        """Each untried config's 95 % upper bound (sign-adjusted log). When the guide's model is
        adequate (its replay of every measured trial's bursts: tune/guide_check.py), the residual
        model's prior, which stands for what the model may lack, no longer bounds a config whose
        predicted requests in flight at capacity are within the batch the measured bursts held: the
        guide's own estimate error does (none for a config searched in full, the fast estimate's measured
        spread `error` for the others; None: the model is not adequate, or that spread is unknown)."""
        upper = mean + self.options.z * sd
        if error is None:
            return upper
        for at in self.within_reach(observed, free):
            key = self.candidates[free[at]].key
            upper[at] = mean[at] + self.options.z * (0.0 if self.searched_in_full(key) else error)
        return upper

    def _settle(
        self,
        observed: Sequence[Observation],
        free: Sequence[int],
        mean: np.ndarray,
        best: float,
        error: float | None,
    ) -> bool:
        """With the guide's model adequate, search in full on the simulator (at the refitted speed) the
        untried configs within the bursts' batch that only the fast estimate's error keeps above the stop's
        target (`error`: the fast estimate's measured spread): the best SETTLE_MAX of them. False: none to
        search (or no refit to search with)."""
        if not self.options.settle or error is None or self.refit is None or self.refit.search is None:
            return False
        target = best + math.log1p(self.options.resolution)
        blocking = [
            (float(mean[at]), free[at])
            for at in self.within_reach(observed, free)
            if not self.searched_in_full(self.candidates[free[at]].key)
            and mean[at] + self.options.z * error >= target
        ]
        chosen = [self.candidates[i] for _, i in sorted(blocking, reverse=True)[:SETTLE_MAX]]
        if not chosen:
            return False
        found = self.refit.searched(self.index, [(p.key, p.params) for p in chosen])
        for p, full in zip(chosen, found, strict=True):
            self.settled[(self.index, p.key)] = full  # one that meets no rate leaves the candidates (_free)
        return True

    def _settled_text(self) -> str:
        """How many untried configs the run searched in full to settle its stop (nothing when none)."""
        n = sum(1 for index, _ in self.settled if index == self.index)
        return f"; {n} untried config(s) near the best searched in full on the simulator" if n else ""

    def _outlook(self, bound: float, best: float | None, observed: Sequence[Observation]) -> str:
        """What more budget could buy, said when the budget stops the run: how far the untried configs'
        95 % bound lies above the incumbent (sign-adjusted logs; tune/guided.py's stop rule)."""
        if best is None:
            return ""
        gain = math.exp(bound - best) - 1
        beyond = "beyond" if gain > self.options.resolution else "within"
        return (
            f"; more budget: the guide's 95 % bound for an untried config is {gain:+.1%} against the best "
            f"measured ({math.exp(self.sign * bound):,.1f} vs {math.exp(self.sign * best):,.1f}: "
            f"{self._incumbent_text(observed, best)}), {beyond} the {self.options.resolution:.0%} resolution"
        )

    def _incumbent_text(self, observed: Sequence[Observation], best: float) -> str:
        """The incumbent in words: what was measured and what the stop rule counts it as (the two differ
        by the shrinkage toward the corrected prediction: GuideBelief.incumbent)."""
        measured = [o.measured for o in observed if o.measured]
        top = max(measured) if self.objective.maximize else min(measured)  # type: ignore[type-var]
        return (
            f"the best measured, {top:,.1f}, counts as {math.exp(self.sign * best):,.1f} after the "
            f"measurement's noise"
        )

    def _argmax(self, scores: np.ndarray, free: Sequence[int], tolerance: float = 0.0) -> int:
        """The position in `free` of the best score; among those within `tolerance` of it (0: equal
        ones), with `options.prefer_defaults` the config nearest vLLM's defaults (grid positions), else
        the first in the table."""
        tied = np.flatnonzero(scores >= np.max(scores) - tolerance - 1e-9 * abs(np.max(scores)))
        if not self.options.prefer_defaults or self.baseline is None:
            return int(tied[0])
        home = np.array(grid_positions(self.space, self.grid, self.baseline))
        spots = np.array(
            [grid_positions(self.space, self.grid, self.candidates[free[i]].params) for i in tied]
        )
        return int(tied[int(np.argmin(((spots - home) ** 2).sum(axis=1)))])
