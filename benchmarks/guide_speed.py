"""How long the guide takes to predict a whole search space (tune/guide.py predict_space, no cache).

Prints the CPU seconds of every worker process, the wall time on `--processes` workers (default: every
core this process may use, as `autotune run`), and a hash of the predictions.
`--before REV` runs the same prediction on REV's code first (a temporary git worktree, in a child
process), then on this tree's, one after the other: the CPU-time ratio, and whether both tables are
identical (a speed-up of the guide must not change a prediction).

    python benchmarks/guide_speed.py [--space vllm] [--model M] [--gpu G] [--workload chat]
        [--slo ttft_p99=2s ...] [--processes N] [--before REV]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict

from arguments import Parser, user_errors, whole
from revisions import checkout, commit, environment

from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.measure.slo import parse_slos
from autotune.tune.guide import predict_space
from autotune.tune.space import load_space
from autotune.workloads.files import load_workload


def measure(args: argparse.Namespace) -> dict[str, object]:
    """Predict the space once, without a cache: CPU seconds, wall seconds, configs, predictions' hash."""
    workload = load_workload(args.workload)
    space = load_space(args.space).with_overrides(args.model, args.gpu)
    if not workload.shares_prefixes:  # as `autotune run` does: prefix caching cannot change a result
        space = space.fix("enable_prefix_caching", True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as runs:
        table = predict_space(space, workload, parse_slos(args.slo), runs_dir=runs, processes=args.processes)
    rows = json.dumps([asdict(p) for p in table.predictions], sort_keys=True)
    return {
        "processes": args.processes,
        "cpu_s": round(table.cpu_s, 1),
        "wall_s": round(time.perf_counter() - start, 1),
        "configs": len(table.predictions),
        "table": hashlib.sha256(rows.encode()).hexdigest()[:16],
    }


def main() -> None:
    """Parse the arguments; measure here, or REV then here."""
    parser = Parser(__doc__)
    parser.add_argument("--space", default="vllm")
    parser.add_argument("--model")
    parser.add_argument("--gpu")
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--slo", action="append", default=None, help="default: ttft_p99=2s")
    parser.add_argument("--processes", type=whole(1), help="worker processes (default: the usable cores)")
    parser.add_argument("--before", type=commit, metavar="REV", help="measure REV's code first, side by side")
    parser.add_argument("--json", action="store_true", help="print one JSON line (the child's output)")
    args = parser.parse_args()
    args.slo = args.slo or ["ttft_p99=2s"]
    with user_errors(parser):  # an unknown space, model, GPU, workload or SLO: one line, before anything
        load_workload(args.workload)
        space = load_space(args.space).with_overrides(args.model, args.gpu)
        get_model(space.model)
        get_gpu(space.gpu)
        parse_slos(args.slo)
    if args.processes is None:  # resolved here, passed on: a --before child runs older code
        from autotune.core.procs import usable_cpus

        args.processes = usable_cpus()
    if args.before is None:
        found = measure(args)
        print(json.dumps(found) if args.json else found)
        return
    child = [sys.executable, __file__, "--space", args.space, "--workload", args.workload]
    child += [f"--{name}={value}" for name, value in (("model", args.model), ("gpu", args.gpu)) if value]
    child += [f"--slo={slo}" for slo in args.slo] + ["--processes", str(args.processes)]
    with checkout(args.before) as tree:
        out = subprocess.run(
            [*child, "--json"], env=environment(tree), capture_output=True, text=True, check=True
        )
    before, now = json.loads(out.stdout.splitlines()[-1]), measure(args)
    print(f"{args.before}: {before}")
    print(f"this tree: {now}")
    print(
        f"CPU time ratio (before / now): {before['cpu_s'] / now['cpu_s']:.2f}x, wall time "
        f"{before['wall_s'] / now['wall_s']:.2f}x; "
        f"tables {'identical' if before['table'] == now['table'] else 'DIFFER'}"
    )


if __name__ == "__main__":
    main()
