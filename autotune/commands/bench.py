"""`autotune bench`: benchmark one config on one workload and print vllm bench serve's metrics.

The config is built as `autotune run` builds a trial's: the search space's fixed flags (max_model_len
8192 in the default space), then `--set`, then vLLM's defaults for the GPU; it is printed in full.
`--url` measures a server that is already running instead (nothing launched), like
`vllm bench serve --base-url`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from autotune.commands.options import (
    DEFAULT_SERVE_CMD,
    add_backend_option,
    add_config_options,
    add_seed_option,
    add_server_options,
    add_slo_option,
)
from autotune.core import values
from autotune.core.config import DEFAULT_IMAGE, ENGINE_FLAGS, EngineConfig, check_flags, parse_value
from autotune.core.errors import AutotuneError
from autotune.core.inputs import arg
from autotune.core.secrets import masked
from autotune.sim.calibration import calibration_option
from autotune.sim.noise import noise_model

if TYPE_CHECKING:  # imported when a benchmark runs (`--help` stays quick)
    from autotune.measure.slo import Slo
    from autotune.workloads.spec import WorkloadSpec

HELP = "Benchmark one vLLM config on one workload (simulated by default) and print the metrics."

TUNABLE = sorted(ENGINE_FLAGS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune bench` options."""
    add_backend_option(parser)
    parser.add_argument(
        "--url",
        type=arg(values.url),
        help="benchmark the OpenAI-compatible server already running there (nothing is launched; the "
        "options that launch one, --backend, --set, --space, --serve-cmd, --image, --startup-timeout and "
        "--noise, do not apply)",
    )
    add_config_options(parser, url=True)
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a vLLM flag in snake_case (repeatable): {', '.join(TUNABLE)}",
    )
    add_slo_option(parser, "SLOs for goodput, e.g. ttft_p99=2s (repeatable)")
    add_seed_option(parser, "workload seed (the requests' lengths and arrival times)")
    add_server_options(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """["max_num_seqs=256", ...] -> {"max_num_seqs": 256}; unknown names are an error."""
    out: dict[str, Any] = {}
    for item in settings:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not value:
            raise AutotuneError(f"bad --set {item!r}: expected NAME=VALUE, e.g. max_num_seqs=256")
        if name not in TUNABLE:
            raise AutotuneError(f"unknown vLLM parameter {name!r}; known: {', '.join(TUNABLE)}")
        out[name] = parse_value(value)
    check_flags(out, "bad --set")
    return out


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit 1 with vLLM's message (a JSON object with --json) when the config fails."""
    from autotune.measure.slo import parse_slos
    from autotune.workloads.files import load_workload

    slos = parse_slos(args.slo)
    workload = load_workload(args.workload)
    if args.url is not None:
        _refuse_launch_options(args)
        return _bench_url(args, workload, slos)
    calibration = calibration_option(args.sim_calibration)
    config, resolved, gpu = _config(args)
    from autotune.backends.factory import make_backend
    from autotune.catalog.models import known_max_model_len
    from autotune.core.inputs import serve_command
    from autotune.workloads.spec import check_fits

    check_fits(workload, args.seed, known_max_model_len(config.model, config.max_model_len, args.backend))
    backend = make_backend(
        args.backend,
        gpu=gpu,
        serve_cmd=serve_command(args.serve_cmd),
        image=args.image,
        startup_timeout_s=args.startup_timeout,
        noise=noise_model(args.noise),
        calibration=calibration,
    )
    result = backend.evaluate(config, workload, slos=slos, seed=args.seed)
    head = {"backend": args.backend, "model_id": config.model, "gpu": gpu}
    if args.backend == "sim" and not calibration.is_default:
        head["sim_calibration"] = calibration.changed()  # the constants that differ from the built-in ones
    return _print(
        args, result, {**head, "workload": workload.name, "num_prompts": workload.num_requests}, resolved
    )


# What launches a server, as (option, its value in args, its default): none applies to --url.
_LAUNCH_OPTIONS = (
    ("--backend", "backend", "sim"),
    ("--set", "settings", []),
    ("--space", "space", "vllm"),
    ("--serve-cmd", "serve_cmd", DEFAULT_SERVE_CMD),
    ("--image", "image", DEFAULT_IMAGE),
    ("--startup-timeout", "startup_timeout", None),
    ("--noise", "noise", 0.0),
    ("--sim-calibration", "sim_calibration", None),
)


def _refuse_launch_options(args: argparse.Namespace) -> None:
    """--url measures a server as it runs: an option that would launch or configure one is an error,
    not silently ignored."""
    given = [flag for flag, name, default in _LAUNCH_OPTIONS if getattr(args, name) != default]
    if given:
        raise AutotuneError(
            f"{', '.join(given)} cannot be used with --url: the server there is already running with its "
            "own flags (nothing is launched)"
        )


def _bench_url(args: argparse.Namespace, workload: WorkloadSpec, slos: list[Slo]) -> int:
    from autotune.backends.remote import RemoteServer

    server = RemoteServer(args.url)
    model = args.model or server.served_model()
    config = EngineConfig(model=model)
    result = server.measure(config, workload, slos, args.seed)
    head = {"backend": "url", "server": masked(args.url), "model_id": model, "gpu": args.gpu or "unknown"}
    # The server's own flags are not autotune's to know.
    return _print(
        args,
        result,
        {**head, "workload": workload.name, "num_prompts": workload.num_requests},
        config.params(),
    )


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
        resolved = config  # outside the catalogs: vLLM fills the unset flags itself
    return config, resolved.params(), space.gpu


def _print(args: argparse.Namespace, result: Any, head: dict[str, Any], resolved: dict[str, Any]) -> int:
    if result.failure is not None:
        # Why, always on stderr: what follows (if anything) is the partial metrics of a failed run.
        print(f"autotune bench: {result.failure}: {result.message}", file=sys.stderr)
    if result.benchmark is None:
        error = {**head, "config": resolved, "error": str(result.failure), "message": result.message}
        if args.json:
            print(json.dumps(error, indent=2, default=str))
        return 1
    report = {**head, "config": resolved, **result.benchmark.to_dict()}
    if result.failure is not None:
        report["failure"] = str(result.failure)
        report["failure_message"] = result.message
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(format_table(report))
    return 0 if result.failure is None else 1


def format_table(report: dict[str, Any]) -> str:
    """A readable summary in the layout of `vllm bench serve`."""
    rows: list[tuple[str, Any]] = [
        ("Backend / GPU", f"{report.get('server', report['backend'])} / {report['gpu']}"),
        ("Model", report["model_id"]),
        ("Workload", report["workload"]),
        ("Successful requests", report["completed"]),
        ("Failed requests", report["failed"]),
        ("Benchmark duration (s)", f"{report['duration']:.2f}"),
        ("Total input tokens", report["total_input_tokens"]),
        ("Total generated tokens", report["total_output_tokens"]),
        ("Request throughput (req/s)", f"{report['request_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{report['output_throughput']:.2f}"),
        ("Total token throughput (tok/s)", f"{report['total_token_throughput']:.2f}"),
    ]
    if report.get("request_goodput") is not None:
        rows.append(("Request goodput (req/s)", f"{report['request_goodput']:.2f}"))
    for metric, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
    ):
        rows.append((f"--- {title} ---", ""))
        for stat in ("mean", "median", "p99"):
            rows.append(
                (f"{stat.capitalize()} {metric.upper()} (ms)", f"{report[f'{stat}_{metric}_ms']:.2f}")
            )
    extras = [k for k in ("num_preemptions", "num_gpu_blocks", "peak_kv_cache_usage") if k in report]
    if extras:
        rows.append(("--- Engine ---", ""))
        rows += [(k, report[k]) for k in extras]
    flags = " ".join(f"{k}={v}" for k, v in report["config"].items()) or "(the server's own)"
    lines = ["=" * 18 + " Serving Benchmark Result " + "=" * 18, f"config (defaults included): {flags}"]
    lines += [f"{name:<42}{value}" if value != "" else f"{name:-^62}" for name, value in rows]
    lines.append("=" * 62)
    return "\n".join(lines)
