"""The guide's correction from real measurements: a Gaussian process on log(measured / predicted).

The guide (tune/guide.py) ranks every config of the space on the simulator; a real GPU differs from
it by constants (a global bias: its efficiencies) and by mechanisms the model lacks (a bias that
varies over the space). Both are a residual r(x) = log(measured / predicted) over config features x
(each tuned flag's position in its grid range, 0..1). The model is a GP with a constant-bias kernel
plus a squared-exponential one:

  k(x, x') = bias^2 + scale^2 exp(-|x - x'|^2 / (2 lengthscale^2)) (+ noise^2 on the diagonal)

so one measurement moves every prediction (the bias) and more those of its neighbours. The scale,
lengthscale and noise are picked by marginal likelihood over a small grid once there are enough
points; the noise's floor is the measurement's resolution (a capacity search's 3 %), and it may be
learned 2x or 4x that: where one search spreads 13 % over seeds (a tight ITL SLO), two alike configs
measured 10 % apart are noise, not a trend. The posterior standard deviation is the guide's honest
uncertainty: the stop rule and the acquisition read it (tune/guided.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BIAS = 0.35  # prior sd of the global log bias: the simulator's real errors reach 30-45 % (docs/simulator.md)
# Prior sd of the local residual. Its floor is the guide's own error against the capacity search (median
# 3.5-7.4 %, p90 7.3-21 %: docs/simulator.md "Guide"), before any real-vs-simulated error: with less, a few
# alike residuals from one corner of the space would vouch for every other corner.
SCALES = (0.1, 0.15, 0.25)
LENGTHSCALES = (0.25, 0.5)  # in weighted grid-range units (tune/guided.py feature_weights)
DEFAULT_SCALE, DEFAULT_LENGTHSCALE = 0.15, 0.5
NOISE_FACTORS = (1.0, 2.0, 4.0)  # the measurement's sd, x its floor (the resolution)
MIN_POINTS_TO_FIT = 4  # below this the marginal likelihood cannot tell the hyperparameters apart


@dataclass(frozen=True)
class Posterior:
    """The residual's posterior at some configs: mean and sd of log(measured / predicted)."""

    mean: np.ndarray
    sd: np.ndarray


@dataclass
class ResidualModel:
    """A GP on log(measured / predicted) over config features (module docstring)."""

    noise: float = 0.03  # the floor of a measurement's log sd (its resolution)
    scales: tuple[float, ...] = SCALES  # the local part's candidate sds (one tiny one: a bias-only model)
    noise_factors: tuple[float, ...] = NOISE_FACTORS
    scale: float = DEFAULT_SCALE
    lengthscale: float = DEFAULT_LENGTHSCALE
    noise_factor: float = 1.0  # the learned noise: noise x this
    _x: np.ndarray | None = None
    _alpha: np.ndarray | None = None
    _chol: np.ndarray | None = None

    def fit(self, features: Sequence[Sequence[float]], residuals: Sequence[float]) -> ResidualModel:
        """Condition on measured points (features, log(measured / predicted)); picks the kernel's scale,
        lengthscale and noise by marginal likelihood once there are MIN_POINTS_TO_FIT of them."""
        if not len(residuals):  # nothing measured and predicted yet: the prior
            self._x = self._alpha = self._chol = None
            return self
        x = np.asarray(features, dtype=float).reshape(len(residuals), -1)
        y = np.asarray(residuals, dtype=float)
        if len(self.scales) == 1:
            self.scale = self.scales[0]
        if len(y) >= MIN_POINTS_TO_FIT:
            grid = itertools.product(self.scales, LENGTHSCALES, self.noise_factors)
            self.scale, self.lengthscale, self.noise_factor = max(
                grid, key=lambda g: self._likelihood(x, y, *g)
            )
        self._x = x
        self._chol, self._alpha = self._factor(x, y, self.scale, self.lengthscale, self.noise_factor)
        return self

    def predict(self, features: Sequence[Sequence[float]] | np.ndarray) -> Posterior:
        """Posterior mean and sd of the residual at `features` (the prior: 0 and its full sd)."""
        z = np.asarray(features, dtype=float)
        prior_var = BIAS**2 + self.scale**2
        if self._x is None or self._alpha is None or self._chol is None:
            return Posterior(np.zeros(len(z)), np.full(len(z), math.sqrt(prior_var)))
        cross = self._kernel(z, self._x, self.scale, self.lengthscale)
        mean = cross @ self._alpha
        v = _solve_lower(self._chol, cross.T)
        var = np.maximum(prior_var - np.sum(v * v, axis=0), 1e-12)
        return Posterior(mean, np.sqrt(var))

    def _factor(
        self, x: np.ndarray, y: np.ndarray, scale: float, length: float, noise_factor: float
    ) -> tuple[np.ndarray, np.ndarray]:
        gram = self._kernel(x, x, scale, length) + (self.noise * noise_factor) ** 2 * np.eye(len(y))
        chol = np.linalg.cholesky(gram)
        alpha = _solve_upper(chol.T, _solve_lower(chol, y))
        return chol, alpha

    def _likelihood(
        self, x: np.ndarray, y: np.ndarray, scale: float, length: float, noise_factor: float
    ) -> float:
        chol, alpha = self._factor(x, y, scale, length, noise_factor)
        return float(-0.5 * y @ alpha - np.log(np.diag(chol)).sum())

    @staticmethod
    def _kernel(a: np.ndarray, b: np.ndarray, scale: float, length: float) -> np.ndarray:
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)
        return BIAS**2 + scale**2 * np.exp(-d2 / (2 * length**2))


def _solve_lower(chol: np.ndarray, b: np.ndarray) -> np.ndarray:
    from scipy.linalg import solve_triangular

    return solve_triangular(chol, b, lower=True)


def _solve_upper(chol_t: np.ndarray, b: np.ndarray) -> np.ndarray:
    from scipy.linalg import solve_triangular

    return solve_triangular(chol_t, b, lower=False)


def expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """EI over `best` of a normal belief (log scale, higher is better)."""
    from scipy.stats import norm

    z = (mean - best) / sd
    return (mean - best) * norm.cdf(z) + sd * norm.pdf(z)
