"""The README's default run, timed at two revisions side by side: wall, tuning and CPU time, and verdicts.

Runs `autotune run --space search_spaces/vllm.yaml --slo ttft_p99=2s` (as the README does, plus
--quiet and a scratch --runs-dir) from a checkout of `--before` (a git revision, in a temporary git
worktree) and from this tree, alternately, `--rounds` times each, with this Python environment (the
checkout comes first on PYTHONPATH). Per run it prints the wall time of the command, the tuning time
the run reports ("told this run in N s"), the CPU time of the command and every process it started
(user + system), the verdict and the Pareto front's first rows; then each figure's median after /
before. On a shared machine
the wall times move with the load: compare the CPU times, and runs of one round (they are back to back).

    python benchmarks/default_run.py --before 6569eba [--rounds 2]
"""

from __future__ import annotations

import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from arguments import Parser, whole
from revisions import REPO, checkout, commit, environment

COMMAND = [
    "-m",
    "autotune.cli",
    "run",
    "--space",
    "search_spaces/vllm.yaml",
    "--slo",
    "ttft_p99=2s",
    "--quiet",
]
TOLD = re.compile(r"told this run in (\d+) s")
FRONT_ROWS = 3
VERDICT = re.compile(r"^(Keep vLLM's defaults|Recommended|No )[^\n]*", re.MULTILINE)


@dataclass
class Timing:
    """One run of the command."""

    label: str
    wall_s: float
    tuning_s: float
    cpu_s: float
    verdict: str  # the summary's verdict, its first sentence
    front: list[str]  # the Pareto front's first rows


def main() -> None:
    """Time the default run at `--before` and here, alternately."""
    parser = Parser(__doc__)
    parser.add_argument(
        "--before", type=commit, required=True, help="the git revision to compare with (e.g. 6569eba)"
    )
    parser.add_argument("--rounds", type=whole(1), default=2)
    args = parser.parse_args()
    timings = []
    with tempfile.TemporaryDirectory() as scratch, checkout(args.before) as before:
        for n in range(args.rounds):
            for label, tree in (("before", before), ("after", REPO)):
                t = _time(label, tree, Path(scratch) / f"{label}-{n}")
                timings.append(t)
                times = f"wall {t.wall_s:6.1f} s  tuning {t.tuning_s:4.0f} s  cpu {t.cpu_s:6.1f} s"
                print(f"{label:7} {times}")
                print(f"        {t.verdict}")
                if n == 0:
                    print("\n".join(f"        {row}" for row in t.front), flush=True)
    for name in ("wall_s", "tuning_s", "cpu_s"):
        medians = {
            label: statistics.median(getattr(t, name) for t in timings if t.label == label)
            for label in ("before", "after")
        }
        print(f"median {name:9} before {medians['before']:6.1f}  after {medians['after']:6.1f}  "
              f"after/before {medians['after'] / medians['before']:.2f}")  # fmt: skip


def _time(label: str, tree: Path, runs_dir: Path) -> Timing:
    """Run the command from `tree` and measure it (its children's CPU time included)."""
    env = environment(tree)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, *COMMAND, "--runs-dir", str(runs_dir)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.monotonic() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    told = TOLD.search(done.stdout)
    verdict = VERDICT.search(done.stdout)
    lines = done.stdout.splitlines()
    header = next((i for i, line in enumerate(lines) if line.lstrip().startswith("trial ")), None)
    front = lines[header : header + FRONT_ROWS + 1] if header is not None else []
    return Timing(
        label,
        wall,
        float(told.group(1)) if told else float("nan"),
        cpu,
        verdict.group(0).split(". ")[0] if verdict else "? (no verdict line)",
        front,
    )


if __name__ == "__main__":
    main()
