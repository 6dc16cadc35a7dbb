"""`autotune sim-server`: the simulated engine behind an OpenAI-compatible HTTP server, like `vllm serve`.

Endpoints and formats follow vLLM's OpenAI server (vllm/entrypoints/openai/api_server.py; docs/vllm.md,
"Endpoints"). The pieces, one concept per module:

  autotune.sim_server.parsing      request validation, prompt lengths without a tokenizer, shared prefixes
  autotune.sim_server.service      the engine stepped in real time and the requests in flight
  autotune.sim_server.sse          SSE chunks and the streaming / plain responses
  autotune.sim_server.routes       the endpoints
  autotune.sim_server.exposition   /metrics with prometheus_client, vLLM's names
  autotune.sim_server.process      a sim-server subprocess for tests and benchmarks
  autotune.sim_server.server       this module: startup (vLLM's log lines and errors) and the HTTP server

What the simulation cannot know (prompt lengths without a tokenizer, EOS, shared prefixes) is said
in autotune.sim_server.parsing.

HTTP is served by `autotune.sim_server.httpd` (asyncio protocols and httptools, no framework): a request is
parsed as it is read and handed to the engine right after the loop's reads, and after each step the
engine loop writes every stream's new tokens, coalesced into one chunk, straight to its connection
(`SseStream`).
A client that reads too slowly pauses its own stream (transport flow control) rather than buffering.

A client that disconnects aborts its request, as in vLLM: the engine frees its KV blocks at once and
counts it in vllm:request_success_total{finished_reason="abort"}.

Fault injection for tests: --startup-delay (slow model loading), --die-after N (the process exits
abruptly once N requests have started), --hang-after N (tokens and /health stop).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import time

from autotune.core.config import EngineConfig
from autotune.sim_server.http_messages import HttpLimits
from autotune.sim_server.httpd import start_http_server
from autotune.sim_server.process import SimServerProcess, free_port, start_sim_server
from autotune.sim_server.routes import VLLM_VERSION, SimRoutes
from autotune.sim_server.service import Pending, ServerOptions, SimService, vllm_log
from autotune.sim_server.sse import ChunkWriter, SseStream

# Re-exported: tests, benchmarks and the sim-server command import these from here.
__all__ = [
    "ChunkWriter",
    "Pending",
    "ServerOptions",
    "SimServerProcess",
    "SseStream",
    "free_port",
    "serve",
    "start_sim_server",
]


# --------------------------------------------------------------------------- serve


def serve(config: EngineConfig, options: ServerOptions) -> int:
    """Start the engine (exit 1 with vLLM's message if it refuses) and serve until interrupted."""
    from autotune.catalog.models import get_model
    from autotune.core.errors import EngineStartupError
    from autotune.sim.engine import SimEngine
    from autotune.sim.memory import LONG_LEN_CAUTION, long_max_model_len

    model_name = options.served_model_names[0] if options.served_model_names else config.model
    vllm_log("INFO", "api_server.py:1885", f"vLLM API server version {VLLM_VERSION}")
    vllm_log(
        "INFO",
        "utils.py:326",
        f"non-default args: {non_default_args(config)} model={config.model!r} gpu={options.gpu!r}"
        + (" api_key='***'" if options.api_keys else ""),  # that keys are required; never a key
    )
    if not options.calibration.is_default:
        changed = ", ".join(f"{k}={v:g}" for k, v in options.calibration.changed().items())
        vllm_log("INFO", "utils.py:327", f"simulator calibration: {changed}")
    if options.time_scale != 1.0:
        vllm_log("INFO", "utils.py:328", f"simulated clock {options.time_scale:g}x faster than real time")
    too_long = long_max_model_len(config, get_model(config.model))
    if options.allow_long_max_model_len and too_long is not None:
        vllm_log("WARNING", "model.py:1907", f"{too_long} {LONG_LEN_CAUTION}")
    if options.startup_delay_s > 0:
        time.sleep(options.startup_delay_s)  # loading weights
    try:
        engine = SimEngine(
            config,
            options.gpu,
            calibration=options.calibration,
            allow_long_max_model_len=options.allow_long_max_model_len,
        )
    except EngineStartupError as exc:
        vllm_log("ERROR", "core.py:718", "EngineCore failed to start.")
        print(exc.log_line(), file=sys.stderr, flush=True)
        return 1
    resolved = engine.config
    memory = engine.memory
    tokens = memory.num_gpu_blocks * resolved.block_size
    vllm_log(
        "INFO", "gpu_worker.py:298", f"Available KV cache memory: {memory.kv_available_bytes / 2**30:.2f} GiB"
    )
    vllm_log("INFO", "kv_cache_utils.py:1087", f"GPU KV cache size: {tokens:,} tokens")
    vllm_log("INFO", "kv_cache_utils.py:1091",
         f"Maximum concurrency for {resolved.max_model_len:,} tokens per request: "
         f"{memory.concurrency_for(resolved.max_model_len):.2f}x")  # fmt: skip
    vllm_log("INFO", "core.py:200", f"# GPU blocks: {memory.num_gpu_blocks}")
    vllm_log("INFO", "core.py:210",
         f"max_num_seqs={resolved.max_num_seqs} max_num_batched_tokens={resolved.max_num_batched_tokens} "
         f"enable_chunked_prefill={resolved.enable_chunked_prefill} "
         f"enable_prefix_caching={resolved.enable_prefix_caching}")  # fmt: skip
    service = SimService(engine, options, model_name, get_model(config.model).vocab_size)
    vllm_log(
        "INFO", "api_server.py:1971", f"Starting vLLM API server 0 on http://{options.host}:{options.port}"
    )
    # As vLLM does after loading: objects made so far live for good, and a full collection that walks
    # them all stalls the event loop for tens of milliseconds (every request then waits that long).
    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(_serve_http(service, options))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        return 0


def non_default_args(config: EngineConfig) -> dict[str, object]:
    """The config's flags that differ from vLLM's defaults, as vLLM's own `non-default args:` line lists."""
    defaults = EngineConfig(model=config.model).params()
    missing = object()  # a flag unset by default (None) differs from it whatever its value
    return {name: value for name, value in config.params().items() if defaults.get(name, missing) != value}


async def _serve_http(service: SimService, options: ServerOptions) -> int:
    """Listen, run the engine loop and serve until SIGTERM or SIGINT; 1 if the address cannot be bound."""
    try:
        limits = HttpLimits(options.max_body_bytes, options.read_timeout_s)
        server, live = await start_http_server(options.host, options.port, SimRoutes(service).handle, limits)
    except OSError as exc:
        _server_log("ERROR", str(exc))  # "... address already in use": backends classify it
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service.start()
    # The lines uvicorn prints under vLLM, so logs read the same.
    _server_log("INFO", f"Started server process [{os.getpid()}]")
    _server_log("INFO", "Waiting for application startup.")
    _server_log("INFO", "Application startup complete.")
    await stop.wait()
    _server_log("INFO", "Shutting down")
    server.close()
    for conn in list(live):  # open streams end at once: a hung one must not hold up the exit
        conn.close()
    await service.stop()
    _server_log("INFO", f"Finished server process [{os.getpid()}]")
    return 0


def _server_log(level: str, message: str) -> None:
    """A line in uvicorn's format (`INFO:     message`), as vLLM's API server prints them."""
    print(f"{level + ':':<9} {message}", file=sys.stderr, flush=True)
