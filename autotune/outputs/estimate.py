"""The estimate printed before a run on a real backend: its GPU-hours and time, from the same model that
charges a simulated study's GPU time (the startup of autotune/backends/sim.py, every saturation run and
capacity probe of autotune/trial/capacity.py, early abort).

One trial is not the study: the baseline's capacity search is one of the cheaper ones (a large batch,
a high rate, short windows), while the sampler spends most trials on other configs (a small batch
serves fewer requests per second, and a probe needs the same number of requests, so it runs longer).
So the estimate simulates a sample of the space as well, drawn as a study's first trials are (Optuna's
random sampler, seeded), each checked against vLLM's rules and the startup screen as the tuner checks
it (a config rejected before launch costs nothing and is not a trial), and run as a trial on the
simulated engine, failures included (a config that fails to start still pays its startup). The run's
trials cost the baseline's plus the sample's mean for each other trial; on a noisy backend the top
configs and the baseline are measured again (autotune/tune/remeasure.py), each repeat a trial's cost.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.core.config import gpus_per_replica
from autotune.core.values import counted
from autotune.tune.progress import clock

SAMPLE = 8  # configs simulated besides the baseline (about 2 CPU-seconds each for an 8B chat trial)
SAMPLE_TRIES = 10  # suggestions per sampled config at most (the rest being rejected before launch)


@dataclass(frozen=True)
class Left:
    """How a run picks and bounds the trials it still has to run."""

    guided: bool = False  # the guide picks them, not the sampler
    baseline: bool = True  # the baseline is among them (False: measured before a resume)
    budget_s: float | None = None  # GPU-seconds --gpu-hours has left (None: no budget)
    pick_gpu_s: float | None = None  # what the guided run's budget charges its next pick (None: unknown)


@dataclass(frozen=True)
class RunEstimate:
    """Before a real-GPU run: its GPU-hours (a TP=4 trial's hour is 4) and its time on the GPUs, for what
    is still to run (on resume: what the study lacks) within the budget."""

    baseline_gpu_s: float  # the baseline trial's GPU-seconds, all of its GPUs
    sample_gpu_s: float  # the sampled configs' mean (the baseline's when none launched)
    n_trials: int  # trials still to run, the baseline's included
    repeats: int  # re-measurements still to run (0 on a backend without noise)
    gpus: int  # GPUs the run may use at once
    sampled: int  # configs simulated besides the baseline
    spread: tuple[float, float]  # the cheapest and dearest simulated trial (GPU-seconds)
    left: Left = Left()  # how the run picks and bounds them
    replica_gpus: int = 1  # GPUs one trial takes (the baseline's, as the others' are not known yet)

    @property
    def trial_gpu_s(self) -> float:
        """A trial's GPU-seconds besides the baseline's: a guided trial's is what the run's budget charges
        the guide's next pick (tune/guide_budget.py: the baseline's, scaled to the pick's predicted rate,
        as a capacity search's GPU time goes as 1 / capacity; the baseline's until it is known); the
        sampler's trials cost the sample's mean."""
        if self.left.guided:
            return self.left.pick_gpu_s or self.baseline_gpu_s
        return self.sample_gpu_s

    @property
    def trials_gpu_h(self) -> float:
        """GPU-hours of the trials still to run (within the budget)."""
        return sum(self._runs[0]) / 3600

    @property
    def repeats_gpu_h(self) -> float:
        """GPU-hours of the re-measurements still to run (within the budget), each a trial's cost."""
        return sum(self._runs[1]) / 3600

    @property
    def gpu_hours(self) -> float:
        """GPU-hours of the whole run."""
        return self.trials_gpu_h + self.repeats_gpu_h

    @property
    def wall_hours(self) -> float:
        """Hours on `gpus` GPUs kept busy (trials at once as they fit), and no fewer than its longest trial
        takes on its own GPUs: one trial on two GPUs takes its own time, not half of it."""
        trials, repeats = self._runs
        longest = max([*trials, *repeats], default=0.0) / self.replica_gpus
        return max(self.gpu_hours / max(1, self.gpus), longest / 3600)

    @functools.cached_property
    def _runs(self) -> tuple[list[float], list[float]]:
        """The GPU-seconds of each trial and each re-measurement still to run, in the order they run, as
        many as the budget affords (computed once: the record is frozen)."""
        with_baseline = bool(self.left.baseline and self.n_trials)
        if self.left.guided:
            trials = self._guided_trials(with_baseline)
        else:
            first = [self.baseline_gpu_s] if with_baseline else []
            trials = first + [self.trial_gpu_s] * (self.n_trials - len(first))
        repeats = [self.trial_gpu_s] * self.repeats
        if self.left.budget_s is None:
            return trials, repeats
        runs = list(itertools.accumulate(trials + repeats))
        afforded = bisect.bisect_right(runs, self.left.budget_s)
        return trials[:afforded], repeats[: max(0, afforded - len(trials))]

    def _guided_trials(self, with_baseline: bool) -> list[float]:
        """A guided run's trials in order: the guide's first pick, then vLLM's defaults when the budget
        affords them after it (tune/guided.py leaves them out otherwise, and picks another config), then
        its other picks."""
        picks = [self.trial_gpu_s] * self.n_trials
        budget = self.left.budget_s
        fits = budget is None or self.trial_gpu_s + self.baseline_gpu_s <= budget
        if with_baseline and self.n_trials >= 2 and fits:
            return [picks[0], self.baseline_gpu_s, *picks[2:]]
        return picks

    def charged(self, pick_gpu_s: float) -> RunEstimate:
        """This estimate with a guided run's trials charged `pick_gpu_s` each (its budget's charge)."""
        return dataclasses.replace(self, left=dataclasses.replace(self.left, pick_gpu_s=pick_gpu_s))

    def text(self) -> str:
        """What `autotune run` prints before it starts."""
        trials, repeats = self._runs
        if not trials and not repeats:
            return self._nothing_text()
        again = (
            f", plus {self.repeats_gpu_h:.2f} for re-measuring the top configs and the baseline "
            f"({len(repeats)} more trials)"
            if repeats
            else ""
        )
        low, high = self.spread
        return (
            f"estimate: about {self.trials_gpu_h:.2f} GPU-hours for {counted(len(trials), 'trial')}{again}"
            f"{self._budget_text(len(trials), len(repeats))}: about {clock(self.wall_hours * 3600)} on "
            f"{self.gpus} GPU(s). Per trial {self._per_trial_text()}; the baseline and {self.sampled} "
            f"configs of the space simulated took {clock(low)} to {clock(high)} each (early abort counted)."
        )

    def _per_trial_text(self) -> str:
        """Each trial's GPU time, as the totals count it."""
        if self.left.guided and self.left.pick_gpu_s:
            return (
                f"{clock(self.trial_gpu_s)} of GPU time, what the budget charges the guide's next pick "
                f"(scaled to its predicted rate; the baseline's {clock(self.baseline_gpu_s)})"
            )
        if self.left.guided:
            return f"{clock(self.trial_gpu_s)} of GPU time, the baseline's"
        average = f"{clock(self.trial_gpu_s)} on average"
        if not (self.left.baseline and self.n_trials):  # resumed after the baseline: the others alone
            return f"{clock(self.trial_gpu_s)} of GPU time on average"
        return f"{clock(self.baseline_gpu_s)} of GPU time for the baseline, {average} for the others"

    def _budget_text(self, trials: int, repeats: int) -> str:
        """What the budget leaves out ('' when it affords everything)."""
        if self.left.budget_s is None or (trials, repeats) == (self.n_trials, self.repeats):
            return ""
        return (
            f", all that the budget's {self.left.budget_s / 3600:.2f} GPU-h left affords (of {self.n_trials} "
            f"trials and {self.repeats} re-measurements)"
        )

    def _nothing_text(self) -> str:
        """The estimate when nothing will run."""
        if self.n_trials or self.repeats:
            return (
                f"estimate: the budget's {(self.left.budget_s or 0.0) / 3600:.2f} GPU-h left affords no "
                f"trial ({clock(self.trial_gpu_s)} of GPU time each)"
            )
        return "estimate: nothing left to run: the study already has the trials and re-measurements asked for"


def estimate_run(
    space: Any,
    workload: Any,
    slos: Sequence[Any],
    n_trials: int,
    gpus: int,
    repeats: int = 0,
    seed: int = 0,
    screen: Any = None,
    max_position_embeddings: int | None = None,
    sample: int = SAMPLE,
    calibration: Any = None,
    left: Left | None = None,
) -> RunEstimate | None:
    """The run's estimate from its baseline and `sample` configs of `space` run as trials on the simulated
    engine (`n_trials` trials still to run, `repeats` re-measurement trials after the search); None when
    the baseline cannot be simulated (a model or GPU outside the catalogs). `calibration`: the
    simulator's constants (None: the built-in ones); `left`: how the run picks and bounds its trials
    (None: the sampler, unbounded, the baseline among them)."""
    from autotune.backends.sim import SimBackend
    from autotune.trial.task import evaluate_trial

    sim = SimBackend(space.gpu) if calibration is None else SimBackend(space.gpu, calibration=calibration)

    def cost(config: Any) -> float:
        result = evaluate_trial(sim, config, workload, slos, seed, (), None)
        return result.gpu_seconds * gpus_per_replica(config.params())

    gpu = _gpu(space.gpu)
    if gpu is None:
        return None
    baseline = space.config(space.baseline_params(gpu.memory_gib, max_position_embeddings))
    base = cost(baseline)
    if base <= 0:
        return None
    costs = [cost(c) for c in sample_configs(space, sample, seed, screen, max_position_embeddings)]
    per_trial = statistics.fmean(costs) if costs else base
    spread = (min([base, *costs]), max([base, *costs]))
    replica = gpus_per_replica(baseline.params())
    return RunEstimate(
        base, per_trial, n_trials, repeats, max(1, gpus), len(costs), spread, left or Left(), replica
    )


def sample_configs(
    space: Any, n: int, seed: int, screen: Any = None, max_position_embeddings: int | None = None
) -> list[Any]:
    """`n` configs of `space` that the tuner would launch: drawn by Optuna's random sampler, those that
    break vLLM's rules or that the startup screen rejects left out, as the tuner leaves them out."""
    import optuna

    from autotune.tune.space import violations

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    configs: list[Any] = []
    for _ in range(n * SAMPLE_TRIES):
        if len(configs) == n:
            break
        config = space.config(space.suggest(study.ask()))
        if violations(config, max_position_embeddings):
            continue
        if screen is not None and screen.check(config) is not None:
            continue
        configs.append(config)
    return configs


def _gpu(name: str) -> Any:
    from autotune.catalog.gpus import get_gpu
    from autotune.core.errors import AutotuneError

    try:
        return get_gpu(name)
    except AutotuneError:
        return None


def remeasure_trials(repeats: int, noisy: bool, n_trials: int) -> int:
    """How many re-measurement trials a run adds: the top configs and the baseline, `repeats` each;
    no more configs than the run measures (`n_trials`)."""
    from autotune.tune.remeasure import TOP_CANDIDATES

    return min(TOP_CANDIDATES + 1, n_trials) * repeats if noisy else 0
