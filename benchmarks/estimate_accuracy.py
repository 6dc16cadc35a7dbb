"""How close the pre-run estimate of a real-GPU run's GPU time is to what a study of the same scenario
spends, side by side, on several scenarios.

For each scenario: the estimate `autotune run --backend vllm` prints before it starts
(autotune/outputs/estimate.py: the baseline and a sample of the space as trials on the simulated engine;
its trials' part, without re-measurements, which a noiseless simulated study does not run), then
`autotune run` on the simulated engine with the same space, workload, SLOs, seed and trials, as a
user runs it (a process in a scratch folder), and the GPU time its trials spent (trials.csv's
gpu_seconds: startup, saturation runs and probes, TP x the hours). The estimate is for the same GPUs
the simulation charges: both come from one model, so the difference is the sample against the
sampler's path through the space. The old estimate (the baseline trial alone, x the trials) is shown
beside it.

Usage: python benchmarks/estimate_accuracy.py [--only NAME ...] [--sample K]
"""

from __future__ import annotations

import csv
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from arguments import Parser, whole

from autotune.catalog.models import known_max_model_len
from autotune.measure.slo import parse_slos
from autotune.outputs.estimate import SAMPLE, estimate_run
from autotune.tune.screen import make_screen
from autotune.tune.space import SearchSpace, load_space
from autotune.workloads.files import load_workload
from autotune.workloads.spec import WorkloadSpec


@dataclass(frozen=True)
class Case:
    """One scenario: `autotune run` options (space, GPU, workload, SLO, trials)."""

    name: str
    space: str
    gpu: str | None
    workload: str
    slo: str
    trials: int

    def args(self) -> list[str]:
        """The scenario as `autotune run` arguments."""
        gpu = ["--gpu", self.gpu] if self.gpu else []
        return ["--space", self.space, *gpu, "--workload", self.workload, "--slo", self.slo]


CASES = (
    Case("8B H100 chat TTFT (the default run)", "vllm", None, "chat", "ttft_p99=2s", 50),
    Case("70B A100 TP 2/4 chat TTFT", "tp", None, "chat", "ttft_p99=5s", 20),
    Case("8B L4 chat TTFT", "vllm", "L4", "chat", "ttft_p99=2s", 10),
    Case("8B H100 chat ITL only", "vllm", None, "chat", "itl_p99=50ms", 30),
    Case("8B A100 prefill-heavy TTFT", "vllm", "A100-80GB", "prefill_heavy", "ttft_p99=3s", 20),
)


def scenario(case: Case) -> tuple[SearchSpace, WorkloadSpec]:
    """The space and workload `autotune run` would use (prefix caching fixed where it cannot matter)."""
    space = load_space(case.space).with_overrides(gpu=case.gpu)
    workload = load_workload(case.workload)
    if "enable_prefix_caching" in space.names and not workload.shares_prefixes:
        space = space.fix("enable_prefix_caching", True)
    return space, workload


def spent_gpu_hours(case: Case, folder: Path) -> float:
    """Run the study on the simulated engine in `folder` and sum its trials' GPU time."""
    args = [sys.executable, "-m", "autotune.cli", "run", *case.args(), "--n-trials", str(case.trials)]
    args += ["--quiet", "--study", "s", "--seed", "0"]
    subprocess.run(args, cwd=folder, check=True, capture_output=True, text=True)
    with open(folder / "runs" / "s" / "trials.csv") as f:
        return sum(float(row["gpu_seconds"] or 0) for row in csv.DictReader(f)) / 3600


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--only", nargs="*", help="scenario names containing these words")
    parser.add_argument("--sample", type=whole(1), default=SAMPLE, help=f"configs sampled (default {SAMPLE})")
    args = parser.parse_args()
    unmatched = [w for w in args.only or () if not any(w.lower() in c.name.lower() for c in CASES)]
    if unmatched:
        names = "; ".join(c.name for c in CASES)
        parser.error(
            f"argument --only: no scenario name contains {', '.join(map(repr, unmatched))} ({names})"
        )
    cases = [c for c in CASES if not args.only or any(w.lower() in c.name.lower() for w in args.only)]
    print(f"{'scenario':<38} {'trials':>6} {'estimate':>9} {'spent':>7} {'ratio':>6} {'baseline x n':>13}"
          f" {'est. CPU s':>10}")  # fmt: skip
    for case in cases:
        space, workload = scenario(case)
        slos = parse_slos(case.slo)
        max_pos = known_max_model_len(space.model, None, "sim")
        started = time.process_time()
        estimate = estimate_run(
            space,
            workload,
            slos,
            case.trials,
            1,
            0,
            0,
            make_screen(space.model, space.gpu),
            max_pos,
            args.sample,
        )
        cpu = time.process_time() - started
        assert estimate is not None
        with tempfile.TemporaryDirectory(prefix="estimate-") as tmp:
            spent = spent_gpu_hours(case, Path(tmp))
        old = estimate.baseline_gpu_s * case.trials / 3600
        print(
            f"{case.name:<38} {case.trials:>6} {estimate.trials_gpu_h:>9.2f} {spent:>7.2f} "
            f"{estimate.trials_gpu_h / spent:>6.2f} {old / spent:>13.2f} {cpu:>10.0f}",
            flush=True,
        )
    print(
        "\nestimate, spent: GPU-hours (a TP=4 hour counts 4); ratio: estimate / spent; baseline x n: the old"
    )
    print("estimate (the baseline trial alone, times the trials) / spent.")


if __name__ == "__main__":
    main()
