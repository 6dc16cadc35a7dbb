"""The guide recalibrated from the real measurements: one speed factor of the simulator, refitted after
every real trial, and the whole space re-predicted with it (docs/guided-search.md, "The method").

A residual model alone cannot move an SLO's cliff: on a GPU 30 % slower than the model, the configs
whose ITL was predicted just under the SLO miss it, and their throughput collapses, while a config a
step further from the cliff becomes the best. Re-predicting the space with the fitted factor moves the
cliff where the measurements put it; the residual model then corrects what one factor cannot.

The factor scales the speed constants together (GPU efficiencies up, CPU costs down) and lives on a
grid of 2.5 % steps (within the measurement's resolution), so tables are cached per grid point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.measure.capacity_report import BurstSummary
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration, calibration_fields
from autotune.tune.guide import GuideTable, Prediction
from autotune.tune.guide_refine import scaled
from autotune.tune.objectives import Objective

# The speed constants one factor scales (sim/calibration.py): faster GPU work, cheaper CPU work.
SPEED_UP = ("gemm_eff", "attn_eff", "bw_eff")
SPEED_DOWN = ("step_base_s", "per_seq_s", "eager_per_layer_s", "intake_per_request_s", "output_per_token_s")
STEP = math.log(1.025)  # the factor's grid, on the log scale
LIMIT = 40  # the factor stays within 1.025^+-40 (0.37x .. 2.7x)
CLIFF = 5.0  # a measured config predicted to meet no rate counts as this far off (log), in the fit
# A median error this small (log) is an exact fit, a rounding: the fast estimate's rates lie on a
# ladder, so neighbouring factors can predict the same value and fit equally well.
EXACT = 1e-3
# A trial's saturation bursts replayed at a calibration: (calibration, the trial's params, its bursts) ->
# each burst's figures (tune/guide_check.py replay_bursts)
Replay = Callable[[Calibration, dict[str, Any], Sequence[BurstSummary]], list[dict[str, float]]]


def scaled_calibration(calibration: Calibration, factor: float) -> Calibration:
    """`calibration` with its speed constants scaled by `factor` (each kept inside its range)."""
    ranges = {i.name: (i.low, i.high) for i in calibration_fields()}
    changed = {}
    for name in SPEED_UP + SPEED_DOWN:
        value = getattr(calibration, name) * (factor if name in SPEED_UP else 1 / factor)
        low, high = ranges[name]
        changed[name] = min(max(value, low), high)
    return calibration.replace(**changed)


@dataclass
class Refit:
    """Predicts configs at the guide's calibration scaled by a grid factor, and fits that factor.

    `predict_table(calibration)` predicts the whole space (cached on disk by the caller's predict_space);
    `predict_points(calibration, params)` a few configs, in their order. Point predictions are kept in
    memory. `replay(calibration, params, bursts)`: a trial's saturation bursts replayed on the simulated
    engine (tune/guide_check.py; None: the guide does not check its model against them). `say` hears of
    each whole-space prediction (it takes a while on first use).
    `search(calibration, params)`: a few configs' full capacity searches (tune/guide_refine.py
    search_points; None: the guided search bounds the configs it did not search by the fast estimate's
    error). `scale_of(key)`: the guide table's prediction of a config over its fast estimate
    (GuideTable.scale_of: a refined config's own full search, the median ratio for the others). Both
    callables give fast estimates; every prediction the refit uses or hands out is put on the table's
    scale by it, so a GPU that measures what the table predicts keeps the factor at 1 (against the raw
    estimate, the gap between the two, 5 % on the 70B case, reads as a GPU that much slower).
    """

    predict_table: Callable[[Calibration], GuideTable]
    predict_points: Callable[[Calibration, list[dict[str, Any]]], list[Prediction]]
    objective: Objective
    tensor_parallel_size: int = 1
    base: Calibration = DEFAULT_CALIBRATION
    say: Callable[[str], None] | None = None
    scale_of: Callable[[str], float] = lambda key: 1.0
    replay: Replay | None = None
    search: Callable[[Calibration, list[dict[str, Any]]], list[Prediction]] | None = None
    _points: dict[tuple[int, str], Prediction | None] = field(default_factory=dict, repr=False)
    _searched: dict[tuple[int, str], Prediction] = field(default_factory=dict, repr=False)

    def calibration(self, index: int) -> Calibration:
        """The guide's calibration at grid point `index` (0: the base itself)."""
        return self.base if index == 0 else scaled_calibration(self.base, math.exp(index * STEP))

    def factor(self, index: int) -> float:
        """The speed factor of grid point `index`."""
        return math.exp(index * STEP)

    def table(self, index: int) -> GuideTable:
        """The whole space predicted at grid point `index`."""
        if self.say is not None:
            factor = self.factor(index)
            self.say(f"speed refitted to x{factor:.3f} by the measurements; predicting the space again ...")
        table = self.predict_table(self.calibration(index))
        return dataclasses.replace(table, predictions=[self._on_scale(p) for p in table.predictions])

    def points(self, index: int, params: list[dict[str, Any]]) -> list[Prediction]:
        """Configs (not in the table) predicted at grid point `index`, on the table's scale."""
        found = self.predict_points(self.calibration(index), params) if params else []
        return [self._on_scale(p) for p in found]

    def searched(self, index: int, points: Sequence[tuple[str, dict[str, Any]]]) -> list[Prediction]:
        """Configs ((key, params)) predicted by the full capacity search at grid point `index`, each
        searched once (kept in memory)."""
        assert self.search is not None
        missing = [(key, params) for key, params in points if (index, key) not in self._searched]
        if missing:
            if self.say is not None:
                factor = self.factor(index)
                self.say(
                    f"searching {len(missing)} config(s) near the best in full at speed x{factor:.3f} ..."
                )
            found = self.search(self.calibration(index), [params for _, params in missing])
            for (key, _), prediction in zip(missing, found, strict=True):
                self._searched[(index, key)] = prediction
        return [self._searched[(index, key)] for key, _ in points]

    def _on_scale(self, prediction: Prediction) -> Prediction:
        return scaled(prediction, self.scale_of(prediction.key), self.objective)

    def fit(self, measured: Sequence[tuple[str, dict[str, Any], float]], near: int = 0) -> int:
        """The grid point where the median of the measured configs' signed log errors (measured over
        predicted, better-is-positive) crosses zero: the least-absolute-deviation fit of one factor,
        which a config past a cliff cannot drag. Of the points that fit exactly, the one nearest the
        guide's calibration. `measured`: (config key, params, objective value). `near`: where to look
        first (the last fit's point: one more measurement seldom moves it far, and each grid point
        costs a prediction of the new config); the answer does not depend on it."""
        if not measured:
            return 0

        def error(index: int) -> float:
            median = self._median_error(index, measured)
            return 0.0 if abs(median) <= EXACT else median

        if error(0) == 0:
            return 0
        near = min(max(near, -LIMIT), LIMIT)
        guess = near + round(error(near) / STEP)  # a value moves about as much as the speed does
        bracket = _bracket(error, min(max(guess, -LIMIT), LIMIT))
        if isinstance(bracket, int):
            return bracket
        lo, hi = bracket
        while hi - lo > 1:  # faster (higher index) predicts better values: the median error falls
            mid = (lo + hi) // 2
            if error(mid) > 0:
                lo = mid
            else:
                hi = mid
        if error(hi) == 0:  # the lowest exact fit: walk up its plateau towards the guide's calibration
            while hi + 1 < 0 and error(hi + 1) == 0:
                hi += 1
            return hi
        return lo if abs(error(lo)) < abs(error(hi)) else hi

    def _median_error(self, index: int, measured: Sequence[tuple[str, dict[str, Any], float]]) -> float:
        missing = [(key, params) for key, params, _ in measured if (index, key) not in self._points]
        if missing:  # one call: configs of one class share the estimator's runs (tune/guide.py)
            found = self.predict_points(self.calibration(index), [params for _, params in missing])
            for (key, _), prediction in zip(missing, found, strict=True):
                self._points[(index, key)] = prediction
        errors = sorted(self._error(index, key, value) for key, _, value in measured)
        n = len(errors)
        return errors[n // 2] if n % 2 else (errors[n // 2 - 1] + errors[n // 2]) / 2

    def _error(self, index: int, key: str, value: float) -> float:
        prediction = self._points[(index, key)]
        if prediction is not None:
            prediction = self._on_scale(prediction)
        predicted = prediction.value(self.objective, self.tensor_parallel_size) if prediction else None
        if not predicted or predicted <= 0:
            return CLIFF  # measured to meet the SLOs, predicted not to: the model is too slow here
        sign = 1.0 if self.objective.maximize else -1.0
        return sign * (math.log(value) - math.log(predicted))


def _bracket(error: Callable[[int], float], start: int) -> tuple[int, int] | int:
    """Grid points (lo, hi) with error(lo) > 0 >= error(hi), found by steps doubling away from `start`;
    a limit of the grid where the crossing lies beyond it (the factor stops there)."""
    step = 1
    if error(start) > 0:
        lo = start
        while lo < LIMIT:
            hi = min(lo + step, LIMIT)
            if error(hi) <= 0:
                return lo, hi
            lo, step = hi, 2 * step
        return LIMIT
    hi = start
    while hi > -LIMIT:
        lo = max(hi - step, -LIMIT)
        if error(lo) > 0:
            return lo, hi
        hi, step = lo, 2 * step
    return -LIMIT
