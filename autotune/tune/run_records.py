"""The records of one `autotune run` loop: what it is asked to do (TunerOptions) and how it ended
(RunSummary). The loop itself: tune/tuner.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class TunerOptions:
    """Budget and reproducibility of a run."""

    n_trials: int
    timeout_s: float | None = None
    seed: int = 0  # the workload seed: every trial replays the same requests, so configs compare fairly
    run_dir: Path | None = None
    repeats: int = 0  # other seeds for the top candidates and the baseline at the end (noisy backends)
    real_time: bool = False  # a server per trial: a trial cut short by Ctrl-C spent the GPU time it held


@dataclass
class RunSummary:
    """How the run ended."""

    completed: int  # trials that count toward n_trials (launched configs)
    rejected: int  # suggestions told before launch: invalid, or screened
    told: int
    wall_s: float
    timed_out: bool = False
    screened: int = 0  # of the rejected: predicted by the memory model to fail to start
    repeated: int = 0  # re-measurements of the top candidates and the baseline (other seeds)
    duplicates: int = 0  # suggestions answered with an earlier result (free, not counted)
    converged: bool = False  # the run ended because the sampler only proposed measured configs
    stop_reason: str | None = None  # why a guided run stopped early (tune/guided.py)
    unstarted: int = 0  # of the completed: failed to start (served no load: not measured)
    halted: str | None = None  # why the run halted: its first launched trials all failed alike (tune/halt.py)

    def ended_by(self) -> str:
        """Why the loop ended, in a few words: a halt, a guided stop, the timeout, the sampler's
        convergence, or else --n-trials reached (guide.json and the summary say the same)."""
        if self.halted or self.stop_reason:
            return str(self.halted or self.stop_reason)
        if self.timed_out:
            return "--timeout reached"
        return "the sampler converged" if self.converged else "--n-trials reached"
