"""Does the guide, predicting beside a running trial, skew that trial's latencies?

A guided run predicts the whole space again when a refit moves its speed factor, possibly while other
trials run on the same host (docs/gpus.md). Its workers run at the lowest CPU priority for that reason.
This runs one real-time `autotune sim-server` and the load generator (`autotune bench --url`, a fixed
Poisson load) on this machine's cores, in rounds of three conditions, side by side:
  alone       nothing else runs;
  background  the guide predicts the default space in a loop, as `autotune run` starts it (nice 19);
  foreground  the same guide at the driver's priority (what the workers would do without nice).
and prints each condition's median over the rounds of the request throughput (req/s), p99 TTFT, p99 ITL
and median ITL, their ratios to `alone`, and each round's ratio to its own `alone` run (paired). On a
host with cores to spare all three are alike; the comparison means something where the guide's workers
take every core, as here (2 cores, 2 workers).

    python benchmarks/guide_beside_trial.py [--rounds 3] [--rate 18]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arguments import Parser, rate, whole

from autotune.core.procs import usable_cpus
from autotune.sim_server.process import start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CONDITIONS = ("alone", "background", "foreground")
METRICS = ("request_throughput", "p99_ttft_ms", "p99_itl_ms", "median_itl_ms")
GUIDE_WARMUP_S = 4.0  # the guide's workers are spawned and busy before the load starts


def guide_loop(foreground: bool) -> None:
    """Predict the default space again and again (a fresh cache each time) until killed."""
    from autotune.core import procs
    from autotune.measure.slo import parse_slos
    from autotune.tune.guide import predict_space
    from autotune.tune.space import load_space
    from autotune.workloads.files import load_workload

    if foreground:
        procs.BACKGROUND_NICE = 0  # the same workers, left at the driver's priority
    workload, space = load_workload("chat"), load_space("vllm").fix("enable_prefix_caching", True)
    while True:
        with tempfile.TemporaryDirectory() as runs:
            predict_space(space, workload, parse_slos(["ttft_p99=2s"]), runs_dir=Path(runs))


def bench(url: str, rate: float, seed: int) -> dict[str, float]:
    """One run of the load generator against `url` (the chat workload's 400 requests, Poisson at
    `rate`): its metrics."""
    cmd = [sys.executable, "-m", "autotune.cli", "bench", "--url", url, "--workload", "chat"]
    cmd += ["--rate", str(rate)]
    out = subprocess.run([*cmd, "--seed", str(seed), "--json"], capture_output=True, text=True)
    try:  # exit 1 with a result: the server did not keep up with the load (a finding, not an error)
        found = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise SystemExit(
            f"autotune bench failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}"
        ) from None
    return found


def measure(condition: str, url: str, rate: float, seed: int) -> dict[str, float]:
    """The bench under `condition`, the guide (if any) started before it and stopped after."""
    if condition == "alone":
        return bench(url, rate, seed)
    child = subprocess.Popen([sys.executable, __file__, "--guide-loop", condition], start_new_session=True)
    try:
        time.sleep(GUIDE_WARMUP_S)
        return bench(url, rate, seed)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the loop and its spawned workers (one process group)
        child.wait()


def main() -> None:
    """Parse the arguments; measure every condition in rounds; print the medians and ratios."""
    parser = Parser(__doc__)
    parser.add_argument("--rounds", type=whole(1), default=3)
    parser.add_argument("--rate", type=rate, default=18.0, help="Poisson request rate (req/s)")
    parser.add_argument("--guide-loop", choices=CONDITIONS[1:], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.guide_loop:
        guide_loop(args.guide_loop == "foreground")
        return
    print(f"{usable_cpus()} cores; the chat workload (400 requests) at {args.rate} req/s per run")
    found: dict[str, list[dict[str, float]]] = {c: [] for c in CONDITIONS}
    with start_sim_server([MODEL]) as server:
        bench(server.base_url, args.rate, seed=args.rounds)  # warm-up: a fresh server's first run is slower
        for r in range(args.rounds):
            for condition in CONDITIONS:
                found[condition].append(measure(condition, server.base_url, args.rate, seed=r))
                row = {m: round(found[condition][-1][m], 1) for m in METRICS}
                print(f"round {r + 1} {condition:<10} {row}", flush=True)
    medians = {
        c: {m: statistics.median(run[m] for run in runs) for m in METRICS} for c, runs in found.items()
    }
    print(f"\nmedian of {args.rounds} rounds, and the ratio to 'alone':")
    for condition in CONDITIONS:
        cells = [
            f"{m} {medians[condition][m]:8.1f} ({medians[condition][m] / medians['alone'][m]:.2f}x)"
            for m in METRICS
        ]
        print(f"  {condition:<10} " + "   ".join(cells))
    print("each round against its own 'alone' run (the rounds differ more than the conditions):")
    for condition in CONDITIONS[1:]:
        cells = []
        for m in METRICS:
            ratios = sorted(
                run[m] / alone[m] for run, alone in zip(found[condition], found["alone"], strict=True)
            )
            cells.append(
                f"{m} median {statistics.median(ratios):.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f})"
            )
        print(f"  {condition:<10} " + "   ".join(cells))


if __name__ == "__main__":
    from autotune.core.interrupts import stops_as_sigint

    with stops_as_sigint():  # SIGTERM (`timeout`, kill) stops its servers as Ctrl-C does: they outlived it
        main()
