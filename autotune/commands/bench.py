"""`autotune bench`: benchmark one config on one workload and print vllm bench serve's metrics.

The config is built as `autotune run` builds a trial's: the search space's fixed flags (max_model_len
8192 in the default space), then `--set`, then vLLM's defaults for the GPU; it is printed in full.
`--url` measures a server that is already running instead (nothing launched), like
`vllm bench serve --base-url`.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.commands.bench_report import print_report
from autotune.commands.client_cap import offered_rate
from autotune.commands.options import (
    SERVER_OPTIONS,
    add_backend_option,
    add_config_options,
    add_seed_option,
    add_server_options,
    add_slo_option,
    launch_command,
)
from autotune.core import values
from autotune.core.config import (
    ENGINE_FLAGS,
    OTHER_VLLM_FLAGS,
    EngineConfig,
    check_flags,
    parse_value,
    removed_flag_note,
)
from autotune.core.errors import AutotuneError
from autotune.core.inputs import arg, positive_seconds, refuse_unless, refuse_unused
from autotune.measure.steady_state import load_kind
from autotune.sim.calibration import calibration_option
from autotune.sim.noise import noise_model

if TYPE_CHECKING:  # imported when a benchmark runs (`--help` stays quick)
    from autotune.measure.result import TrialResult
    from autotune.measure.slo import Slo
    from autotune.workloads.spec import WorkloadSpec

HELP = "Benchmark one vLLM config on one workload (simulated by default) and print the metrics."

SETTABLE = sorted({*ENGINE_FLAGS, *OTHER_VLLM_FLAGS})  # what a search space may set
# The capacity search's bounds: nothing else reads them.
CAPACITY_OPTIONS = (
    ("--max-probes", "max_probes", None),
    ("--min-window", "min_window", None),
    ("--min-window-requests", "min_window_requests", None),
)
# A benchmark's server options; unlike a run's, --sim-calibration is the simulated engine's alone (a run
# also predicts a real backend's trials with it).
BENCH_SERVER_OPTIONS = (*SERVER_OPTIONS, ("--sim-calibration", "sim_calibration", None, ("sim",)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune bench` options."""
    add_backend_option(parser, default=None)  # None: an explicit --backend (even sim) is refused with --url
    parser.add_argument(
        "--url",
        type=arg(values.server_url),
        help="benchmark the OpenAI-compatible server already running there (nothing is launched; the "
        "options that launch one, --backend, --set, --space, --serve-cmd, --image, --startup-timeout, "
        "--noise and --sim-calibration, do not apply)",
    )
    add_config_options(parser, url=True)
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a vLLM flag in snake_case (repeatable): {', '.join(SETTABLE)}",
    )
    load = parser.add_argument_group("the load (default: the workload file's)")
    load.add_argument(
        "--rate",
        type=arg(values.rate),
        help="requests per second (Poisson; inf: all at once); a trace replayed with its own timestamps "
        "keeps their pattern, scaled to this mean rate (inf: as recorded)",
    )
    load.add_argument(
        "--concurrency", type=arg(values.positive_int), help="requests in flight at most (client side)"
    )
    add_slo_option(parser, "an SLO to judge the run by, e.g. ttft_p99=2s (repeatable): a verdict per SLO")
    add_seed_option(parser, "workload seed (the requests' lengths and arrival times)")
    add_server_options(parser)
    capacity = parser.add_argument_group("capacity (--capacity)")
    capacity.add_argument(
        "--capacity",
        action="store_true",
        help="search the highest request rate the server sustains within the SLOs, as a capacity trial "
        "of `autotune run` does (a saturation burst, then steady-state probes; minutes on a real GPU)",
    )
    capacity.add_argument(
        "--max-probes", type=arg(values.positive_int), help="rates to probe at most (default: a trial's)"
    )
    capacity.add_argument(
        "--min-window",
        type=positive_seconds,
        metavar="S",
        help="seconds of measured arrivals per probe at least (default: a trial's, 30; the config's "
        "request lifetime or the SLOs' tails may ask for more): shorter is quicker and less sure, and a "
        "probe too close to call is measured again",
    )
    capacity.add_argument(
        "--min-window-requests",
        type=arg(values.positive_int),
        metavar="N",
        help="measured requests per probe at least (default: a trial's, 400; a p99 SLO asks for more)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """["max_num_seqs=256", ...] -> {"max_num_seqs": 256}; unknown names and a name given twice are errors."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # each name's value as typed, to quote both when one is given twice
    for item in settings:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not value:
            raise AutotuneError(f"bad --set {item!r}: expected NAME=VALUE, e.g. max_num_seqs=256")
        if name not in SETTABLE:
            why = removed_flag_note(name)
            raise AutotuneError(f"unknown vLLM parameter {name!r}{why}; known: {', '.join(SETTABLE)}")
        if name in given:  # which value was meant cannot be guessed
            raise AutotuneError(f"--set {name} given twice ({given[name]} and {value}): keep one")
        given[name] = value
        out[name] = parse_value(value)
    check_flags(out, "bad --set")
    return out


def run(args: argparse.Namespace) -> int:
    """Run the benchmark (or the capacity search) and print it; exit 1 when the config fails, a verdict
    fails or no rate passed."""
    from autotune.core.interrupts import stops_as_sigint
    from autotune.measure.slo import parse_slos
    from autotune.workloads.files import load_workload

    if args.capacity and args.rate is not None:
        raise AutotuneError("--rate with --capacity: a capacity search chooses the request rate; drop --rate")
    if args.capacity and args.concurrency is not None:
        raise AutotuneError(
            "--concurrency with --capacity: a capacity search measures open-loop Poisson arrivals, a "
            "concurrency cap makes it a closed loop; drop --concurrency"
        )
    refuse_unless(args.capacity, args, CAPACITY_OPTIONS, "--capacity")
    slos = parse_slos(args.slo)
    # Without --capacity bench measures one load, whatever the file's `load` (run's choice): --rate or
    # --concurrency sets it, and a concurrency cap is no capacity search's.
    workload = dataclasses.replace(
        load_workload(args.workload), load="capacity" if args.capacity else "fixed"
    )
    workload = workload.with_load(request_rate=args.rate, max_concurrency=args.concurrency)
    with stops_as_sigint():  # SIGTERM stops it as Ctrl-C does: its server torn down, "interrupted", 130
        if args.url:
            from autotune.commands.bench_url import bench_url

            result, head, config = bench_url(args, workload, slos)
        else:
            args.backend = args.backend or "sim"  # unset by default so that --url can refuse an explicit one
            result, head, config = _bench_launched(args, workload, slos)
    head |= {"workload": workload.name, "num_prompts": workload.num_requests}
    head |= {"request_rate": workload.request_rate, "max_concurrency": workload.max_concurrency}
    offered = None
    if not args.capacity:  # a capacity search picks its own loads
        requests = workload.requests(args.seed)
        # from the arrival times, as the measurement judges it: a trace replayed at its own times is an
        # open loop though its request_rate is inf
        head["load_kind"] = load_kind(requests, workload.max_concurrency)
        offered = offered_rate(requests)
    return print_report(result, head, config, slos, args.json, offered)


def _bench_launched(
    args: argparse.Namespace, workload: WorkloadSpec, slos: list[Slo]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Launch the config on --backend and measure it: (the result, the report's head, the resolved flags)."""
    from autotune.backends.factory import make_backend
    from autotune.catalog.models import known_max_model_len
    from autotune.sim.flags import refusal
    from autotune.workloads.spec import check_fits

    refuse_unused(args, "--backend", BENCH_SERVER_OPTIONS)
    calibration = calibration_option(args.sim_calibration)
    config, resolved, gpu = _config(args)
    refused = refusal({k: [v] for k, v in config.params().items()}, "the config")
    if refused and args.backend == "sim":
        raise AutotuneError(refused)
    check_fits(workload, args.seed, known_max_model_len(config.model, config.max_model_len, args.backend))
    backend = make_backend(
        args.backend,
        gpu=gpu,
        serve_cmd=launch_command(args.serve_cmd),
        image=args.image,
        startup_timeout_s=args.startup_timeout,
        noise=noise_model(args.noise),
        calibration=calibration,
    )
    result = _measure_keeping_a_failed_log(args, backend, config, workload, slos)
    head = {"backend": args.backend, "model_id": config.model, "gpu": gpu}
    if args.backend == "sim" and not calibration.is_default:
        head["sim_calibration"] = calibration.changed()  # the constants that differ from the built-in ones
    if backend.simulated:
        head["simulated"] = True
    return result, head, resolved


def _measure_keeping_a_failed_log(
    args: argparse.Namespace, backend: Any, config: EngineConfig, workload: WorkloadSpec, slos: list[Slo]
) -> TrialResult:
    """Measure `config`; a launched server logs to a temporary folder, removed unless the server failed:
    the failure's message is one line of that log, and the report points to the rest."""
    if not backend.runs_servers:
        return _measure(args, backend, config, workload, slos, None)
    folder = Path(tempfile.mkdtemp(prefix="autotune-bench-"))
    try:
        result = _measure(args, backend, config, workload, slos, folder)
    except BaseException:  # Ctrl-C too: nothing to point to
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if result.failure is None:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def _measure(
    args: argparse.Namespace,
    backend: Any,
    config: EngineConfig,
    workload: WorkloadSpec,
    slos: list[Slo],
    log_dir: Path | None,
) -> TrialResult:
    """One benchmark of `config` on `backend`, or its capacity search (--capacity)."""
    from autotune.commands.bench_progress import Narrated
    from autotune.commands.bench_url import capacity_search
    from autotune.trial.capacity import find_capacity

    if args.capacity:
        search = capacity_search(args)
        return find_capacity(
            Narrated(backend), config, workload, slos, args.seed, trial_dir=log_dir, search=search
        )
    return backend.evaluate(config, workload, slos=slos, seed=args.seed, trial_dir=log_dir)


def _config(args: argparse.Namespace) -> tuple[EngineConfig, dict[str, Any], str]:
    """The config as `run` builds a trial's (space's fixed flags, then --set), and its resolved flags."""
    from autotune.catalog.gpus import get_gpu
    from autotune.catalog.models import get_model
    from autotune.tune.space import load_space

    space = load_space(args.space).with_overrides(model=args.model, gpu=args.gpu)
    config = space.config(parse_settings(args.settings))
    try:
        spec = get_gpu(space.gpu)
        resolved = config.with_vllm_defaults(
            spec.memory_gib, spec.name, get_model(config.model).max_position_embeddings
        )
    except AutotuneError:
        return config, config.params(), space.gpu  # outside the catalogs: vLLM fills the unset flags itself
    return config, resolved.params(), spec.short_name
