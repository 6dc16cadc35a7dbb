"""`autotune run`'s options: what to tune, the study, where trials run, the guide, the outputs."""

from __future__ import annotations

import argparse

from autotune.commands.options import (
    SERVER_OPTIONS,
    add_backend_option,
    add_config_options,
    add_seed_option,
    add_server_options,
    add_slo_option,
)
from autotune.commands.run_guide import add_guide_options
from autotune.core import values
from autotune.core.inputs import arg, positive_seconds

MAX_GPU_PRICE = 1000.0  # $ per GPU-hour

DEFAULT_TRIALS = 50
LOADS = ("workload", "fixed", "capacity")
MAX_PARALLEL = 256  # CPU slots for simulated trials: more than any host has cores
# Configs a run may measure: a million is years of GPU time, and a count past it is a typo (a run shown
# as "0/99999999999999999999999")
MAX_TRIALS = 1_000_000
# Simulated trials in flight: a fixed number, not the host's cores, so that a seeded run proposes the same
# configs on any machine. Two halve the default run's wall time on two cores; TPE's constant liar keeps
# the two apart (see the run's docs in docs/simulator.md, "Speed").
DEFAULT_PARALLEL = 2
DEFAULT_REPEATS = 2  # seeds beyond the first: 3 paired measurements give a gain an interval
PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size")  # what sets a replica's GPU count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune run` options."""
    what = parser.add_argument_group("what to tune")
    add_config_options(what)
    what.add_argument(
        "--load",
        choices=LOADS,
        default="workload",
        help="workload (default): what the workload file's `load:` says; capacity: measure each config at "
        "the highest request rate that meets the SLOs; fixed: at the file's rate/concurrency",
    )
    add_slo_option(what, "e.g. ttft_p99=2s,itl_p99=50ms (repeatable)")
    what.add_argument("--objectives", default="default", help="objectives YAML (or a name in objectives/)")
    study = parser.add_argument_group("study")
    study.add_argument(
        "--study",
        type=arg(values.file_name),
        help="study name (default: from model, GPU, workload, SLOs, a load, objectives or space other than "
        "the defaults, and 'guided' for a guided run)",
    )
    study.add_argument(
        "--storage",
        type=arg(values.text),
        help="Optuna storage URL (default: sqlite in runs/<study>/study.db)",
    )
    study.add_argument("--runs-dir", default="runs", help="where run folders go (default: runs)")
    study.add_argument("--resume", action="store_true", help="continue an existing study to --n-trials")
    study.add_argument(
        "--sampler",
        default="auto",
        choices=("auto", "tpe", "gp", "nsga2", "random", "grid"),
        help="auto (default): multivariate TPE, chosen by benchmarks/sample_efficiency.py (see README)",
    )
    study.add_argument(
        "--n-trials", type=int, default=DEFAULT_TRIALS, help=f"configs to measure (default {DEFAULT_TRIALS})"
    )
    study.add_argument(
        "--timeout", type=positive_seconds, help="stop asking for new trials after this many seconds"
    )
    add_seed_option(study, "sampler and workload seed (>= 0)")
    study.add_argument(
        "--no-screen",
        action="store_true",
        help="launch every valid config, also those the memory model predicts to fail to start",
    )
    add_guide_options(parser.add_argument_group("guided search (docs/guided-search.md)"))
    where = parser.add_argument_group("where trials run")
    add_backend_option(where)
    where.add_argument(
        "--gpus",
        help="GPUs to use: a count (4) or device ids (0,1,2,3; 0 alone is device 0); with --ray-address a "
        "count >= 1 only, the most in use at once; virtual ones for the simulator (--backend sim, or "
        "--serve-cmd 'autotune sim-server')",
    )
    where.add_argument(
        "--parallel",
        type=int,
        help=f"the most trials in flight at once. sim: default {DEFAULT_PARALLEL}, on this host's cores "
        "(told in the order they started, so a seeded run is reproducible; 1: in process) or on Ray with "
        "--ray-address/--gpus; on GPUs (vllm, docker, or --gpus): default as many as the free GPUs take "
        "(1: one trial at a time, e.g. so that no trial shares a node with another)",
    )
    where.add_argument("--ray-address", help="join an existing Ray cluster instead of starting one")
    where.add_argument(
        "--trial-timeout", type=positive_seconds, help="deadline per trial in seconds (forced cancel)"
    )
    add_server_options(where)
    where.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help="on a noisy backend (a real GPU, or --noise), re-measure the top candidates and the baseline "
        f"with this many other seeds before recommending (default {DEFAULT_REPEATS}; 0: never)",
    )
    cost = parser.add_argument_group("deployment cost (report)")
    cost.add_argument(
        "--target-rate",
        # past MAX_RATE the replica count is hundreds of digits, not a deployment
        type=arg(values.positive_number, values.MAX_RATE),
        help=f"req/s to serve (at most {values.MAX_RATE:g}): replicas and GPUs of the recommendation for it",
    )
    cost.add_argument(
        "--gpu-price",
        # far above any cloud's price of a GPU-hour; past it a typo's figures overflow to inf
        type=arg(values.positive_number, MAX_GPU_PRICE),
        help=f"$ per GPU-hour (at most {MAX_GPU_PRICE:g}): $/Mtok of the recommendation",
    )
    parser.add_argument("--dashboard", action="store_true", help="serve optuna-dashboard during the run")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def check_options(args: argparse.Namespace) -> None:
    """The options' values and combinations a run refuses before anything starts (one line, exit 2):
    counts out of range, options the run would ignore, device ids on a Ray cluster."""
    from autotune.core.errors import AutotuneError

    if not 1 <= args.n_trials <= MAX_TRIALS:
        raise AutotuneError(f"--n-trials must be between 1 and {MAX_TRIALS:,}")
    if args.parallel is not None and not 1 <= args.parallel <= MAX_PARALLEL:
        raise AutotuneError(f"--parallel must be between 1 and {MAX_PARALLEL}")
    if args.repeats < 0:
        raise AutotuneError("--repeats must be at least 0")
    _refuse_ignored(args)
    _refuse_device_ids_on_a_cluster(args)


def _refuse_ignored(args: argparse.Namespace) -> None:
    """Options the run would ignore are errors: another backend's, and --trial-timeout where no
    executor enforces it (simulated trials on this host, in process or on worker processes)."""
    from autotune.core.inputs import refuse_unless, refuse_unused

    refuse_unused(args, "--backend", SERVER_OPTIONS)
    on_ray = args.backend != "sim" or bool(args.gpus or args.ray_address)
    refuse_unless(
        on_ray,
        args,
        [("--trial-timeout", "trial_timeout", None)],
        "--backend vllm|docker, or --gpus/--ray-address: simulated trials on this host have no deadline",
    )


def _refuse_device_ids_on_a_cluster(args: argparse.Namespace) -> None:
    """--gpus with --ray-address is a count >= 1: device ids name devices of this machine (a lone 0 is
    device 0, as CUDA_VISIBLE_DEVICES=0 is), and on a cluster Ray assigns the devices."""
    from autotune.core.errors import AutotuneError

    text = (args.gpus or "").strip()
    if args.ray_address and args.gpus is not None and not (text.isdigit() and int(text) >= 1):
        raise AutotuneError(
            f"--gpus {args.gpus} with --ray-address: --gpus with device ids picks devices of this machine "
            "(0 alone is device 0), and on a Ray cluster Ray assigns them: give a count >= 1 (--gpus 8), "
            "the most GPUs in use at once"
        )
