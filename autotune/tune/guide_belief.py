"""What the guided search (tune/guided.py) believes of each config: the guide's prediction, from the table
in use (the guide's own, or the space re-predicted at a refitted speed: tune/guide_refit.py; for a config
the run searched in full on the simulator, that search), corrected by the real measurements through a
residual model over the configs' features (tune/guide_residual.py); and the incumbent, the best measured
config's value as that model believes it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna

from autotune.trial.saturation import SATURATION_BATCHES
from autotune.tune.guide import GuideTable, Prediction
from autotune.tune.guide_budget import Observation
from autotune.tune.guide_features import flag_weights, grid_positions, operating_point, ranges
from autotune.tune.guide_observed import observations
from autotune.tune.guide_options import GuidedOptions
from autotune.tune.guide_residual import NOISE_FACTORS, SCALES, ResidualModel
from autotune.tune.objectives import Objective
from autotune.tune.space import SearchSpace

BIAS_ONLY_SCALE = 1e-3  # the local part of a bias-only residual model
MIN_WEIGHT = 0.25  # the least weight a flag's feature gets (feature_weights)


class GuideBelief:
    """The guide's predictions, corrected by the measurements (module docstring)."""

    def __init__(
        self,
        table: GuideTable,
        space: SearchSpace,
        objective: Objective,
        options: GuidedOptions,
        extra: Mapping[str, Prediction] | None = None,
    ) -> None:
        self.space = space
        self.objective = objective
        self.options = options
        self.grid = space.grid()
        self.sign = 1.0 if objective.maximize else -1.0
        self.index = 0  # the refitted speed factor's grid point (tune/guide_refit.py)
        # the run's full searches of untried configs, by (grid point, key) (GuidedSearch._settle)
        self.settled: dict[tuple[int, str], Prediction] = {}
        self._base = (table, dict(extra or {}))  # the guide's own predictions (grid point 0)
        self.use_table(table, extra or {})

    def reset(self) -> None:
        """Back to the guide's own predictions (a new run from the same guide)."""
        self.index = 0
        self.settled.clear()
        self.use_table(*self._base)

    def use_table(self, table: GuideTable, extra: Mapping[str, Prediction]) -> None:
        """Predict from `table` (and `extra`: configs off the grid, such as vLLM's defaults) from now on."""
        self.table = table
        self.extra = dict(extra)
        self.candidates = [p for p in table.predictions if self.raw(p) is not None]
        self.weights = self.feature_weights()
        self._op_range = ranges([operating_point(p) for p in self.candidates])
        self._features: dict[bool, np.ndarray] = {}  # by options.operating_point

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
        """The guide's prediction of a config (a grid point, or one of `extra`): its full search where
        the run made one at the current calibration (GuidedSearch._settle)."""
        if (self.index, key) in self.settled:
            return self.settled[(self.index, key)]
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

    def model(self, observed: Sequence[Observation], local: bool = True) -> ResidualModel:
        """The residual GP conditioned on every trial with both a prediction and a measurement; without
        `local` (or options.local) one bias and the measurement's noise."""
        pairs = [o for o in observed if o.predicted is not None and o.measured is not None]
        residuals = [math.log(o.measured / o.predicted) for o in pairs]  # type: ignore[operator]
        noise = math.log1p(self.options.resolution)
        scales = SCALES if self.options.local and local else (BIAS_ONLY_SCALE,)
        features = [self.features(o.params, self.prediction(o.key)) for o in pairs]
        factors = NOISE_FACTORS if self.options.learn_noise else (1.0,)
        return ResidualModel(noise=noise, scales=scales, noise_factors=factors).fit(features, residuals)

    def corrected(self, model: ResidualModel, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Sign-adjusted log of the corrected prediction (higher is better) and its sd, per candidate."""
        posterior = model.predict(self.candidate_features()[list(indices)])
        raw = np.log([self.raw(self.prediction(self.candidates[i].key)) for i in indices])
        return self.sign * (raw + posterior.mean), posterior.sd

    def incumbent(self, observed: Sequence[Observation], model: ResidualModel) -> float | None:
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

    def believed(
        self,
        observed: Sequence[Observation],
        free: Sequence[int],
        model: ResidualModel,
        level: ResidualModel | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`corrected` by `model`; with `level` (the model is adequate) by it for the configs within the
        batches the measured bursts held."""
        mean, sd = self.corrected(model, free)
        if level is None:
            return mean, sd
        trusted = self.within_reach(observed, free)
        if trusted:
            mean[trusted], sd[trusted] = self.corrected(level, [free[at] for at in trusted])
        return mean, sd

    def within_reach(self, observed: Sequence[Observation], free: Sequence[int]) -> list[int]:
        """The positions in `free` of the candidates whose predicted requests in flight at capacity lie
        within the batch the measured bursts held: each burst sends SATURATION_BATCHES of them, so it
        vouches for the batches measured, not beyond."""
        held = [b.requests / SATURATION_BATCHES for o in observed if o.measured is not None for b in o.bursts]
        reach = math.log(max(held))
        return [at for at, i in enumerate(free) if operating_point(self.candidates[i])[0] <= reach]

    def searched_in_full(self, key: str) -> bool:
        """Whether the guide predicts `key` by its full search at the current calibration."""
        return key in self._base[0].searched_scales or (self.index, key) in self.settled
