"""`autotune bench`: benchmark one config on one workload and print vllm bench serve's metrics."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autotune.backends.factory import BACKENDS
from autotune.config import ENGINE_FLAGS, EngineConfig, _parse_value
from autotune.errors import AutotuneError
from autotune.sim.noise import add_noise_argument, noise_model

HELP = "Benchmark one vLLM config on one workload (simulated by default) and print the metrics."

TUNABLE = sorted(ENGINE_FLAGS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune bench` options."""
    parser.add_argument("--backend", default="sim", choices=BACKENDS)
    parser.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct")
    parser.add_argument("--gpu", default="H100", help="GPU type (sim: from the catalog)")
    parser.add_argument("--workload", default="chat", help="workload YAML file or a name in workloads/")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a vLLM flag in snake_case (repeatable): {', '.join(TUNABLE)}",
    )
    parser.add_argument("--slo", action="append", default=[], help="SLOs for goodput, e.g. ttft_p99=2s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve-cmd", default="vllm serve", help="vllm backend: the server command")
    parser.add_argument("--image", default="vllm/vllm-openai:latest", help="docker backend: the image")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_noise_argument(parser)


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
        out[name] = _parse_value(value)
    return out


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit 1 with vLLM's message when the config fails."""
    import shlex

    from autotune.backends.factory import make_backend
    from autotune.slo import parse_slos
    from autotune.workload import load_workload

    config = EngineConfig(model=args.model).replace(**parse_settings(args.settings))
    slos = parse_slos(args.slo)
    workload = load_workload(args.workload)
    backend = make_backend(
        args.backend,
        gpu=args.gpu,
        serve_cmd=shlex.split(args.serve_cmd),
        image=args.image,
        noise=noise_model(args.noise),
    )
    result = backend.evaluate(config, workload, slos=slos, seed=args.seed)
    if result.benchmark is None:
        print(f"autotune bench: {result.failure}: {result.message}", file=sys.stderr)
        return 1
    report = {
        "backend": args.backend,
        "model_id": config.model,
        "gpu": args.gpu,
        "workload": workload.name,
        "num_prompts": workload.num_requests,
        "config": result.info.get("resolved_flags", config.params()),
        **result.benchmark.to_dict(),
    }
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
        ("Backend / GPU", f"{report['backend']} / {report['gpu']}"),
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
    flags = " ".join(f"{k}={v}" for k, v in report["config"].items())
    lines = ["=" * 18 + " Serving Benchmark Result " + "=" * 18, f"config: {flags}"]
    lines += [f"{name:<42}{value}" if value != "" else f"{name:-^62}" for name, value in rows]
    lines.append("=" * 62)
    return "\n".join(lines)
