"""How fast the simulated engine runs: simulated requests and engine steps per wall-clock second.

Target (issue 2): a 1,000-request chat workload (~1k-token prompts, ~250-token outputs, rate inf) at
saturation on Llama-3.1-8B / H100 with vLLM's defaults simulates in under 1 s on one core.

    python benchmarks/sim_speed.py [--requests 1000] [--repeat 3] [--cpu]

`--cpu` times the process's CPU time instead of wall time (steadier on a shared machine). To compare
two trees side by side, run this script against each, alternately: `PYTHONPATH=OTHER_TREE python
benchmarks/sim_speed.py --cpu` imports that tree's simulator.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="CPU time (time.process_time), not wall time")
    args = parser.parse_args()
    workload = dataclasses.replace(load_workload("chat"), num_requests=args.requests, seed=0)
    requests = workload.with_load(request_rate=math.inf).requests(seed=0)
    mean_prompt = sum(r.prompt_len for r in requests) / len(requests)
    mean_output = sum(r.output_len for r in requests) / len(requests)
    print(f"{len(requests)} requests, mean prompt {mean_prompt:.0f}, mean output {mean_output:.0f}, rate inf")
    clock_name = "cpu s" if args.cpu else "wall s"
    header = (
        f"{'case':34} {clock_name:>7} {'req/s':>9} {'steps':>6} {'steps/s':>9} {'preempt':>7} {'1s/wall':>8}"
    )
    print(header)
    clock = time.process_time if args.cpu else time.perf_counter
    for label, model, gpu, flags in CASES:
        config = EngineConfig(model=model).replace(**flags)
        best = math.inf
        for _ in range(args.repeat):
            start = clock()
            run = simulate(config, gpu, requests)
            best = min(best, clock() - start)
        print(
            f"{label:34} {best:7.3f} {len(requests) / best:9.0f} {run.num_steps:6d} "
            f"{run.num_steps / best:9.0f} {run.stats.num_preemptions:7d} {TARGET_S / best:7.1f}x"
        )


if __name__ == "__main__":
    main()
