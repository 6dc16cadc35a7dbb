"""The guided run's GPU-hour budget (`--gpu-hours`): what the next trial is charged, and whether it fits.

A trial's cost is known only once it ran, so the next is charged the dearest trial so far, scaled to its
predicted rate when the objective is a throughput (a capacity search's windows hold a set number of
requests, so its GPU time goes as 1 / capacity: a 70B config at half the defaults' rate costs twice their
search). Before any trial served load the charge is the pre-run estimate (vLLM's defaults' search on the
simulator), scaled so to the next config's predicted value against the defaults' predicted one: under
an ITL SLO the defaults' search cost 4x the guide's first pick's, and a budget of 3 such picks launched
none. A config that failed to start cost its startup only. Trials still running are charged as the
next, or as the caps the run gave them (tune/tuner.py, below).

The charge decides whether a trial starts; the cap bounds what it spends: each trial's capacity search
gets a share of what is left (`trial_cap_s`) and stops before a window that would pass it, so a search
dearer than its charge (one whose windows near its capacity are too close to call and are measured
again) cannot carry the run past --gpu-hours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.core.values import counted
from autotune.measure.capacity_report import BurstSummary


def share_s(left_s: float, reserved_s: float, sharing: int) -> float:
    """A run's cap for one more trial or repeat: the GPU seconds `left_s` left after the running ones'
    caps (`reserved_s`), shared evenly by the `sharing` that may start now, so that side by side they
    cannot pass it together."""
    return max(0.0, left_s - reserved_s) / max(1, sharing)


@dataclass(frozen=True)
class Observation:
    """A finished real trial as the guide sees it."""

    number: int
    key: str
    params: dict[str, Any]
    predicted: float | None  # the guide's raw prediction (None: not predicted to meet the SLOs)
    measured: float | None  # the objective's value when feasible (None: failed or missed the SLOs)
    gpu_s: float
    chosen: dict[str, Any] = field(default_factory=dict)  # the prediction when it was chosen
    searched: bool = True  # it served load (False: it failed to start, and cost a startup only)
    interrupted: bool = False  # cut short (Ctrl-C): its GPU time was spent, nothing measured
    bursts: tuple[BurstSummary, ...] = ()  # its capacity search's saturation bursts (tune/guide_check.py)


def total_gpu_s(observed: Sequence[Observation]) -> float:
    """The GPU seconds the observed trials spent."""
    return sum(o.gpu_s for o in observed)


@dataclass(frozen=True)
class Budget:
    """The spend limit and how a trial is charged against it (module docstring)."""

    gpu_hours: float | None = None  # None: no limit
    first_trial_gpu_s: float | None = None  # the pre-run estimate of a trial's cost (vLLM's defaults')
    maximize: bool = True  # the objective is a throughput (its cost scales with 1 / value)
    first_trial_value: float | None = None  # the objective the estimated trial is predicted to reach

    def next_cost_s(self, observed: Sequence[Observation], value: float | None) -> float:
        """What the next trial (predicted objective `value`; None: not predicted) is charged, in GPU
        seconds: the dearest so far, scaled to `value` for a throughput; until a trial served load, at
        least the pre-run estimate, scaled so too. A trial cut short (Ctrl-C, or its cap) spent a part of a
        trial's cost: at least that much."""
        costs = [o.gpu_s for o in observed if o.gpu_s > 0]
        per = value if self.maximize and value is not None and value > 0 else None  # what costs scale by
        if per is not None:
            scaled = [o.gpu_s * o.measured / per for o in observed if o.gpu_s > 0 and o.measured]
            if scaled:
                return max([*scaled, *(o.gpu_s for o in observed if o.interrupted)])
        if any(o.searched for o in observed):
            return max([*costs, 0.0])
        estimate = self.first_trial_gpu_s or 0.0
        if per is not None and self.first_trial_value:
            estimate *= self.first_trial_value / per
        return max([*costs, estimate])

    def trials_left(
        self,
        observed: Sequence[Observation],
        value: float | None,
        in_flight: int = 0,
        reserved_s: float | None = None,
    ) -> float:
        """How many trials like the next (predicted objective `value`) the budget still affords, the
        `in_flight` running ones charged as such, or as the caps they were given (`reserved_s`: what
        they may still spend at most, trial_cap_s); infinite without a limit or before any trial has a
        cost."""
        if self.gpu_hours is None:
            return math.inf
        next_s = self.next_cost_s(observed, value)
        left_s = self.gpu_hours * 3600 - total_gpu_s(observed)
        if next_s <= 0:
            return math.inf if left_s > 0 else 0.0
        return (left_s - reserved_s) / next_s if reserved_s is not None else left_s / next_s - in_flight

    def stop(
        self,
        observed: Sequence[Observation],
        value: float | None,
        in_flight: int,
        what: str = "the next trial",
        reserved_s: float | None = None,
    ) -> str | None:
        """Why the next trial (`what`, e.g. "vLLM's defaults") must not start: the spend, the running
        trials (each charged as the next, or as its cap: `reserved_s`) and the next would pass the
        budget. None: it fits."""
        if self.trials_left(observed, value, in_flight, reserved_s) >= 1:
            return None
        spent = total_gpu_s(observed) / 3600
        next_s = self.next_cost_s(observed, value)
        running = f", {counted(in_flight, 'trial')} running" if in_flight else ""
        if in_flight and reserved_s:
            running += f" with up to {reserved_s / 3600:.2f} GPU-h left to them"
        return (
            f"budget: {what}, about {next_s / 3600:.2f} GPU-h, would pass --gpu-hours "
            f"{self.gpu_hours:g} ({spent:.2f} GPU-h spent{running})"
        )

    def spent_out(self, observed: Sequence[Observation]) -> str | None:
        """Why no trial may start whatever it would cost: the study spent the whole budget already (a
        resume with a --gpu-hours below its spend). None: some is left, or there is no limit."""
        spent = total_gpu_s(observed) / 3600
        if self.gpu_hours is None or spent < self.gpu_hours:
            return None
        return f"budget: {spent:.2f} GPU-h spent of --gpu-hours {self.gpu_hours:g}, nothing left for a trial"

    def trial_cap_s(self, spent_s: float, reserved_s: float, sharing: int) -> float | None:
        """The GPU seconds a trial starting now may spend (its capacity search stops before a window that
        would pass them): what the budget has left after `spent_s`, shared (`share_s`) with the running
        trials' caps (`reserved_s`) and the `sharing` trials that may start now, this one included.
        None: no limit."""
        return (
            None if self.gpu_hours is None else share_s(self.gpu_hours * 3600 - spent_s, reserved_s, sharing)
        )

    def waits(self, observed: Sequence[Observation], busy: int, reserved_s: float | None = None) -> bool:
        """Whether to start nothing more until a running trial ends: with a limit, while no trial's cost
        is known (no pre-run estimate, none served load), the budget cannot charge another one, and
        every free GPU would start one blind; and while the running trials' caps (`reserved_s`) hold
        what a trial as dear as the dearest so far would need: their costs, once known, may free it
        (stopping then would leave it unspent)."""
        if self.gpu_hours is None or not busy:
            return False
        if reserved_s is not None and self.trials_left(observed, None, reserved_s=reserved_s) < 1:
            return True
        return not self.first_trial_gpu_s and not any(o.searched for o in observed)
