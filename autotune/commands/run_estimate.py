"""Before a run on a real backend: its estimated GPU-hours and time (autotune/outputs/estimate.py), from
the baseline and a sample of the space run as trials on the simulated engine."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any


def run_estimate(args: argparse.Namespace, s: Any, gpus: int, study: Any) -> Any:
    """The pre-run estimate on a real backend, of what `study` still lacks. A simulated run needs none,
    unless a guided run's budget must charge its first trial: then from the guide's calibration (the
    backend's plays the reality, which the guide must not read). A guided run's is printed once its guide
    says what the budget charges a pick (run_guide.make_guided)."""
    if args.backend != "sim":
        return print_estimate(args, s, gpus, s.calibration, study)
    if s.guide_calibration is not None and args.gpu_hours is not None:
        return print_estimate(args, s, gpus, s.guide_calibration, study)
    return None


def print_estimate(args: argparse.Namespace, s: Any, gpus: int, calibration: Any, study: Any) -> Any:
    """Print the estimate of the run set up in `s` (run._Setup) on `gpus` GPUs, simulated with
    `calibration`, for what `study` still lacks, and return it (a guided run's: unprinted, see
    run_estimate); a line saying why not (and None) when it cannot be made. It never stops the run."""
    from autotune.outputs.estimate import SAMPLE, Left, estimate_run, remeasure_trials
    from autotune.tune.screen import make_screen

    print(
        f"autotune: estimating the run's GPU time: the baseline and {SAMPLE} configs of the space as trials "
        "on the simulated engine ...",
        file=sys.stderr,
        flush=True,
    )
    screen = None if args.no_screen else make_screen(s.space.model, s.space.gpu, calibration=calibration)
    repeats = remeasure_trials(args.repeats, s.backend.noisy, args.n_trials)
    held = Held.of(study, s.objectives.objectives[0].maximize)
    budget_s = None if args.gpu_hours is None else max(0.0, args.gpu_hours * 3600 - held.gpu_s)
    left = Left(guided=s.guide_calibration is not None, baseline=not held.baseline, budget_s=budget_s)
    try:
        estimate = estimate_run(
            s.space, s.workload, s.slos, max(0, args.n_trials - held.trials), gpus,
            max(0, repeats - held.repeats), args.seed, screen, s.max_position_embeddings,
            calibration=calibration, left=left,
        )  # fmt: skip
    except Exception:  # noqa: BLE001  (an estimate must never stop the run)
        estimate = None
    if estimate is None:
        print("autotune: no estimate (the model or GPU is not in the simulator's catalogs)", file=sys.stderr)
    elif not left.guided:
        print(f"autotune: {estimate.text()}", file=sys.stderr)
    return estimate


@dataclass(frozen=True)
class Held:
    """What a study already holds (all zero for a new one): a resumed run estimates only the rest."""

    trials: int  # trials that count toward --n-trials
    baseline: bool  # the baseline was measured
    repeats: int  # re-measurements done
    gpu_s: float  # GPU time spent, trials and re-measurements (against --gpu-hours)

    @classmethod
    def of(cls, study: Any, maximize: bool) -> Held:
        """Counted as the tuner counts a resumed study (tune/tally.py): a trial cut short spent its GPU
        time but is no trial done."""
        from optuna.trial import TrialState

        from autotune.tune.remeasure import StoredRepeats
        from autotune.tune.tally import Tally

        tally = Tally(maximize=maximize)
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
        for trial in finished:
            tally.record(trial)
        baseline = any(t.state == TrialState.COMPLETE and t.user_attrs.get("baseline") for t in finished)
        stored = StoredRepeats.of(study)
        repeats = sum(len(runs) for runs in stored.values.values())
        return cls(tally.done, baseline, repeats, tally.gpu_s + stored.gpu_s)
