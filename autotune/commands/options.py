"""The options `autotune run` and `autotune bench` share, declared once: which config and workload
(`--space`, `--model`, `--gpu`, `--workload`), the SLOs and the seed, and where a config runs
(`--backend`; `--startup-timeout`, `--serve-cmd`, `--image` for a launched server; `--noise`,
`--sim-calibration` for the simulated one).

Each function adds its options to a parser or an argument group, so a command keeps its own layout.
"""

from __future__ import annotations

import argparse

from autotune.backends.factory import BACKENDS
from autotune.catalog import known_gpus_text, known_models_text
from autotune.core import values
from autotune.core.config import DEFAULT_IMAGE
from autotune.core.errors import AutotuneError
from autotune.core.inputs import ChoiceOption, add_startup_timeout, arg, serve_command
from autotune.outputs.images import image_reference
from autotune.sim.calibration import add_calibration_argument
from autotune.sim.noise import add_noise_argument

Parser = argparse.ArgumentParser | argparse._ArgumentGroup
DEFAULT_SERVE_CMD = "vllm serve"
# add_server_options' options and the backends that use them (the others would ignore them unseen:
# --serve-cmd without --backend vllm runs the simulator in process).
SERVER_OPTIONS: tuple[ChoiceOption, ...] = (
    ("--serve-cmd", "serve_cmd", DEFAULT_SERVE_CMD, ("vllm",)),
    ("--image", "image", DEFAULT_IMAGE, ("docker",)),
    ("--startup-timeout", "startup_timeout", None, ("vllm", "docker")),
    ("--noise", "noise", 0.0, ("sim",)),
)


def add_config_options(parser: Parser, url: bool = False) -> None:
    """--space, --model, --gpu, --workload (`url`: the command can measure a running server instead,
    which names its own model)."""
    parser.add_argument(
        "--space",
        default="vllm",
        help="search-space YAML (or a name in search_spaces/); its fixed flags apply to every config",
    )
    on_url = "; with --url: the server's first model" if url else ""
    parser.add_argument(
        "--model",
        type=arg(values.text),
        help=f"override the space's model (default meta-llama/Llama-3.1-8B-Instruct{on_url}); "
        f"{known_models_text()}",
    )
    as_label = "; with --url: only a label in the output" if url else ""
    parser.add_argument(
        "--gpu",
        type=arg(values.text),
        help=f"override the space's GPU type (default H100{as_label}); {known_gpus_text()}",
    )
    parser.add_argument("--workload", default="chat", help="workload YAML (or a name in workloads/)")


def add_slo_option(parser: Parser, text: str) -> None:
    """--slo (repeatable); `text` says what the command does with them."""
    parser.add_argument("--slo", action="append", default=[], help=text)


def add_seed_option(parser: Parser, text: str) -> None:
    """--seed; `text` says what it seeds."""
    parser.add_argument("--seed", type=arg(values.seed), default=0, help=f"{text}; 0 to 2**32-1")


def add_backend_option(parser: Parser, default: str | None = "sim") -> None:
    """--backend; `default` None lets a command tell an explicit `--backend sim` from none given."""
    parser.add_argument(
        "--backend",
        default=default,
        choices=BACKENDS,
        help="sim (default): the simulated engine in process; vllm: `vllm serve` subprocesses; docker: "
        "vllm/vllm-openai containers",
    )


def add_server_options(parser: Parser) -> None:
    """--startup-timeout, --serve-cmd, --image (a launched server), --noise and --sim-calibration (the
    simulated one)."""
    add_startup_timeout(parser)
    parser.add_argument(
        "--serve-cmd",
        default=DEFAULT_SERVE_CMD,
        help=f"vllm backend: the server command (default '{DEFAULT_SERVE_CMD}'; 'autotune sim-server' "
        "needs no GPU)",
    )
    parser.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        type=arg(image_reference),  # checked before anything starts: '' or UPPER:1 the engine refuses late
        help=f"docker backend: the image (default {DEFAULT_IMAGE}, the vLLM release autotune follows)",
    )
    add_noise_argument(parser)
    add_calibration_argument(parser)


def launch_command(text: str) -> list[str]:
    """--serve-cmd of a run or a benchmark as an argument list. A sim-server at a --time-scale other
    than 1 is refused: they measure on the server's clock, which runs that much faster than the GPU it
    simulates, and would report its rates and latencies as the GPU's."""
    from autotune.commands.sim_server import served_time_scale

    command = serve_command(text)
    scale = served_time_scale(command)
    if scale != 1:
        raise AutotuneError(
            f"--serve-cmd runs sim-server at --time-scale {scale:g}: a launched server is measured on its "
            f"own clock, {scale:g}x faster than the simulated GPU, so every rate and latency would be off "
            "by that much; drop --time-scale (autotune calibrate --url or --backend puts a time-scaled "
            "server's times back on the simulated clock)"
        )
    return command
