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
  the guide's model replays every measured trial's saturation bursts (tune/guide_check.py), the
  guide's own estimate error for a config within the batches measured (none when searched in full), or
- every config the guide predicts to meet the SLOs was measured.
Trials live in the Optuna study (the chosen params are enqueued, with the prediction as a user attr),
and the state is rebuilt from the study's finished trials at every step, so `--resume` needs nothing else.
The real measurement alone gives a config's verdict: the guide only decides what to measure.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune.trial.saturation import SATURATION_BATCHES
from autotune.tune.guide import GuideTable, Prediction
from autotune.tune.guide_budget import Budget, Observation
from autotune.tune.guide_check import BurstCheck, Misfit
from autotune.tune.guide_features import flag_weights, grid_positions, operating_point, ranges
from autotune.tune.guide_observed import ATTR, observations
from autotune.tune.guide_refit import Refit
from autotune.tune.guide_residual import NOISE_FACTORS, SCALES, ResidualModel, expected_improvement
from autotune.tune.objectives import Objective
from autotune.tune.space import SearchSpace
from autotune.tune.study import config_key, has_baseline

RESOLUTION = 0.03  # the capacity search's resolution: a gain below it is a tie (docs/guided-search.md)
Z_UPPER = 1.645  # one-sided 95 % bound of the stop rule
HINT_BELOW = 0.1  # a bracketed search's first probe: at most this far (log) below the corrected capacity
MIN_MEASURED = 2  # the guide's first pick and the defaults, at least, before the stop rule may end a run
# With this many trials or fewer left in the budget (this one included) the pick is the corrected mean's
# best: what exploration would teach has no trial left to pay off (the 70B case, docs/guided-search.md)
EXPLOIT_LEFT = 2
BIAS_ONLY_SCALE = 1e-3  # the local part of a bias-only residual model
MIN_WEIGHT = 0.25  # the least weight a flag's feature gets (feature_weights)


@dataclass(frozen=True)
class GuidedOptions:
    """The guided run's budget and stop rule."""

    gpu_hours: float | None = None  # budget (None: only --n-trials bounds the run)
    resolution: float = RESOLUTION
    z: float = Z_UPPER
    first_trial_gpu_s: float | None = None  # expected cost of a trial before any is measured
    local: bool = True  # False: the residual is one global bias (benchmarks/guided_search.py's ablation)
    operating_point: bool = True  # the residual also varies with the predicted batch and step time
    learn_noise: bool = True  # False: the measurement's noise stays at the resolution (an ablation)
    # a trial's capacity search starts below the corrected predicted capacity: off, it cost more GPU
    # time than the plain search on the benchmark (docs/guided-search.md)
    bracket: bool = False
    # among configs scored equal (the guide's estimates tie on plateaus), the nearest vLLM's defaults;
    # off: the first in the table (it helped the L4 case and cost the 70B: docs/guided-search.md)
    prefer_defaults: bool = False
    # a pick by best prediction takes the first of the configs within the resolution of the best; off:
    # it helped the 70B case and cost the L4 (docs/guided-search.md, "The guide's top searched in full")
    resolution_ties: bool = False
    # the stop trusts the guide's own predictions once its model replays every measured trial's saturation
    # bursts (tune/guide_check.py); off: the residual model's prior bounds every untried config (ablation)
    check_bursts: bool = True


class GuidedSearch:
    """Chooses the next real trial from the guide's table and the measurements (module docstring)."""

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
        self.space = space
        self.objective = objective
        self.options = options
        self.grid = space.grid()
        self.sign = 1.0 if objective.maximize else -1.0
        self.budget = Budget(options.gpu_hours, options.first_trial_gpu_s, objective.maximize)
        self.refit = refit  # None: the guide keeps its calibration, the residual model alone corrects it
        self.baseline = dict(baseline) if baseline is not None else None
        self.index = 0  # the refitted speed factor's grid point (Refit)
        self.stop_reason: str | None = None
        self.bursts = BurstCheck()  # the measured trials' bursts replayed (tune/guide_check.py)
        self._base = (table, dict(extra or {}))  # the guide's own predictions (grid point 0)
        self.use_table(table, extra or {})

    def reset(self) -> None:
        """Back to the guide's own predictions (a new run from the same guide)."""
        self.index = 0
        self.use_table(*self._base)

    def use_table(self, table: GuideTable, extra: Mapping[str, Prediction]) -> None:
        """Predict from `table` (and `extra`: configs off the grid, such as vLLM's defaults) from now on."""
        self.table = table
        self.extra = dict(extra)
        self.candidates = [p for p in table.predictions if self.raw(p) is not None]
        self.weights = self.feature_weights()
        self._op_range = ranges([operating_point(p) for p in self.candidates])
        self._features: dict[bool, np.ndarray] = {}  # by options.operating_point

    # -- what the guide knows -------------------------------------------------------------------------
    def raw(self, prediction: Prediction | None) -> float | None:
        """The guide's predicted objective value (None: it does not start or meets no rate)."""
        if prediction is None:
            return None
        value = prediction.value(self.objective, self.table.tensor_parallel_size)
        return value if value is not None and value > 0 else None

    def own_prediction(self, key: str) -> float | None:
        """The guide's predicted objective value at its own calibration (before any refit)."""
        table, extra = self._base
        return self.raw(table.lookup(key) or extra.get(key))

    def prediction(self, key: str) -> Prediction | None:
        """The guide's prediction of a config (a grid point, or one of `extra`)."""
        return self.table.lookup(key) or self.extra.get(key)

    def features(self, params: Mapping[str, Any], prediction: Prediction | None = None) -> list[float]:
        """Each tuned flag's position in its grid range, 0..1 (log scale for a log range), times its
        weight (`feature_weights`); then, when `options.operating_point`, where the guide predicts the
        config runs at its capacity (`operating_point`, 0..1 over the candidates; 0.5 unknown)."""
        positions = grid_positions(self.space, self.grid, params)
        out = [x * self.weights.get(p.name, 1.0) for p, x in zip(self.space.params, positions, strict=True)]
        if self.options.operating_point:
            point = operating_point(prediction) if prediction is not None else None
            for i, (lo, hi) in enumerate(self._op_range):
                known = point is not None and hi > lo
                out.append(min(max((point[i] - lo) / (hi - lo), 0.0), 1.0) if known else 0.5)  # type: ignore[index]
        return out

    def candidate_features(self) -> np.ndarray:
        """The candidates' features, one row each (made once per feature set)."""
        op = self.options.operating_point
        if op not in self._features:
            rows = [self.features(p.params, p) for p in self.candidates]
            self._features[op] = np.array(rows, dtype=float).reshape(len(self.candidates), -1)
        return self._features[op]

    def feature_weights(self) -> dict[str, float]:
        """How much each flag moves the guide's predictions (guide_features.flag_weights)."""
        logs = {p.key: math.log(self.raw(p)) for p in self.candidates}  # type: ignore[arg-type]
        return flag_weights(self.space, self.candidates, logs, MIN_WEIGHT)

    def observations(self, study: optuna.Study) -> list[Observation]:
        """The study's finished real trials as the guide sees them (tune/guide_observed.py)."""
        return observations(study, self.space, lambda key: self.raw(self.prediction(key)))

    def model(self, observed: Sequence[Observation]) -> ResidualModel:
        """The residual GP conditioned on every trial with both a prediction and a measurement."""
        pairs = [o for o in observed if o.predicted is not None and o.measured is not None]
        residuals = [math.log(o.measured / o.predicted) for o in pairs]  # type: ignore[operator]
        noise = math.log1p(self.options.resolution)
        scales = SCALES if self.options.local else (BIAS_ONLY_SCALE,)
        features = [self.features(o.params, self.prediction(o.key)) for o in pairs]
        factors = NOISE_FACTORS if self.options.learn_noise else (1.0,)
        return ResidualModel(noise=noise, scales=scales, noise_factors=factors).fit(features, residuals)

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

    # -- choosing and stopping ------------------------------------------------------------------------
    def step(self, study: optuna.Study, busy: Collection[str] = ()) -> str | None:
        """Enqueue the next config to measure, or return why the run stops. Nothing is enqueued while a
        trial waits in the study (the defaults, or an earlier pick not yet asked)."""
        if any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
            return None
        observed = self.observations(study)
        if self.refit is not None and self._recalibrate(observed):
            observed = self.observations(study)  # residuals against the re-predicted space
        if self._defaults_due(study, bool(observed or busy)):
            self.stop_reason = self._enqueue_defaults(study, observed, len(busy))
        else:
            self.stop_reason = self._choose(study, observed, set(busy))
        return self.stop_reason

    def waits(self, study: optuna.Study, busy: int) -> bool:
        """Whether to start nothing more until one of the `busy` running trials ends (Budget.waits)."""
        return self.budget.waits(self.observations(study), busy)

    @property
    def baseline_key(self) -> str | None:
        """The config key of vLLM's defaults (None: the search does not enqueue them)."""
        return config_key(self.space.config(self.baseline)) if self.baseline is not None else None

    def _defaults_due(self, study: optuna.Study, started: bool) -> bool:
        """The defaults go next: the first pick has started and the study has no baseline trial
        (study.has_baseline: one interrupted before it was measured is queued again)."""
        return self.baseline is not None and started and not has_baseline(study)

    def _enqueue_defaults(
        self, study: optuna.Study, observed: Sequence[Observation], busy: int
    ) -> str | None:
        """Enqueue vLLM's defaults, or say why the budget cannot afford them."""
        assert self.baseline is not None and self.baseline_key is not None  # _defaults_due
        predicted = self.raw(self.prediction(self.baseline_key))
        over_budget = self.budget.stop(observed, predicted, busy, "the next trial (vLLM's defaults)")
        if over_budget:
            return over_budget
        study.enqueue_trial(dict(self.baseline), user_attrs={"baseline": True}, skip_if_exists=False)
        return None

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

    def _choose(self, study: optuna.Study, observed: Sequence[Observation], busy: set[str]) -> str | None:
        tried = {o.key for o in observed if not o.interrupted} | busy
        free = [i for i, p in enumerate(self.candidates) if p.key not in tried]
        if not free:
            return "every config the guide predicts to meet the SLOs has been measured"
        model = self.model(observed)
        mean, sd = self.corrected(model, free)
        best = self._best(observed, model)
        upper, worst = self._upper(observed, free, mean, sd)
        bound = float(np.max(upper))  # the best any untried config may be (95 %)
        if best is not None and len(observed) >= MIN_MEASURED and not busy:
            target = best + math.log1p(self.options.resolution)
            if bound < target:
                checked = f", fitting every trial's bursts ({worst.shape:.1%} RMS)," if worst else ""
                return (
                    f"the guide{checked} predicts no untried config beats the best measured by more than "
                    f"{self.options.resolution:.0%} (95 % bound {math.exp(self.sign * bound):,.1f}; "
                    f"{self._incumbent_text(observed, best)})"
                )
        left = self.budget.trials_left(observed, math.exp(self.sign * float(np.max(mean))), len(busy))
        exploit = best is None or left <= EXPLOIT_LEFT
        scores = mean if exploit else expected_improvement(mean, sd, best)  # type: ignore[arg-type]
        tolerance = math.log1p(self.options.resolution) if exploit and self.options.resolution_ties else 0.0
        pick = free[self._argmax(scores, free, tolerance)]
        chosen = self.candidates[pick]
        at = free.index(pick)
        corrected = math.exp(self.sign * mean[at])
        over_budget = self.budget.stop(observed, corrected, len(busy))
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

    def _upper(
        self, observed: Sequence[Observation], free: Sequence[int], mean: np.ndarray, sd: np.ndarray
    ) -> tuple[np.ndarray, Misfit | None]:
        """Each untried config's 95 % upper bound (sign-adjusted log), and the worst burst misfit when the
        guide's model is adequate (tune/guide_check.py). Then the residual model's prior, which stands
        for what the model may lack, no longer bounds a config whose predicted requests in flight at
        capacity are within the batch the measured bursts held: the guide's own estimate error does (none
        for a config searched in full, the measured spread of the fast estimate for the others)."""
        upper = mean + self.options.z * sd
        check = self.options.check_bursts
        worst = self.bursts.verdict(observed, self.refit, self.index, MIN_MEASURED) if check else None
        error = self._base[0].estimate_error()
        if worst is None or error is None:
            return upper, None
        # the batch the measured bursts held (each sends SATURATION_BATCHES of them), as requests in flight
        held = [b.requests / SATURATION_BATCHES for o in observed if o.measured is not None for b in o.bursts]
        reach = math.log(max(held))
        searched = self._base[0].searched_scales
        for at, i in enumerate(free):
            p = self.candidates[i]
            if operating_point(p)[0] <= reach:
                upper[at] = mean[at] + self.options.z * (0.0 if p.key in searched else error)
        return upper, worst

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
        by the shrinkage toward the corrected prediction: _best)."""
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

    def corrected(self, model: ResidualModel, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Sign-adjusted log of the corrected prediction (higher is better) and its sd, per candidate."""
        posterior = model.predict(self.candidate_features()[list(indices)])
        raw = np.log([self.raw(self.candidates[i]) for i in indices])
        return self.sign * (raw + posterior.mean), posterior.sd

    def _best(self, observed: Sequence[Observation], model: ResidualModel) -> float | None:
        """The incumbent (sign-adjusted log): the best measured config's value as the model believes it,
        its measurement shrunk toward the corrected prediction by the learned noise (a lucky
        measurement must not end the search; noisy expected improvement's incumbent). A config the
        guide did not predict counts as measured."""
        unpredicted = [
            self.sign * math.log(o.measured) for o in observed if o.measured and o.predicted is None
        ]
        pairs = [o for o in observed if o.measured is not None and o.predicted is not None]
        believed = []
        if pairs:  # one posterior for all of them
            posterior = model.predict([self.features(o.params, self.prediction(o.key)) for o in pairs])
            logs = np.log([o.predicted for o in pairs]) + posterior.mean  # type: ignore[misc]
            believed = [self.sign * float(v) for v in logs]
        values = unpredicted + believed
        return max(values) if values else None
