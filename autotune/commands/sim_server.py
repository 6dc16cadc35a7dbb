"""`autotune sim-server`: serve the simulated engine over HTTP with `vllm serve`'s flags.

A drop-in for `vllm serve` in tests and on machines without a GPU: `--serve-cmd "autotune sim-server"`.
The GPU comes from --gpu, else the AUTOTUNE_SIM_GPU environment variable (the process backend sets
it), else H100. API keys come from --api-key, else VLLM_API_KEY, as vLLM takes them.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from typing import Any

from autotune.catalog import known_gpus_text, known_models_text
from autotune.core import values
from autotune.core.inputs import arg, port_number
from autotune.sim.calibration import add_calibration_argument

HELP = "Serve the simulated vLLM engine as an OpenAI-compatible server (takes vllm serve's flags)."

DEFAULT_GPU = "H100"
MAX_DELAY_S = 86_400.0  # a startup delay past a day is a typo
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30}
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([kmgKMG])")
_SWITCH = {"action": argparse.BooleanOptionalAction, "default": None}  # vLLM 0.11's yes/no flags
# The other `vllm serve` flags a trial's config may carry (core/config.py, OTHER_VLLM_FLAGS), typed as
# vLLM 0.11 types them (vllm/engine/arg_utils.py): the engine serves each, or refuses it in one line, as
# the in-process simulator does (sim/flags.py: a value it does not model; partial prefills at startup).
PASSED_FLAGS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--pipeline-parallel-size", "-pp"), {"type": int}),
    (("--data-parallel-size", "-dp"), {"type": int}),
    (("--quantization", "-q"), {}),
    (("--swap-space",), {"type": float}),
    (("--max-num-partial-prefills",), {"type": int}),
    (("--max-long-partial-prefills",), {"type": int}),
    (("--cuda-graph-sizes",), {"type": int, "nargs": "+"}),
    (("--scheduling-policy",), {"choices": ("fcfs", "priority")}),
    (("--prefix-caching-hash-algo",), {"choices": ("sha256", "sha256_cbor")}),
    (("--tokenizer",), {}),
    (("--revision",), {}),
    (("--async-scheduling",), _SWITCH),
    (("--enable-expert-parallel",), _SWITCH),
    (("--disable-custom-all-reduce",), _SWITCH),
    (("--calculate-kv-scales",), _SWITCH),
)
PASSED = tuple(flags[0][2:].replace("-", "_") for flags, _ in PASSED_FLAGS)


def human_readable_int(text: str) -> int:
    """argparse type of vLLM's --max-model-len and --max-num-batched-tokens (`human_readable_int`,
    vllm/engine/arg_utils.py): k/m/g are decimal and take fractions ('25.6k' is 25,600), K/M/G binary
    and take whole numbers only ('8K' is 8,192); anything else is a plain int. Its name is in argparse's
    message for a bad value, as in vLLM's: "invalid human_readable_int value"."""
    text = text.strip()
    match = _SUFFIXED.fullmatch(text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
            f"{number}{suffix.lower()} instead?"
        )
    return int(number) * _BINARY[suffix]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `vllm serve`'s tuned flags plus the server and fault-injection options."""
    parser.add_argument(
        "model_tag", nargs="?", help=f"the model (as `vllm serve MODEL`); {known_models_text()}"
    )
    parser.add_argument(
        "--model",
        dest="model_flag",
        help="the model (as `vllm serve`, the positional one wins when both are given)",
    )
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-num-batched-tokens", type=human_readable_int)
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int)
    parser.add_argument("--max-model-len", type=human_readable_int)
    parser.add_argument("--kv-cache-dtype")
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        help="the model names clients may use, as vLLM takes them (default: the model); responses carry "
        "the first",
    )
    # vLLM 0.11's yes/no flags are BooleanOptionalActions: a trial's config may say `--no-enforce-eager`
    parser.add_argument(
        "--enforce-eager", action=argparse.BooleanOptionalAction, help="no CUDA graphs (every step eager)"
    )
    parser.add_argument(
        "--long-prefill-token-threshold", type=int, default=0, metavar="N",
        help="the longest prefill chunk a request may take in a step (0: no cap)",
    )  # fmt: skip
    passed = parser.add_argument_group("other vllm serve flags, served as the simulated engine models them")
    for names, kwargs in PASSED_FLAGS:
        passed.add_argument(*names, **kwargs)
    ignored = parser.add_argument_group("accepted for compatibility with vllm serve; ignored")
    for flag in ("--load-format", "--dtype", "--seed", "--download-dir", "--uvicorn-log-level"):
        ignored.add_argument(flag)
    # nothing a client of the simulated engine sees depends on these
    for flag in ("--generation-config", "--chat-template", "--tool-call-parser", "--root-path"):
        ignored.add_argument(flag)
    ignored.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction)
    for flag in ("--disable-log-requests", "--disable-log-stats", "--disable-uvicorn-access-log"):
        ignored.add_argument(flag, action="store_true")
    ignored.add_argument("--enable-auto-tool-choice", action="store_true")
    # vLLM's token for Hugging Face downloads (alone: the cached login's); the simulator downloads nothing
    ignored.add_argument("--hf-token", nargs="?", const=True, metavar="TOKEN")
    parser.add_argument(
        "--api-key", nargs="+", metavar="KEY",
        help="require `Authorization: Bearer KEY` (any of the KEYs) on /v1 routes, as vLLM does "
        "(default: $VLLM_API_KEY; unset: no key needed)",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8000)
    parser.add_argument(
        "--gpu", default=None, help=f"simulated GPU (default: $AUTOTUNE_SIM_GPU or H100); {known_gpus_text()}"
    )
    add_calibration_argument(parser)
    parser.add_argument(
        "--time-scale",
        type=arg(values.finite_number, 1.0, 1000.0),
        default=1.0,
        metavar="X",
        help="run the simulated clock X times faster than real time (1 to 1000, default 1): every latency "
        "a client sees is divided by X, /metrics says X (autotune:sim_time_scale); for tests: the HTTP "
        "path's own time counts X times over on the simulated clock (docs/simulator.md)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=arg(values.positive_int),
        default=None,
        metavar="N",
        help="larger request bodies get 413",
    )
    parser.add_argument(
        "--request-read-timeout", type=arg(values.positive_number), default=None, metavar="S",
        help="a request not read whole within S seconds of its first byte gets 408",
    )  # fmt: skip
    faults = parser.add_argument_group("fault injection (tests)")
    faults.add_argument(
        "--startup-delay",
        type=arg(values.finite_number, 0.0, MAX_DELAY_S),
        default=0.0,
        metavar="S",
        help="seconds before serving",
    )
    faults.add_argument(
        "--die-after",
        type=arg(values.positive_int),
        metavar="N",
        help="exit abruptly once N requests started",
    )
    faults.add_argument(
        "--hang-after",
        type=arg(values.positive_int),
        metavar="N",
        help="stop producing tokens and answering /health",
    )
    faults.add_argument(
        "--debug-timings", action="store_true", help="serve GET /debug/requests (exact server-side timings)"
    )


def run(args: argparse.Namespace) -> int:
    """Build the engine config from the flags and serve; exit 1 when the engine refuses the config."""
    from autotune.catalog.gpus import get_gpu
    from autotune.catalog.models import get_model
    from autotune.core.config import ENGINE_FLAGS, LONG_PREFILL, EngineConfig, check_flags
    from autotune.core.errors import AutotuneError
    from autotune.sim.calibration import calibration_option
    from autotune.sim.flags import refusal
    from autotune.sim.memory import LONG_LEN_VARIABLE
    from autotune.sim_server.auth import ApiKeyCheck, served_api_keys
    from autotune.sim_server.server import ServerOptions, serve

    model = args.model_tag or args.model_flag  # vLLM's order: `vllm serve M --model N` serves M
    if not model:
        raise AutotuneError("sim-server needs a model: autotune sim-server MODEL [flags]")
    get_model(model)  # an unknown model is a usage error (one line), before the server logs anything
    flags = {name: getattr(args, name) for name in ENGINE_FLAGS if getattr(args, name) is not None}
    # what vLLM's own argument checks refuse: one line, not a traceback (the engine refuses, at startup and
    # in vLLM's words, a block size CUDA does not take)
    check_flags(flags, "bad flag", cuda=False)
    config = EngineConfig(model=model).replace(**flags)
    if args.enforce_eager:
        config = config.replace(enforce_eager=True)
    if args.long_prefill_token_threshold:
        check_flags({LONG_PREFILL: args.long_prefill_token_threshold}, "bad flag")
        config = config.replace(**{LONG_PREFILL: args.long_prefill_token_threshold})
    passed = {name: getattr(args, name) for name in PASSED if getattr(args, name) is not None}
    check_flags(passed, "bad flag", cuda=False)
    config = config.replace(**passed)
    # dtype: the one ignored flag that would matter
    refused = refusal(
        {name: [v] for name, v in {**config.params(), "dtype": args.dtype}.items()}, "sim-server"
    )
    if refused:
        raise AutotuneError(refused)
    gpu = args.gpu or os.environ.get("AUTOTUNE_SIM_GPU") or DEFAULT_GPU
    get_gpu(gpu)  # an unknown GPU is a usage error (one line), not a server that logs and then dies
    calibration = calibration_option(args.sim_calibration)
    options = ServerOptions(
        host=args.host,
        port=args.port,
        gpu=gpu,
        served_model_names=tuple(args.served_model_name or ()),
        startup_delay_s=args.startup_delay,
        die_after=args.die_after,
        hang_after=args.hang_after,
        debug_timings=args.debug_timings,
        calibration=calibration,
        time_scale=args.time_scale,
        api_keys=ApiKeyCheck(served_api_keys(args.api_key)),
        # read as vllm/envs.py reads it
        allow_long_max_model_len=os.environ.get(LONG_LEN_VARIABLE, "0").strip().lower() in ("1", "true"),
        **_limits(args),
    )
    return serve(config, options)


def _limits(args: argparse.Namespace) -> dict[str, int | float]:
    """The request limits given on the command line (the others keep httpd's defaults)."""
    limits: dict[str, int | float] = {}
    if args.max_request_bytes is not None:
        limits["max_body_bytes"] = args.max_request_bytes
    if args.request_read_timeout is not None:
        limits["read_timeout_s"] = args.request_read_timeout
    return limits


def served_time_scale(serve_cmd: Sequence[str]) -> float:
    """The --time-scale of a serve command that runs `sim-server`, read as the sim-server reads its
    arguments (1 for another command, or for one the sim-server itself will refuse)."""
    if "sim-server" not in serve_cmd:
        return 1.0
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_arguments(parser)
    tail = list(serve_cmd[list(serve_cmd).index("sim-server") + 1 :])
    try:
        return float(parser.parse_known_args(tail)[0].time_scale)
    except argparse.ArgumentError:
        return 1.0


def main(argv: list[str] | None = None) -> int:
    """`python -m autotune.commands.sim_server ...`: the command without loading the whole CLI."""
    import sys

    from autotune.core.errors import AutotuneError

    parser = argparse.ArgumentParser(prog="autotune sim-server", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except AutotuneError as exc:
        print(f"autotune sim-server: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
