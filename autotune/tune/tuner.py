"""The run loop of `autotune run`: ask -> check -> dedupe -> dispatch -> tell -> progress.

The driver is the study's only writer. A suggestion that breaks one of vLLM's validity rules, or
needs more GPUs than the pool has, is told as a violation at once (nothing is launched, no GPU time);
a config already measured is told the earlier result (`duplicate_of`) instead of running again, and a
duplicate of a running trial waits for it. A config the memory model predicts to fail to start
(autotune/tune/screen.py) is told as a violation with the predicted reason (`screened`), unlaunched too.
`--n-trials` counts measured configs: not the rejected or screened ones, nor duplicates (they cost
nothing; the sampler learns the invalid region and the known results from them). A sampler that
proposes only configs it has seen, MAX_DUPLICATES_IN_A_ROW times in a row, has converged: the run ends.
Ctrl-C cancels the running trials and marks them FAIL; every finished trial is already in the
storage, so `--resume` continues where the run stopped. The loop takes Ctrl-C between its steps (a
second one interrupts at once): a KeyboardInterrupt raised wherever the main thread happens to be can
land in a finalizer, where Python prints it and goes on, and the run would not stop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import EngineConfig, gpus_per_replica
from autotune.core.errors import FailureKind, SetupLost
from autotune.core.interrupts import deferred_ctrl_c, on_stop
from autotune.dispatch.protocol import TrialExecutor, free_slots
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.trial.live import read_probe
from autotune.trial.task import SearchPlan
from autotune.tune.halt import FirstFailures
from autotune.tune.objectives import ObjectiveSet, metric_unit
from autotune.tune.progress import Progress, running_params
from autotune.tune.remeasure import StoredRepeats, remeasure
from autotune.tune.result_attrs import placement_attrs
from autotune.tune.run_records import RunSummary, TunerOptions
from autotune.tune.samplers import sampler_exhausted
from autotune.tune.screen import MemoryScreen, Screening
from autotune.tune.space import SearchSpace, violations
from autotune.tune.study import (
    LAUNCHED_AT_ATTR,
    config_attr,
    config_key,
    fail_stale_trials,
    held_gpu_seconds,
    tell_cut_short,
    tell_duplicate,
    tell_result,
)
from autotune.tune.tally import Tally

POLL_S = 0.5
CAP_ATTR = "gpu_seconds_cap"  # a budgeted trial's share of --gpu-hours, all its GPUs (GuidedSearch.plan)
# Suggestions rejected before launch (vLLM's validity rules, startup screening) cost no GPU time and do
# not count toward --n-trials; this bound stops a space that is almost all invalid from looping forever.
MAX_REJECTS_PER_TRIAL = 5
# Duplicates are free and do not count toward --n-trials either; this many in a row means the sampler
# keeps proposing what it has measured (it has converged, or a small space is exhausted): stop.
MAX_DUPLICATES_IN_A_ROW = 10


@dataclass
class _Pending:
    trial: optuna.Trial
    config: EngineConfig
    key: str
    duplicates: list[optuna.Trial] = field(default_factory=list)
    cap_s: float = 0.0  # the GPU seconds its search may spend under --gpu-hours (all its GPUs; 0: none)


class Tuner:
    """Drives one study to `n_trials` COMPLETE trials (or the timeout) on an Executor."""

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        objectives: ObjectiveSet,
        slos: Sequence[Slo],
        executor: TrialExecutor,
        options: TunerOptions,
        progress: Progress | None = None,
        max_position_embeddings: int | None = None,
        screen: MemoryScreen | None = None,
        on_told: Callable[[], None] | None = None,
        guide: Any = None,
    ) -> None:
        self.study = study
        self.space = space
        self.objectives = objectives
        self.slos = list(slos)
        self.executor = executor
        self.options = options
        self.progress = progress
        self.max_position_embeddings = max_position_embeddings
        self.screen = screen  # None: every valid config is launched
        self.on_told = on_told  # called after each trial told (e.g. the dashboard note)
        self.guide = guide  # a GuidedSearch (tune/guided.py): enqueues each next trial, or says stop
        self._stop_reason: str | None = None
        self._first_failures = FirstFailures()
        self._halt: str | None = None  # the first launched trials all failed alike: the setup is broken
        self._known: dict[str, FrozenTrial] = {}
        self._running: dict[int, _Pending] = {}  # trial number -> its pending record
        self._queued: list[_Pending] = []  # asked, valid, waiting for enough free GPUs
        self._tally = Tally(maximize=objectives.objectives[0].maximize)
        self._told = 0
        self._interrupted = False  # Ctrl-C seen: stop at the next step
        self._started = time.monotonic()
        self._submitted: dict[int, float] = {}  # trial number -> when it was started (progress display)

    def run(self) -> RunSummary:
        """Run until n_trials trials are COMPLETE or the timeout; Ctrl-C cancels and re-raises."""
        start = self._started = time.monotonic()
        try:
            with self._ctrl_c_between_steps():
                self._load_existing()  # inside: a stop while the study is read is a flag, never swallowed
                timed_out = self._loop(start)
                repeated = 0 if timed_out else self._remeasure()
        except (KeyboardInterrupt, SetupLost):  # the cluster or engine gone: stop like Ctrl-C, trials kept
            self._abandon()
            raise
        finally:
            if self.progress:
                self.progress.close()
        return RunSummary(
            completed=self._tally.done,
            unstarted=self._tally.unstarted,
            rejected=self._tally.rejected,
            told=self._told,
            screened=self._tally.screened,
            wall_s=time.monotonic() - start,
            timed_out=timed_out,
            repeated=repeated,
            duplicates=self._tally.duplicates,
            converged=self._converged(),
            stop_reason=self._stop_reason,
            halted=self._halt,
        )

    def _remeasure(self) -> int:
        """Re-measure the top candidates and the baseline with other seeds (see tune/remeasure.py)."""
        if self.progress and self.options.repeats > 0:
            self.progress.close()
        left_s = self._budget_left_s()
        return remeasure(
            self.study, self.executor, self.objectives, self.options, lambda: self._interrupted, left_s
        )

    def _budget_left_s(self) -> float | None:
        """GPU-seconds left under --gpu-hours after every trial and repeat so far (None: no budget)."""
        if self._budget_h is None:
            return None
        return max(0.0, self._budget_h * 3600 - self._spent_s())

    def _spent_s(self) -> float:
        """GPU-seconds every trial and repeat so far spent."""
        return self._tally.gpu_s + StoredRepeats.of(self.study).gpu_s

    @property
    def _budget_h(self) -> float | None:
        """A guided run's --gpu-hours (None: no budget, or not a guided run)."""
        return getattr(getattr(self.guide, "options", None), "gpu_hours", None)

    def _loop(self, start: float) -> bool:
        """Ask, dispatch and tell until the budget is spent or the timeout passed (then True)."""
        while True:
            if self._interrupted:
                raise KeyboardInterrupt
            timed_out = self._timed_out(start)
            self._fill(timed_out)
            if not self._running and not self._queued:
                if timed_out or self._budget_spent():
                    return timed_out
                if self.executor.can_start():
                    continue  # every asked trial was told at once (invalid or duplicate): ask more
                # nothing runs and nothing can start (lost GPUs): the executor's wait says why
            for number, result in self.executor.wait(POLL_S):
                self._finish(number, result)
            self._show()

    @contextlib.contextmanager
    def _ctrl_c_between_steps(self) -> Iterator[None]:
        """While the loop runs, a first stop (Ctrl-C, SIGTERM, SIGHUP: core/interrupts.py) only sets a
        flag the loop reads; a second one raises."""

        def on_stop_signal() -> None:
            if self._interrupted:
                raise KeyboardInterrupt
            self._interrupted = True

        with on_stop(on_stop_signal):
            yield

    # -- asking and dispatching -------------------------------------------------------------------------

    def _outstanding(self) -> int:
        """Measured configs plus the ones on their way (duplicates waiting on them are free)."""
        return self._tally.done + len(self._running) + len(self._queued)

    def _fill(self, timed_out: bool) -> None:
        """Start queued trials, then ask new ones while slots are free and the budget allows."""
        self._drop_misfits()
        while self._queued and self.executor.can_start(self._queued[0].config):
            self._submit(self._queued.pop(0))
        while not timed_out and not self._queued and self.executor.can_start():
            if self._budget_spent() or self._guide_waits() or self._guide_stops():
                return
            trial = self.study.ask()
            params = self.space.suggest(trial)
            if not self._dispatch(trial, self.space.config(params)):
                # It waits on a running trial: ask again once a result is in. A started grid proposes
                # its running points until they finish, and a free slot would ask forever.
                return

    def _dispatch(self, trial: optuna.Trial, config: EngineConfig) -> bool:
        """Tell, launch or queue a suggestion; False when it waits on a running trial (a duplicate)."""
        key = config_key(config)
        problems = violations(config, self.max_position_embeddings)
        if not problems and not self.executor.fits(config):
            problems = [self.executor.misfit(config) or "does not fit the GPUs"]
        if problems:
            self._tell_unlaunched(trial, config, key, problems[0])
        elif key in self._known:  # a measurement beats a prediction (a study resumed after --no-screen)
            self._record(tell_duplicate(self.study, trial, self._known[key]))
        elif (screening := self._screen(config)) is not None:
            trial.set_user_attr("screened", True)
            self._tell_unlaunched(trial, config, key, screening)
        elif (pending := self._pending_for(key)) is not None:
            pending.duplicates.append(trial)
            return False
        else:
            pending = _Pending(trial=trial, config=config, key=key)
            if self.executor.can_start(config):
                self._submit(pending)
            else:
                self._queued.append(pending)
        return True

    def _drop_misfits(self) -> None:
        """Queued trials that can no longer run (a lost node took the GPUs they need) are told why."""
        for pending in [p for p in self._queued if not self.executor.fits(p.config)]:
            self._queued.remove(pending)
            message = self.executor.misfit(pending.config) or "does not fit the GPUs"
            frozen = self._tell_unlaunched(pending.trial, pending.config, pending.key, message)
            for duplicate in pending.duplicates:
                self._record(tell_duplicate(self.study, duplicate, frozen))

    def _tell_unlaunched(
        self, trial: optuna.Trial, config: EngineConfig, key: str, why: str | Screening
    ) -> FrozenTrial:
        """Tell a config that is not launched: invalid, too large for the GPUs, or screened."""
        trial.set_user_attr("launched", False)
        if isinstance(why, Screening):
            return self._tell(trial, why.result(config), key)
        return self._tell(
            trial, TrialResult(config=config, failure=FailureKind.INVALID_CONFIG, message=why), key
        )

    def _screen(self, config: EngineConfig) -> Screening | None:
        return self.screen.check(config) if self.screen is not None else None

    def _budget_spent(self) -> bool:
        """Enough trials asked, too many rejected suggestions, or nothing new left to ask (a full grid)."""
        return (
            self._outstanding() >= self.options.n_trials
            or self._too_many_rejects()
            or self._converged()
            or sampler_exhausted(self.study)
            or self._stop_reason is not None
            or self._halt is not None
        )

    def _guide_waits(self) -> bool:
        """A guided run under a budget waits for the first trial's cost before it starts another."""
        busy = len(self._running) + len(self._queued)
        return self.guide is not None and self.guide.waits(self.study, busy, self._reserved_s())

    def _guide_stops(self) -> bool:
        """A guided run: the guide enqueues the next config, says why the run stops, or holds (its stop
        holds while trials still run: nothing starts until they end, and it decides then)."""
        if self.guide is None:
            return False
        busy = [p.key for p in (*self._running.values(), *self._queued)]
        self._stop_reason = self.guide.step(self.study, busy, self._reserved_s())
        return self._stop_reason is not None or self.guide.holding

    def _converged(self) -> bool:
        return self._tally.duplicate_streak >= MAX_DUPLICATES_IN_A_ROW

    def _too_many_rejects(self) -> bool:
        return self._tally.rejected > MAX_REJECTS_PER_TRIAL * self.options.n_trials

    def _pending_for(self, key: str) -> _Pending | None:
        return next((p for p in (*self._running.values(), *self._queued) if p.key == key), None)

    def _submit(self, pending: _Pending) -> None:
        number = pending.trial.number
        trial_dir = self.options.run_dir / "trials" / str(number) if self.options.run_dir else None
        pending.trial.set_user_attr("config", config_attr(pending.config))  # kept should it be cut short
        if self.options.real_time:  # should the driver die, a resume charges the GPU time until then
            pending.trial.set_user_attr(LAUNCHED_AT_ATTR, round(time.time(), 3))
        self.executor.submit(number, pending.config, self.options.seed, trial_dir, self._plan(pending))
        self._running[number] = pending
        self._submitted[number] = time.monotonic()

    def _plan(self, pending: _Pending) -> SearchPlan:
        """A guided trial's plan (GuidedSearch.plan), given the GPUs left beside it; its cap reserved."""
        if self.guide is None:
            return SearchPlan()
        # the trials that may start now: as many as the free GPUs and --n-trials allow
        slots = min(free_slots(self.executor, pending.config), self.options.n_trials - self._outstanding())
        plan = self.guide.plan(self.study, pending.trial, self._spent_s(), self._reserved_s(), slots)
        if plan.max_gpu_s is not None:
            pending.cap_s = plan.max_gpu_s * gpus_per_replica(pending.config.params())
            pending.trial.set_user_attr(CAP_ATTR, round(pending.cap_s, 3))
        return plan

    def _reserved_s(self) -> float | None:
        """Under a budget, the GPU seconds the running trials may still spend at most: their caps."""
        return sum(p.cap_s for p in self._running.values()) if self._budget_h is not None else None

    # -- telling ------------------------------------------------------------------------------------------

    def _finish(self, number: int, result: TrialResult) -> None:
        pending = self._running.pop(number)
        if result.placement is not None:  # where it ran: Ray placed it (node, devices)
            for name, value in placement_attrs(result.placement).items():
                pending.trial.set_user_attr(name, value)
        self._submitted.pop(number, None)
        frozen = self._tell(pending.trial, result, pending.key)
        self._halt = self._halt or self._first_failures.record(frozen)
        for duplicate in pending.duplicates:
            self._record(tell_duplicate(self.study, duplicate, frozen))

    def _tell(self, trial: optuna.Trial, result: TrialResult, key: str) -> FrozenTrial:
        if result.failure == FailureKind.BUDGET_SPENT:  # no verdict: not a config that misses the SLOs
            frozen = tell_cut_short(self.study, trial, result, key)
            self._record(frozen)
            return frozen
        frozen = tell_result(self.study, trial, result, self.objectives, self.slos, key)
        if trial.user_attrs.get("launched", True):
            self._known[key] = frozen
        self._record(frozen)
        return frozen

    def _record(self, frozen: FrozenTrial) -> None:
        """Count a told trial for the progress line."""
        self._told += 1
        self._tally.record(frozen)
        if self.on_told is not None:
            self.on_told()

    def _load_existing(self) -> None:
        """On resume: count the finished trials and remember their configs for dedupe."""
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            key = frozen.user_attrs.get("config_key")
            measured = frozen.state == TrialState.COMPLETE and frozen.user_attrs.get("launched", True)
            if key and measured and "duplicate_of" not in frozen.user_attrs:
                self._known.setdefault(key, frozen)
            self._record(frozen)  # a FAIL one (cut short) counts its GPU time only
        self._told = 0

    def _abandon(self) -> None:
        """Ctrl-C: mark every untold trial FAIL (it was never measured), then cancel what runs.

        All of the study's RUNNING trials are this run's, including one the interrupt caught between
        `ask` and the bookkeeping, or in the middle of its `tell`. They are marked first, a stop during
        it held until it is done: a second Ctrl-C during the cancel's grace had left them RUNNING.
        """
        with deferred_ctrl_c():
            placements = self.executor.placements()  # before the cancel, which forgets them
            fail_stale_trials(self.study, self._held_gpu_seconds(), placements)
        self.executor.cancel_all()
        self._running.clear()
        self._queued.clear()

    def _held_gpu_seconds(self) -> dict[int, float]:
        """With a server per trial (real time), the GPU time each running trial has held so far: spent,
        though nothing was measured (the budget counts it). Empty for in-process simulated trials: their
        GPU time is simulated, not held."""
        if not self.options.real_time:
            return {}
        return {
            n: held_gpu_seconds(self._submitted[n], p.config.params())
            for n, p in self._running.items()
            if n in self._submitted
        }

    def _timed_out(self, start: float) -> bool:
        return self.options.timeout_s is not None and time.monotonic() - start >= self.options.timeout_s

    def _show(self) -> None:
        if not self.progress:
            return
        running = running_params(self.executor.in_flight(), self.space.names)
        now = time.monotonic()
        run_dir = self.options.run_dir
        state = self._tally.state(
            self.options.n_trials,
            self.guide is not None,
            unit=metric_unit(self.objectives.objectives[0].metric),
            running=running,
            elapsed_s=now - self._started,
            running_since={n: now - self._submitted[n] for n, _ in running if n in self._submitted},
            probes={n: read_probe(run_dir / "trials" / str(n) if run_dir else None) for n, _ in running},
            budget_h=self._budget_h,
        )
        self.progress.show(state)
