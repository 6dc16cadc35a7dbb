"""How fast the simulated engine runs: simulated requests and engine steps per wall-clock second.

Target (issue 2): a 1,000-request chat workload (~1k-token prompts, ~250-token outputs, rate inf) at
saturation on Llama-3.1-8B / H100 with vLLM's defaults simulates in under 1 s on one core.

`--rate R` sends the requests as Poisson arrivals at R req/s instead (a capacity probe's load).
`--before REV` compares with another revision side by side: each case's best process CPU time (not wall:
the machine is shared) of --repeat runs, alternately in a child process on REV's code (a temporary git
worktree) and on this tree's, with the ratio, and whether both simulated the same run (steps,
preemptions and every request's token times: an engine speed-up must not change a run).

    python benchmarks/sim_speed.py [--requests 1000] [--repeat 3] [--rate 13] [--before REV]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from arguments import Parser, rate, whole
from revisions import checkout, commit, environment

from autotune.core.config import EngineConfig
from autotune.sim.replay import simulate
from autotune.workloads.files import load_workload

TARGET_S = 1.0
CASES = (
    # (label, model, gpu, flags)
    ("8B/H100 defaults", "meta-llama/Llama-3.1-8B-Instruct", "H100", {}),
    ("8B/H100 seqs 256, budget 2048", "meta-llama/Llama-3.1-8B-Instruct", "H100",
     {"max_num_seqs": 256, "max_num_batched_tokens": 2048}),
    ("8B/H100 no prefix caching", "meta-llama/Llama-3.1-8B-Instruct", "H100",
     {"enable_prefix_caching": False}),
    ("8B/L4 KV-starved (preempts)", "meta-llama/Llama-3.1-8B-Instruct", "L4", {"max_model_len": 8192}),
    ("70B/A100 TP=2", "meta-llama/Llama-3.1-70B-Instruct", "A100-80GB",
     {"tensor_parallel_size": 2, "max_model_len": 10000, "gpu_memory_utilization": 0.95}),
)  # fmt: skip


def main() -> None:
    """Time each case (best of --repeat runs) and print the speed and the ratio to the 1 s target."""
    parser = Parser(__doc__)
    parser.add_argument("--requests", type=whole(1), default=1000)
    parser.add_argument("--repeat", type=whole(1), default=3)
    parser.add_argument("--rate", type=rate, default=math.inf, help="req/s (default inf: all at once)")
    parser.add_argument(
        "--before", type=commit, help="a git revision to compare with (CPU time, side by side)"
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # one case, as JSON (--before)
    args = parser.parse_args()
    requests = _requests(args.requests, args.rate)
    if args.child is not None:
        print(json.dumps(_time_case(CASES[args.child], requests, args.repeat, time.process_time)))
        return
    mean_prompt = sum(r.prompt_len for r in requests) / len(requests)
    mean_output = sum(r.output_len for r in requests) / len(requests)
    lengths = f"mean prompt {mean_prompt:.0f}, mean output {mean_output:.0f}"
    print(f"{len(requests)} requests, {lengths}, rate {args.rate:g}")
    if args.before:
        _compare(args)
        return
    header = (
        f"{'case':34} {'wall s':>7} {'req/s':>9} {'steps':>6} {'steps/s':>9} {'preempt':>7} {'1s/wall':>8}"
    )
    print(header)
    for case in CASES:
        t = _time_case(case, requests, args.repeat, time.perf_counter)
        best = t["best_s"]
        print(
            f"{case[0]:34} {best:7.3f} {len(requests) / best:9.0f} {t['steps']:6d} "
            f"{t['steps'] / best:9.0f} {t['preemptions']:7d} {TARGET_S / best:7.1f}x"
        )


def _requests(n: int, rate: float) -> list:
    workload = dataclasses.replace(load_workload("chat"), num_requests=n, seed=0)
    return workload.with_load(request_rate=rate).requests(seed=0)


def _time_case(case: tuple, requests: list, repeat: int, clock: Callable[[], float]) -> dict:
    """Best time of `repeat` simulations of the case, its steps and preemptions."""
    _, model, gpu, flags = case
    config = EngineConfig(model=model).replace(**flags)
    best = math.inf
    for _ in range(repeat):
        start = clock()
        run = simulate(config, gpu, requests)
        best = min(best, clock() - start)
    records = hashlib.sha256(
        repr([(r.start_time, r.ttft, list(r.itl), r.latency) for r in run.records]).encode()
    )
    return {
        "best_s": best,
        "steps": run.num_steps,
        "preemptions": run.stats.num_preemptions,
        "records": records.hexdigest(),
    }


def _compare(args: argparse.Namespace) -> None:
    """Each case in a child process on --before's code and on this tree's, alternately."""
    print(f"{'case':34} {'before s':>8} {'after s':>8} {'after/before':>12} {'same run':>8}")
    here = Path(__file__).resolve()
    with checkout(args.before) as before:
        for i, case in enumerate(CASES):
            times = {}
            for label, tree in (("before", before), ("after", here.parent.parent)):
                cmd = [sys.executable, str(here), "--child", str(i), "--requests", str(args.requests)]
                cmd += ["--repeat", str(args.repeat), "--rate", str(args.rate)]
                out = subprocess.run(cmd, env=environment(tree), capture_output=True, text=True, check=True)
                times[label] = json.loads(out.stdout.splitlines()[-1])
            b, a = times["before"], times["after"]
            same = all(b[k] == a[k] for k in ("steps", "preemptions", "records"))
            ratio = a["best_s"] / b["best_s"]
            print(f"{case[0]:34} {b['best_s']:8.3f} {a['best_s']:8.3f} {ratio:12.2f} {same!s:>8}")


if __name__ == "__main__":
    main()
