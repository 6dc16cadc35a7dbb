"""What a trial's server reported: how it was launched, the flags it resolved, and its engine's figures.

The simulated engine knows all of them; a real server (`vllm serve`, a container) reports its command,
its log and the KV-cache blocks of its /metrics (autotune/backends/server_metrics.py), not the flags
vLLM filled in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineFacts:
    """The engine's figures over a measured run (None: the backend did not report it)."""

    num_gpu_blocks: int | None = None  # KV-cache blocks the engine allocated
    kv_cache_tokens: int | None = None  # tokens those blocks hold
    num_preemptions: int | None = None
    peak_kv_cache_usage: float | None = None  # the highest KV-cache usage seen (0..1)
    prefix_cache_hit_rate: float | None = None
    num_steps: int | None = None  # engine steps the run took


@dataclass(frozen=True)
class ServerReport:
    """The server of a trial, as its backend saw it."""

    image: str | None = None  # docker: the image it ran
    command: tuple[str, ...] | None = None  # a real server's command line (secret values scrubbed)
    log_path: str | None = None  # its log file, in the trial's folder
    resolved: Mapping[str, Any] | None = None  # the flags it ran with, vLLM's defaults filled in
    engine: EngineFacts | None = None  # None: no load ran (the server failed to start)
