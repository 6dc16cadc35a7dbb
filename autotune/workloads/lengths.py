"""Token-length distributions of synthetic workloads, sampled stratified.

`LengthDist` is a workload's `prompt_len` or `output_len`: fixed, uniform (like vLLM's random
dataset), normal or lognormal, clipped to [min, max]. Its samples are stratified (see
`stratified_uniforms`): each length is a draw from the distribution, and every block of STRATA
consecutive requests covers all of its quantile bands, so any window of a run holds the tail in its share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from autotune.core.errors import AutotuneError
from autotune.core.values import MAX_TOKENS

DISTS = ("fixed", "uniform", "normal", "lognormal")
STRATA = 64  # lengths are stratified in blocks of this many requests (see stratified_uniforms)
_U_CLAMP = 1e-12  # uniforms are kept this far from 0 and 1: the normal's quantiles there are finite
CENTER_GRID = 256  # quantiles the drawn center is checked on
CENTER_TOLERANCE = 1.5  # the drawn mean (or median) may differ from the stated one by this factor at most


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts, sampled as integers clipped to [min, max].

    fixed: always `mean`. uniform: integers in [floor(mean*(1-r)), ceil(mean*(1+r))] like vLLM's random
    dataset (r = range_ratio). normal: mean, std. lognormal: sigma with either the mean or the median.
    """

    dist: str
    mean: float = 0.0
    range_ratio: float = 0.0
    std: float = 0.0
    sigma: float = 0.0
    median: float | None = None
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if self.dist not in DISTS:
            raise AutotuneError(f"unknown length distribution {self.dist!r} (use one of {', '.join(DISTS)})")
        center = self.median if self.dist == "lognormal" and self.median is not None else self.mean
        if center <= 0:
            raise AutotuneError(f"{self.dist} lengths need a positive mean (or median), got {center:g}")
        if not 0 <= self.range_ratio < 1:
            raise AutotuneError(f"range_ratio must be in [0, 1), got {self.range_ratio:g}")
        if self.std < 0 or self.sigma < 0:
            raise AutotuneError("std and sigma must not be negative")
        if self.min < 1 or (self.max is not None and self.max < self.min):
            raise AutotuneError(
                f"length bounds must satisfy 1 <= min <= max, got min={self.min} max={self.max}"
            )
        self._check_longest()
        self._check_center()

    def _check_center(self) -> None:
        """Refuse a spec whose draws, rounded and clipped to [min, max], do not center where it says: a
        lognormal whose sigma puts nearly all its mass below one token drew 1 for every request, a min
        above the mean drew min."""
        lengths = self._lengths((np.arange(CENTER_GRID) + 0.5) / CENTER_GRID)
        by_median = self.dist == "lognormal" and self.median is not None
        stated = self.median if by_median else self.mean
        drawn = float(np.median(lengths) if by_median else lengths.mean())
        assert stated is not None
        if not stated / CENTER_TOLERANCE <= drawn <= stated * CENTER_TOLERANCE:
            what = "median" if by_median else "mean"
            bounds = f"{self.min} to {self.max}" if self.max is not None else f"at least {self.min}"
            raise AutotuneError(
                f"{self.describe()} draws lengths with a {what} of {drawn:.3g} tokens (whole, {bounds}), not "
                f"{stated:g}: give it a smaller spread, or bounds around its {what}"
            )

    def _check_longest(self) -> None:
        """Refuse lengths past MAX_TOKENS, given or drawable (a spread's far tail): checked on the
        largest length any seed can draw, so no trial's sample finds it, and before the int64 cast,
        which would wrap a larger count to a negative one."""
        for name, value in (
            ("mean", self.mean),
            ("median", self.median),
            ("min", self.min),
            ("max", self.max),
        ):
            if value is not None and not value <= MAX_TOKENS:
                raise AutotuneError(f"{name} must be at most {MAX_TOKENS:,} tokens, got {value:g}")
        longest = float(self._lengths(np.array([1 - _U_CLAMP]))[0])  # the top quantile any draw reaches
        if not longest <= MAX_TOKENS:
            raise AutotuneError(
                f"{self.describe()} can draw lengths up to {longest:.3g} tokens, more than {MAX_TOKENS:,} "
                "(the most any model takes): give it a max: or a smaller spread"
            )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` integer lengths, stratified (see `stratified_uniforms`): each is a draw from the
        distribution, and every block of STRATA consecutive requests covers all of its quantile bands."""
        return self._lengths(stratified_uniforms(rng, n)).astype(np.int64)

    def _lengths(self, u: np.ndarray) -> np.ndarray:
        """The lengths at quantiles `u` in [0, 1], as floats: rounded and clipped, not yet cast."""
        if self.dist == "fixed":
            values = np.full(len(u), float(self.mean))
        elif self.dist == "uniform":
            low = math.floor(self.mean * (1 - self.range_ratio))
            high = math.ceil(self.mean * (1 + self.range_ratio))
            values = np.floor(low + u * (high - low + 1))
        elif self.dist == "normal":
            values = self.mean + self.std * _normal_quantiles(u)
        else:
            # mean of a lognormal is exp(mu + sigma^2 / 2); its median is exp(mu). sigma * sigma, not
            # sigma**2: a float's ** raises OverflowError where * gives inf (every length then 1)
            mu = (
                math.log(self.median)
                if self.median is not None
                else math.log(self.mean) - self.sigma * self.sigma / 2
            )
            with np.errstate(over="ignore"):  # a tail past any length is inf, which _check_longest refuses
                values = np.exp(mu + self.sigma * _normal_quantiles(u))
        return np.clip(np.rint(values), self.min, self.max)

    def describe(self) -> str:
        """E.g. "lognormal(mean 1000, sigma 0.8)"."""
        if self.dist == "fixed":
            return f"{self.mean:g}"
        if self.dist == "uniform":
            return f"uniform({self.mean:g} +/- {self.range_ratio:.0%})"
        if self.dist == "normal":
            return f"normal({self.mean:g}, std {self.std:g})"
        center = f"median {self.median:g}" if self.median is not None else f"mean {self.mean:g}"
        return f"lognormal({center}, sigma {self.sigma:g})"


def stratified_uniforms(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` uniforms in [0, 1), each block of STRATA holding one from each band [k/STRATA, (k+1)/STRATA)
    in random order.

    Each value is uniform, so each length is a draw from its distribution, as with independent draws;
    but any stretch of a few blocks holds the distribution's tail in its share. With independent draws
    a 600-request window's p99 ITL moved by +-9 % with the prompt lengths it happened to draw (the
    rare long prompts decide it), so a capacity probe was judged on its sample's luck. Blocks are
    drawn whole and in order: the first k lengths do not depend on n.
    """
    blocks = -(-n // STRATA)
    bands = np.concatenate([rng.permutation(STRATA) for _ in range(blocks)]) if blocks else np.zeros(0)
    return (bands + rng.random(blocks * STRATA))[:n] / STRATA


def _normal_quantiles(u: np.ndarray) -> np.ndarray:
    """The standard normal's quantiles of `u` (numpy has no inverse CDF; NormalDist is exact)."""
    inverse = NormalDist().inv_cdf
    return np.array([inverse(min(max(x, _U_CLAMP), 1 - _U_CLAMP)) for x in u], dtype=float)
