"""`autotune bench --url`: measure a server that is already running, as a deployer checks a deployment
against the recommendation it came from (nothing is launched or stopped).

The config shown is the server's own, as it reports it (autotune/backends/remote.py: /metrics'
`vllm:cache_config_info`, /v1/models' max_model_len); what it does not report is listed as unknown,
never filled with autotune's defaults. The load is the workload's, or `--rate` / `--concurrency`;
`--slo` gives a verdict per SLO; `--capacity` runs a trial's capacity search against it.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from autotune.commands.options import DEFAULT_SERVE_CMD
from autotune.core.config import DEFAULT_IMAGE
from autotune.core.errors import AutotuneError
from autotune.core.inputs import given_flags

if TYPE_CHECKING:
    from autotune.measure.slo import Slo
    from autotune.workloads.spec import WorkloadSpec

# Options that launch or configure a server, as (flag, its attribute, its default): none applies to --url.
_LAUNCH_OPTIONS = (
    ("--backend", "backend", None),
    ("--set", "settings", []),
    ("--space", "space", "vllm"),
    ("--serve-cmd", "serve_cmd", DEFAULT_SERVE_CMD),
    ("--image", "image", DEFAULT_IMAGE),
    ("--startup-timeout", "startup_timeout", None),
    ("--noise", "noise", 0.0),
    ("--sim-calibration", "sim_calibration", None),
)


def refuse_launch_options(args: argparse.Namespace) -> None:
    """--url measures a server as it runs: an option that would launch or configure one is an error,
    not silently ignored."""
    given = given_flags(args, _LAUNCH_OPTIONS)
    if given:
        raise AutotuneError(
            f"{', '.join(given)} cannot be used with --url: the server there is already running with its "
            "own flags (nothing is launched)"
        )


def bench_url(
    args: argparse.Namespace, workload: WorkloadSpec, slos: list[Slo]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Measure the server at --url: (the result, the report's head, the server's config as reported)."""
    from autotune.backends.remote import RemoteBackend, served_config, served_models
    from autotune.commands.bench_progress import Narrated
    from autotune.core.config import EngineConfig
    from autotune.core.secrets import masked
    from autotune.trial.capacity import find_capacity
    from autotune.workloads.spec import check_fits

    refuse_launch_options(args)
    models = served_models(args.url)
    if args.model is None and not models:
        raise AutotuneError(f"{masked(args.url)}/v1/models lists no model; pass --model")
    model = args.model or str(models[0]["id"])
    entry = next((m for m in models if m["id"] == model), None)
    served = served_config(args.url, entry)
    if served.time_scale > 1:  # its clock runs fast: every time it serves is that many times too short
        print(
            f"autotune bench: note: {masked(args.url)} is autotune sim-server at --time-scale "
            f"{served.time_scale:g}: its latencies and rates are measured in wall-clock time, "
            f"{served.time_scale:g}x faster than the simulated GPU (autotune calibrate --url rescales them); "
            "at tens of requests a second the client's and the server's CPU, not the simulated GPU, set "
            "them (docs/simulator.md)",
            file=sys.stderr,
        )
    # a request longer than the server's context is answered 400 whatever the load: say so before any
    # is sent, as the in-process bench does
    check_fits(workload, args.seed, served.values.get("max_model_len"))
    config = EngineConfig(model=model)
    if args.capacity:
        backend = Narrated(RemoteBackend(args.url))
        result = find_capacity(backend, config, workload, slos, args.seed, search=capacity_search(args))
    else:
        backend = RemoteBackend(args.url, early_abort=False)  # a check measures every request
        result = backend.evaluate(config, workload, slos, args.seed)
    head = {"backend": "url", "server": masked(args.url), "model_id": model, "gpu": args.gpu or "unknown"}
    head |= {"config_sources": served.sources, "config_unknown": served.unknown}
    return result, head, served.values


def capacity_search(args: argparse.Namespace) -> Any:
    """The capacity search's bounds from --max-probes and --min-window (the trial's by default)."""
    from autotune.trial.capacity import CapacitySearch

    changes: dict[str, Any] = {}
    if args.max_probes is not None:
        changes["max_probes"] = args.max_probes
    if args.min_window is not None:
        # a shorter window floor, and its warm-up in the trial's proportion (10 s to 30 s)
        changes |= {"min_window_s": args.min_window, "min_warmup_s": args.min_window / 3}
    if args.min_window_requests is not None:
        changes["min_window_requests"] = args.min_window_requests
    return CapacitySearch(**changes)
