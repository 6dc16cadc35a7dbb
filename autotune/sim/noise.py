"""Run-to-run noise of the simulated engine, seeded so that every noisy result is reproducible.

Two runs of one config on a real GPU differ: clocks boost and throttle, the GPU's thermal state and
neighbours change, kernels jitter. Without noise the simulator answers the same number every time, so
nothing that must cope with noise (ties, repeats, intervals) could be tested. The model has two parts:
- a speed factor per server session (lognormal, sigma = cv): what makes one launch of a config a few
  percent faster or slower than another, and what repeats with other seeds average out;
- jitter per engine step (lognormal, sigma = 2 cv): what spreads ITL tails within one run.
Published run-to-run spreads of `vllm bench serve` on one GPU are about 1-3 % in throughput, hence the
default cv of 0.02 when noise is on. It is off by default (cv 0): unit tests compare exact numbers.
"""

from __future__ import annotations

import argparse
import zlib
from dataclasses import dataclass

import numpy as np

DEFAULT_CV = 0.02  # `--noise` without a value, and the benchmarks
_BLOCK = 4096  # step factors are drawn in blocks: one numpy call per 4,096 steps keeps the engine fast


@dataclass(frozen=True)
class NoiseModel:
    """How noisy a simulated server is: `cv` is the run-to-run coefficient of variation (0: none)."""

    cv: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.cv < 1.0):
            raise ValueError(f"noise must be in [0, 1), got {self.cv:g}")

    @property
    def enabled(self) -> bool:
        """True when runs differ at all."""
        return self.cv > 0.0

    def session(self, seed: int, label: str) -> StepNoise | None:
        """The noise of one server session of the config named `label` (None when disabled).

        The config's label is mixed into the seed: configs measured at different times on a real GPU
        see independent noise, so two configs must not share their draws.
        """
        if not self.enabled:
            return None
        return StepNoise(self.cv, [seed & 0xFFFFFFFF, zlib.crc32(label.encode())])


def add_noise_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The `--noise [CV]` option of the commands that run the simulator."""
    parser.add_argument(
        "--noise",
        type=float,
        nargs="?",
        const=DEFAULT_CV,
        default=0.0,
        metavar="CV",
        help=f"sim: seeded run-to-run noise, as a real GPU has (default off; --noise alone: {DEFAULT_CV})",
    )


def noise_model(cv: float) -> NoiseModel:
    """`--noise`'s value as a NoiseModel; an AutotuneError (one line) outside [0, 1)."""
    from autotune.core.errors import AutotuneError

    if not 0 <= cv < 1:
        raise AutotuneError(f"--noise must be in [0, 1), got {cv:g}")
    return NoiseModel(cv)


class StepNoise:
    """Multiplicative factors for successive step durations: the session's speed times step jitter."""

    def __init__(self, cv: float, entropy: list[int]) -> None:
        self._rng = np.random.default_rng(entropy)
        self.speed = float(self._rng.lognormal(0.0, cv))
        self._sigma = 2.0 * cv
        self._block = np.empty(0)
        self._next = 0

    def factor(self) -> float:
        """The factor for the next step's duration."""
        if self._next >= len(self._block):
            self._block = self.speed * self._rng.lognormal(0.0, self._sigma, _BLOCK)
            self._next = 0
        value = self._block[self._next]
        self._next += 1
        return float(value)
