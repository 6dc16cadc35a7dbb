"""Re-measure the top candidates and the baseline with other seeds before recommending.

On a real GPU two measurements of one config differ by a few percent, so the best of fifty trials is
partly the luckiest. Before the recommendation, `TOP_CANDIDATES` configs (the one the recommendation
would pick and the best others by the primary objective) and the baseline (vLLM's defaults) are measured
again, each with `repeats` other workload seeds (other requests, other arrival times; the simulator
with `--noise` draws other noise too). The primary objective of every repeat is kept in the study's
`remeasured` attr (trial number -> {repeat index -> value}), written after each one, so a resumed run
continues where it stopped and the recommendation (autotune/tune/recommendation.py) picks among them by
the mean of their runs and pairs the runs seed by seed to give the gain an interval. Under a GPU-hour
budget (a guided run's --gpu-hours) only the repeats the budget still affords run.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import optuna

from autotune.core.config import gpus_per_replica
from autotune.core.errors import FailureKind
from autotune.core.values import brief
from autotune.dispatch.executor import Executor
from autotune.dispatch.protocol import free_slots
from autotune.measure.result import TrialResult
from autotune.trial.task import SearchPlan
from autotune.tune.front import baseline, contenders, recommend
from autotune.tune.guide_budget import share_s
from autotune.tune.objectives import ObjectiveSet
from autotune.tune.recommendation import resolution_of
from autotune.tune.run_records import TunerOptions
from autotune.tune.study import TrialRecord, held_gpu_seconds, records

TOP_CANDIDATES = 3
ATTR = "remeasured"
GPU_ATTR = "remeasured_gpu_seconds"  # what the repeats cost, all of their GPUs (the run's GPU time spent)
TARGETS_ATTR = "remeasure_targets"  # the trials the run meant to re-measure, whether the budget let it or not
FAILED_ATTR = "remeasure_failed"  # trial number -> {repeat index -> "failure: message"}: not in the means
# Repeats on a real backend still running: job number -> [launch, time.time(); GPUs]. A driver killed
# outright (SIGKILL) charges nothing itself; the next one charges these (charge_dead_repeats).
IN_FLIGHT_ATTR = "remeasuring"
POLL_S = 0.5


@dataclass(frozen=True)
class Repeat:
    """One more measurement of a finished trial's config, with another seed."""

    trial: TrialRecord
    index: int  # 1..repeats: the seed is the run's seed + index

    @property
    def job_number(self) -> int:
        """The executor's key: negative, so it never meets a trial number."""
        return -(self.trial.number * 1000 + self.index)


@dataclass
class RepeatBudget:
    """What the repeats may still spend, in GPU-seconds (inf: no limit). A repeat is charged the dearest
    run of a target so far (first runs and finished repeats): one config's search costs up to 4x more
    in one run than in another (its noise decides how many probes it takes), so its own first run is no
    bound. The charge decides whether a repeat starts; its cap (`cap_s`, its share of what is left) stops
    its search before a window that would pass the budget."""

    left_s: float
    dearest_s: float

    @classmethod
    def of(cls, todo: Sequence[Repeat], budget_s: float | None) -> RepeatBudget:
        """The budget for `todo` (None: no limit), charging from its targets' first runs."""
        left = math.inf if budget_s is None else budget_s
        return cls(left, max((r.trial.gpu_seconds for r in todo), default=0.0))

    def fits(self, reserved_s: float = 0.0) -> bool:
        """Whether one more repeat fits beside the running ones, whose caps hold `reserved_s`."""
        return self.dearest_s <= self.left_s - reserved_s

    def cap_s(self, reserved_s: float, sharing: int) -> float | None:
        """What a repeat starting now may spend: what is left, shared (`share_s`) with the running
        repeats' caps (`reserved_s`) and the `sharing` repeats that may start now (None: no limit)."""
        return None if math.isinf(self.left_s) else share_s(self.left_s, reserved_s, sharing)

    def charge(self, gpu_s: float) -> None:
        """A finished repeat's cost (all of its GPUs)."""
        self.left_s -= gpu_s
        self.dearest_s = max(self.dearest_s, gpu_s)


def targets(recs: Sequence[TrialRecord], maximize: Sequence[bool]) -> list[TrialRecord]:
    """The config the recommendation would pick, the best others by the primary objective
    (TOP_CANDIDATES in all, best first) and the baseline, unless it failed (crashed, did not start);
    none when no config met the SLOs.

    The pick is among the configs tied on throughput, by latency: it need not be one of the best few
    by throughput, and its gain can only get an interval if it was measured again. The others are the
    ones whose single run came nearest the best: the true best among them can have measured lower once.
    """
    pick = recommend(recs, maximize, resolution_of)
    sign = -1.0 if maximize[0] else 1.0
    ranked = sorted(contenders(recs), key=lambda r: sign * (r.values or [0.0])[0])
    chosen = ([pick] if pick is not None else []) + [
        r for r in ranked if pick is None or r.number != pick.number
    ]
    chosen = chosen[:TOP_CANDIDATES]
    if not chosen:
        return []  # nothing met the SLOs: no gain to measure, and a failed baseline would fail again
    base = baseline(recs)
    if base is not None and base.values and not base.failure and all(r.number != base.number for r in chosen):
        chosen.append(base)
    return chosen


def plan(chosen: Sequence[TrialRecord], repeats: int) -> list[Repeat]:
    """The repeats in the order they run: round by round (every target's first repeat, then the
    second...), the pick and the baseline first in each, so that a budget that stops them early still
    leaves the gain paired runs and every candidate as many repeats as can be afforded."""
    rest = list(chosen[1:])
    ordered = [*chosen[:1], *(r for r in rest if r.baseline), *(r for r in rest if not r.baseline)]
    return [Repeat(trial, index) for index in range(1, repeats + 1) for trial in ordered]


@dataclass(frozen=True)
class StoredRepeats:
    """What a study keeps of its repeats (all empty: none were asked for, or none ran)."""

    values: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # trial -> {index: value}
    gpu_s: float = 0.0  # what they spent, all of their GPUs
    # The trials the run meant to re-measure, whether the budget let it or not: outputs/outcome.py says
    # when the recommendation rests on one run of one.
    planned: tuple[int, ...] = ()
    # The repeats that failed (trial -> {index: "failure: message"}): they measured nothing, so they are
    # left out of their config's mean and of the paired gain, and the report says why.
    failed: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, study: optuna.Study) -> StoredRepeats:
        """The repeats `study` holds (a study from before a record was kept reads it as empty)."""
        attrs = study.user_attrs
        return cls(
            attrs.get(ATTR) or {},
            float(attrs.get(GPU_ATTR) or 0.0),
            tuple(int(n) for n in attrs.get(TARGETS_ATTR) or []),
            attrs.get(FAILED_ATTR) or {},
        )

    def ended(self, repeat: Repeat) -> bool:
        """Whether `repeat` ran to a value or to a failure (a resumed run runs neither again)."""
        number, index = str(repeat.trial.number), str(repeat.index)
        return index in self.values.get(number, {}) or index in self.failed.get(number, {})


def announce(repeats: int, budget_s: float | None) -> bool:
    """Say what the re-measuring does (`budget_s`: the GPU-seconds left; None: no limit); False when
    the budget has nothing left for it."""
    if budget_s is not None and budget_s <= 0:
        print("autotune: the GPU-hour budget is spent: no re-measuring", file=sys.stderr)
        return False
    within = ""
    if budget_s is not None:
        within = f", as many as the {budget_s / 3600:.2f} GPU-h left in the budget allow"
    print(
        f"autotune: re-measuring the top {TOP_CANDIDATES} configs and the baseline with {repeats} other "
        f"seed(s) each{within}",
        file=sys.stderr,
    )
    return True


def remeasure(
    study: optuna.Study,
    executor: Executor,
    objectives: ObjectiveSet,
    options: TunerOptions,
    interrupted: Callable[[], bool] = lambda: False,
    budget_s: float | None = None,
) -> int:
    """Run the `options.repeats` repeats not yet in the study, once announced (`announce`); returns how
    many ran. Raises KeyboardInterrupt when `interrupted()` turns true (what finished is stored).

    `budget_s`: the GPU-seconds they may still spend (None: no limit), charged as RepeatBudget says:
    a repeat starts only when it and every running one fit, each at the dearest run so far.
    With `options.real_time` (a server per run) repeats cut short by an interrupt spent the GPU time
    they held."""
    if options.repeats <= 0:
        return 0
    maximize = [o.maximize for o in objectives.objectives]
    chosen = targets(records(study), maximize)
    study.set_user_attr(TARGETS_ATTR, [r.number for r in chosen])
    if not chosen or not announce(options.repeats, budget_s):  # nothing measured: nothing to repeat
        return 0
    repeats, seed, run_dir, real_time = options.repeats, options.seed, options.run_dir, options.real_time
    stored = StoredRepeats.of(study)
    done: dict[str, dict[str, float]] = {k: dict(v) for k, v in stored.values.items()}
    failed: dict[str, dict[str, str]] = {k: dict(v) for k, v in stored.failed.items()}
    todo = [r for r in plan(chosen, repeats) if not stored.ended(r)]
    budget = RepeatBudget.of(todo, budget_s)
    running: dict[int, Repeat] = {}
    caps: dict[int, float] = {}  # job number -> its cap (all its GPUs), while it runs
    started: dict[int, float] = {}  # job number -> when it was submitted
    in_flight: dict[str, list[float]] = {}  # IN_FLIGHT_ATTR, on a real backend
    ran = 0
    while todo or running:
        if interrupted():
            if real_time:
                _charge_held(study, running, started)
            raise KeyboardInterrupt
        # A config that no longer fits (a node of the cluster was lost) is not re-measured.
        todo = [r for r in todo if executor.fits(r.trial.engine_config())]
        while todo and executor.can_start(todo[0].trial.engine_config()):
            if not budget.fits(sum(caps.values())):  # the next could pass the budget
                if not running:  # nothing running will hand budget back: the rest cannot fit
                    print(
                        f"autotune: {len(todo)} repeat(s) left out: each could cost up to "
                        f"{budget.dearest_s / 3600:.2f} GPU-h, more than the budget has left",
                        file=sys.stderr,
                    )
                    todo.clear()
                break
            repeat = todo.pop(0)
            trial_dir = (
                run_dir / "trials" / str(repeat.trial.number) / f"repeat-{repeat.index}" if run_dir else None
            )
            config = repeat.trial.engine_config()
            sharing = min(len(todo) + 1, free_slots(executor, config))
            plan_ = _plan(repeat, budget.cap_s(sum(caps.values()), sharing), caps)
            executor.submit(repeat.job_number, config, seed + repeat.index, trial_dir, plan_)
            running[repeat.job_number] = repeat
            started[repeat.job_number] = time.monotonic()
            if real_time:
                gpus = gpus_per_replica(repeat.trial.config)
                in_flight[str(repeat.job_number)] = [round(time.time(), 3), gpus]
                study.set_user_attr(IN_FLIGHT_ATTR, in_flight)
        for number, result in executor.wait(POLL_S):
            repeat = running.pop(number)
            caps.pop(number, None)
            _keep(study, repeat, result, objectives, done, failed)
            gpu_s = result.gpu_seconds * gpus_per_replica(repeat.trial.config)
            _add_gpu_s(study, gpu_s)
            if in_flight.pop(str(number), None) is not None:
                study.set_user_attr(IN_FLIGHT_ATTR, in_flight)
            budget.charge(gpu_s)
            ran += 1
    return ran


def _keep(
    study: optuna.Study,
    repeat: Repeat,
    result: TrialResult,
    objectives: ObjectiveSet,
    done: dict[str, dict[str, float]],
    failed: dict[str, dict[str, str]],
) -> None:
    """Store a finished repeat's primary objective in `done` (the study's ATTR), unless it has none to
    give: one the budget cut short, or one that failed (in `failed`, the study's FAILED_ATTR: its 0 would
    read as a measurement)."""
    number = repeat.trial.number
    if result.cut_by_budget:  # a lower bound, or no verdict: the mean of its config takes neither
        print(
            f"autotune: a repeat of trial #{number} stopped at its share of the budget (not counted)",
            file=sys.stderr,
        )
    elif result.failure not in (None, FailureKind.EARLY_ABORT):  # an early abort keeps its metrics
        why = f"{result.failure}: {brief(result.message)}" if result.message else str(result.failure)
        print(f"autotune: a repeat of trial #{number} failed ({why}): not counted", file=sys.stderr)
        failed.setdefault(str(number), {})[str(repeat.index)] = why
        study.set_user_attr(FAILED_ATTR, failed)
    else:
        done.setdefault(str(number), {})[str(repeat.index)] = objectives.objectives[0].value(result)
        study.set_user_attr(ATTR, done)


def _plan(repeat: Repeat, cap_s: float | None, caps: dict[int, float]) -> SearchPlan:
    """A repeat's search plan with its cap (RepeatBudget.cap_s; None: none), recorded in `caps` while it
    runs."""
    if cap_s is None:
        return SearchPlan()
    caps[repeat.job_number] = cap_s
    return SearchPlan(max_gpu_s=cap_s / gpus_per_replica(repeat.trial.config))


def _add_gpu_s(study: optuna.Study, gpu_s: float) -> None:
    """Add `gpu_s` (all of a repeat's GPUs) to what the study's repeats spent."""
    study.set_user_attr(GPU_ATTR, StoredRepeats.of(study).gpu_s + gpu_s)


def _charge_held(study: optuna.Study, running: dict[int, Repeat], started: dict[int, float]) -> None:
    """The repeats an interrupt cut short held their GPUs until now: that time was spent."""
    held = sum(held_gpu_seconds(started[n], r.trial.config) for n, r in running.items())
    _add_gpu_s(study, held)
    study.set_user_attr(IN_FLIGHT_ATTR, {})


def charge_dead_repeats(study: optuna.Study, died: float) -> None:
    """The repeats a dead driver left in flight held their GPUs from launch until it died (`died`: its
    last lease renewal, time.time(); 0: unknown, nothing is charged): the repeats' spend counts that."""
    in_flight = study.user_attrs.get(IN_FLIGHT_ATTR)
    if not in_flight:
        return
    held = sum(max(0.0, died - launched) * gpus for launched, gpus in in_flight.values()) if died else 0.0
    _add_gpu_s(study, held)
    study.set_user_attr(IN_FLIGHT_ATTR, {})
