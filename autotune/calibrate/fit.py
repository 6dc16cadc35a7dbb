"""Fitting a Calibration to measured points: bounded least squares on log errors, with a weak prior.

Unknowns are the constants' log ratios to the prior calibration (x = log(value / prior value)), bounded
by the fields' ranges. Residuals: every measured metric's log(simulated / measured) (clipped at
+-`CLIP`, so one point the model cannot reach does not dominate), plus `prior_weight * x` per constant:
a constant the data says nothing about stays at its prior instead of wandering, and one the data
pins moves as the data says (at weight 0.1, a 10 % error on one metric weighs as much as a 2.7x move).

Points vLLM would refuse whatever the constants (replayable.py) are left out, each named in the notes.
Only constants the points can see are free: memory points see the memory terms; step points the step
costs; serve points the step costs and the API server. A constant no simulated value moves with (a
probe step, then a factor 10 up and down) is left at its prior and reported so. The fit starts at the
prior, moved one probe step inside a range it sits on the bound of. The Jacobian is a forward
difference of `diff_step` in log space (the simulator is event-driven: smaller steps see its discrete
jumps, not its trend), recomputing only the points a constant can move. scipy.optimize.least_squares
(trf) does the rest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.calibrate.points import Error, Replay
from autotune.calibrate.replayable import unreplayable
from autotune.core.errors import AutotuneError
from autotune.sim.calibration import (
    DEFAULT_CALIBRATION,
    Calibration,
    FieldInfo,
    calibration_fields,
    rounded,
)

CLIP = 3.0  # |log error| cap: a 20x miss counts as much as a 20x miss should, no more
FAR = math.log(10)  # the probe of a constant no small step moves: a factor 10 (or to its bound)
SEES = {"memory": ("memory",), "step": ("costs",), "serve": ("costs", "frontend")}  # kind -> groups
Progress = Callable[[str], None]


@dataclass(frozen=True)
class FitOptions:
    """How the fit weighs the prior and probes the simulator."""

    prior_weight: float = 0.1  # residual per unit of log deviation from the prior
    diff_step: float = 0.03  # forward-difference step in log space
    max_evaluations: int = 30  # least_squares function evaluations (each a replay of every point)
    tolerance: float = 1e-3  # relative change of the cost that ends the fit
    # Errors beyond loss_scale count less than squared (soft_l1): a metric the event-driven model meets
    # only in steps (a light-load median TTFT that moves by a whole step) must not drag the rest along.
    loss: str = "soft_l1"
    loss_scale: float = 0.05
    # A KV size is read off the server, not timed: its error is the model's, and each memory term moves
    # it little (a 40 % larger sampler term: 1.5 % less KV), so its residual counts this many times.
    memory_weight: float = 5.0


@dataclass
class FitResult:
    """What the fit did: the calibrations, each point's error before and after, what the data showed."""

    prior: Calibration
    fitted: Calibration
    before: list[Error]
    after: list[Error]
    free: list[str]  # constants the fit could move
    unseen: list[str]  # constants no point depends on (left at the prior)
    prior_bound: list[str]  # free, but the data's pull on them is weaker than the prior's
    at_bound: list[str]  # fitted to a bound of their range
    confounded: list[tuple[str, str]]  # pairs the data moves together (only their combination is fitted)
    evaluations: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


class _Problem:
    """The residual function over x (log ratios of the free constants to the prior)."""

    def __init__(self, replay: Replay, prior: Calibration, names: Sequence[str], options: FitOptions) -> None:
        self.replay = replay
        self.prior = prior
        self.names = list(names)
        self.options = options
        self.info = {i.name: i for i in calibration_fields()}
        self.rows = [(i, m) for i, p in enumerate(replay.points) for m in p["measured"] if m != "starts"]
        self.measured = np.array([float(replay.points[i]["measured"][m]) for i, m in self.rows])
        kinds = [replay.points[i]["kind"] for i, _ in self.rows]
        self.weights = np.array([options.memory_weight if k == "memory" else 1.0 for k in kinds])
        self.evaluations = 0
        self._cache: dict[tuple[float, ...], np.ndarray] = {}

    def calibration(self, x: np.ndarray, rounding: bool = False) -> Calibration:
        """The prior with the free constants at x (rounded as the calibration file writes them if asked)."""
        values = {}
        for name, xi in zip(self.names, x, strict=True):
            info = self.info[name]
            value = getattr(self.prior, name) * math.exp(xi)
            if rounding:
                value = rounded(value)
            values[name] = min(max(value, info.low), info.high)
        return self.prior.replace(**values)

    def simulated(self, x: np.ndarray, points: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the simulated value at x (nan: none) and whether it was simulated (all points', or
        only `points`')."""
        cal = self.calibration(x)
        wanted = range(len(self.replay.points)) if points is None else points
        simulated = {i: self.replay.simulate(i, cal) for i in wanted}
        self.evaluations += 1
        done = np.array([i in simulated for i, _ in self.rows], dtype=bool)
        values = [simulated[i].get(m, math.nan) if i in simulated else math.nan for i, m in self.rows]
        return np.array(values, dtype=float), done

    def data_residuals(
        self, x: np.ndarray, points: Sequence[int] | None = None, base: np.ndarray | None = None
    ) -> np.ndarray:
        """log(simulated / measured) per row; with `points`, only their rows are recomputed from `base`."""
        key = tuple(np.round(x, 12))
        if points is None and key in self._cache:
            return self._cache[key]
        values, done = self.simulated(x, points)
        out = np.array(base if base is not None else np.zeros(len(self.rows)), dtype=float)
        for r in np.flatnonzero(done):
            out[r] = self.weights[r] * _log_error(values[r], self.measured[r])
        if points is None:
            self._cache = {key: out}
        return out

    def residuals(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([self.data_residuals(x), self.options.prior_weight * x])

    def data_jacobian(self, x: np.ndarray) -> np.ndarray:
        """Forward differences of the data residuals, each constant moving only the points it can."""
        base = self.data_residuals(x)
        jac = np.zeros((len(self.rows), len(self.names)))
        for j, name in enumerate(self.names):
            points = self.points_seeing(name)
            if not points:
                continue
            h = self.step(x, j)
            moved = x.copy()
            moved[j] += h
            jac[:, j] = (self.data_residuals(moved, points, base) - base) / h
        return jac

    def step(self, x: np.ndarray, j: int) -> float:
        """The forward-difference step of constant j at x: up, or down where up leaves its range."""
        step = self.options.diff_step
        return step if x[j] + step <= self.upper(self.names[j]) else -step

    def start(self) -> np.ndarray:
        """The prior (x = 0), moved one probe step inside a range it sits on the bound of: trf started on
        a bound shortens every step to its distance from it, and stops at once with nothing moved."""
        margin = self.options.diff_step
        return np.array([min(max(0.0, self.lower(n) + margin), self.upper(n) - margin) for n in self.names])

    def seen(self, x: np.ndarray) -> list[bool]:
        """Per constant, whether any simulated value moves with it: a probe step from x, else a factor FAR
        up or down (within its range). Values, not residuals: a miss beyond CLIP is flat in the residual,
        and a constant flat at x (a prefill that streams weights at gemm_eff 1) may matter elsewhere."""
        base, _ = self.simulated(x)
        out = []
        for j, name in enumerate(self.names):
            points = self.points_seeing(name)
            probes = (self.step(x, j), min(FAR, self.upper(name) - x[j]), -min(FAR, x[j] - self.lower(name)))
            out.append(bool(points) and any(self._moves(x, j, h, points, base) for h in probes))
        return out

    def _moves(self, x: np.ndarray, j: int, h: float, points: Sequence[int], base: np.ndarray) -> bool:
        moved = x.copy()
        moved[j] += h
        values, done = self.simulated(moved, points)
        return not np.allclose(values[done], base[done], rtol=1e-9, atol=0.0, equal_nan=True)

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        prior = self.options.prior_weight * np.eye(len(self.names))
        return np.vstack([self.data_jacobian(x), prior])

    def points_seeing(self, name: str) -> list[int]:
        group = self.info[name].group
        return [i for i, p in enumerate(self.replay.points) if group in SEES[p["kind"]]]

    def lower(self, name: str) -> float:
        low = self.info[name].low
        return math.log(low / getattr(self.prior, name)) if low > 0 else -np.inf

    def upper(self, name: str) -> float:
        return math.log(self.info[name].high / getattr(self.prior, name))


def _log_error(simulated: float, measured: float) -> float:
    if not math.isfinite(simulated) or simulated <= 0:
        return -CLIP  # the simulator gives nothing (a config it thinks cannot start): the worst miss
    return float(np.clip(math.log(simulated / measured), -CLIP, CLIP))


def candidates(points: Sequence[dict[str, Any]], prior: Calibration) -> list[FieldInfo]:
    """The constants the points' kinds can see (positive at the prior: a zero cannot be scaled)."""
    groups = {g for p in points for g in SEES[p["kind"]]}
    return [i for i in calibration_fields() if i.group in groups and getattr(prior, i.name) > 0]


def fit_calibration(
    points: Sequence[dict[str, Any]],
    prior: Calibration = DEFAULT_CALIBRATION,
    options: FitOptions = FitOptions(),  # noqa: B008 (frozen)
    progress: Progress | None = None,
) -> FitResult:
    """Fit the constants the points can see, starting from (and pulled weakly toward) `prior`."""
    from scipy.optimize import least_squares

    started = time.monotonic()
    say = progress or (lambda line: None)
    points, notes = _replayable(points)
    replay = Replay(points)
    before = replay.errors(prior)
    names = [i.name for i in candidates(points, prior)]
    probe = _Problem(replay, prior, names, options)
    say(f"probing {len(names)} constants on {len(points)} points ({len(probe.rows)} metrics)")
    seen = probe.seen(probe.start())
    free = [n for n, s in zip(names, seen, strict=True) if s]
    unseen = [n for n, s in zip(names, seen, strict=True) if not s]
    if not free:
        raise AutotuneError(f"nothing to fit: {_why_nothing(probe, before)}")
    problem = _Problem(replay, prior, free, options)
    problem.evaluations = probe.evaluations
    say(f"fitting {len(free)} constants: {', '.join(free)}")
    solution = least_squares(
        _told(problem, say, started),
        problem.start(),
        jac=problem.jacobian,
        bounds=([problem.lower(n) for n in free], [problem.upper(n) for n in free]),
        method="trf",
        max_nfev=options.max_evaluations,
        ftol=options.tolerance,
        xtol=options.tolerance,
        x_scale=1.0,
        loss=options.loss,
        f_scale=options.loss_scale,
    )
    x = solution.x
    fitted = problem.calibration(x, rounding=True)
    jac = problem.data_jacobian(x)
    return FitResult(
        prior=prior,
        fitted=fitted,
        before=before,
        after=replay.errors(fitted),
        free=free,
        unseen=unseen + [i.name for i in calibration_fields() if i.name not in names],
        prior_bound=_prior_bound(free, jac, options.prior_weight),
        at_bound=[n for j, n in enumerate(free) if _at_bound(x[j], problem.lower(n), problem.upper(n))],
        confounded=_confounded(free, jac),
        evaluations=problem.evaluations,
        seconds=time.monotonic() - started,
        notes=notes,
    )


def _told(problem: _Problem, say: Progress, started: float) -> Callable[[np.ndarray], np.ndarray]:
    """`problem.residuals`, saying each evaluation's median error: a fit of many points takes minutes."""
    count = 0

    def residuals(x: np.ndarray) -> np.ndarray:
        nonlocal count
        out = problem.residuals(x)
        count += 1
        errors = np.abs(out[: len(problem.rows)] / problem.weights)
        median = math.expm1(float(np.median(errors))) if len(errors) else 0.0
        limit, seconds = problem.options.max_evaluations, time.monotonic() - started
        say(f"evaluation {count} of at most {limit}: median error {median:.1%} ({seconds:.0f} s)")
        return out

    return residuals


def _replayable(points: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The points a calibration can replay, and a note naming each one left out with its reason."""
    left_out = unreplayable(points)
    if len(left_out) == len(points):
        pid, why = next(iter(left_out.items()))
        raise AutotuneError(
            f"nothing to fit: the simulator predicts that vLLM refuses every point ({pid}: {why})"
        )
    notes = [f"point {pid} is left out of the fit: {why}" for pid, why in left_out.items()]
    return [p for p in points if p["id"] not in left_out], notes


def _why_nothing(probe: _Problem, before: Sequence[Error]) -> str:
    """Why no constant moves any measured metric: what a user can change."""
    if not probe.rows:
        return "the points measure only `starts`, a yes/no no constant's small move changes"
    if all(e.simulated == 0 or not math.isfinite(e.simulated) for e in before):
        return (
            "the simulator predicts that none of the points' configs starts or serves their requests "
            "(a model too large for the GPU, a KV cache too small for max_model_len?): check their model, "
            "gpu, flags and lengths"
        )
    return "no constant moves any measured metric of these points"


def _prior_bound(names: Sequence[str], jac: np.ndarray, weight: float) -> list[str]:
    """Constants whose data curvature (|column|^2) is below the prior's (weight^2): the prior sets them."""
    strength = (jac**2).sum(axis=0)
    return [n for n, s in zip(names, strength, strict=True) if s < weight**2]


def _at_bound(x: float, low: float, high: float) -> bool:
    return x - low < 1e-3 or high - x < 1e-3


def _confounded(names: Sequence[str], jac: np.ndarray, threshold: float = 0.98) -> list[tuple[str, str]]:
    """Pairs of constants whose Jacobian columns are (anti)parallel: the data sees only a combination."""
    norms = np.linalg.norm(jac, axis=0)
    pairs = []
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            if norms[a] > 0 and norms[b] > 0:
                cosine = abs(float(jac[:, a] @ jac[:, b])) / (norms[a] * norms[b])
                if cosine > threshold:
                    pairs.append((names[a], names[b]))
    return pairs
