"""A server that is already running (`autotune bench --url`), measured as `vllm bench serve --base-url`
measures one: nothing is launched or stopped.

`RemoteBackend` is a Backend whose session attaches to the server at `base_url` (it waits for /health and
sends one warm-up request) instead of launching one, so everything a trial does runs against it
unchanged: one measurement (the load, /metrics before and after, the KV-cache usage sampled during it,
the steady-state judgement), or a whole capacity search (autotune/trial/capacity.py).

`served_config` reads what the server says of its own flags: the labels of vLLM's
`vllm:cache_config_info` gauge (CacheConfig.metrics_info in vllm/config/cache.py, every field as a string,
exposed by vllm/v1/metrics/loggers.py) and /v1/models' `max_model_len`. The scheduler's flags
(max_num_seqs, max_num_batched_tokens, chunked prefill) and the parallelism are in neither: they are
reported as unknown, never filled with autotune's defaults.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from autotune.backends.base import Backend
from autotune.backends.server import ServerSession, TrialLimits, server_session
from autotune.backends.server_metrics import Sample, scrape_metrics
from autotune.core.api_keys import REFUSED_STATUSES, auth_headers, client_api_key, refusal_message
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, one_line
from autotune.core.secrets import masked
from autotune.measure.server_report import ServerReport
from autotune.sim_server.exposition import TIME_SCALE_METRIC

CACHE_INFO = "vllm:cache_config_info"
CACHE_INFO_SOURCE = f"/metrics {CACHE_INFO}"
MODELS_SOURCE = "/v1/models"
# cache_config_info label -> (the vllm serve flag, how its string reads back)
_CACHE_LABELS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "block_size": ("block_size", int),
    "gpu_memory_utilization": ("gpu_memory_utilization", float),
    "enable_prefix_caching": ("enable_prefix_caching", lambda text: text == "True"),
    "cache_dtype": ("kv_cache_dtype", str),
}
# Flags a vLLM server exposes nowhere: the config a deployer checks must not claim them.
UNREPORTED = ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill")


@dataclass(frozen=True)
class ServedConfig:
    """The flags a running server reports, and where each was read."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    num_gpu_blocks: int | None = None
    time_scale: float = 1.0  # simulated seconds per wall-clock second: > 1 on a sim-server with --time-scale

    @property
    def unknown(self) -> list[str]:
        """The tuned flags the server does not report."""
        return [name for name in UNREPORTED if name not in self.values]


def get_models(base_url: str) -> httpx.Response:
    """GET /v1/models with this process's API key (autotune.core.api_keys); AutotuneError (one line)
    when the server refuses it, or the lack of one. httpx's errors are left to the caller's wording."""
    api_key = client_api_key()
    response = httpx.get(base_url.rstrip("/") + "/v1/models", headers=auth_headers(api_key), timeout=10.0)
    if response.status_code in REFUSED_STATUSES:
        where = masked(base_url)  # a URL may carry a password
        raise AutotuneError(
            refusal_message(where, response.status_code, response.reason_phrase, bool(api_key))
        )
    return response


def served_models(base_url: str) -> list[Mapping[str, Any]]:
    """The entries of /v1/models; AutotuneError when no OpenAI-compatible server answers there, or
    when it refuses autotune's API key (or the lack of one)."""
    where = masked(base_url)  # a URL may carry a password
    try:
        response = get_models(base_url)
        if response.is_error:
            raise AutotuneError(
                f"no OpenAI-compatible server at {where}: GET /v1/models answered "
                f"{response.status_code} {response.reason_phrase}"
            )
        data = response.json()
    except httpx.HTTPError as exc:
        raise AutotuneError(f"no OpenAI-compatible server at {where}: {one_line(exc)}") from None
    except ValueError:  # the JSON parser's own words ("Expecting value: line 1 column 1") say nothing
        kind = response.headers.get("content-type", "no content type")
        raise AutotuneError(
            f"no OpenAI-compatible server at {where}: GET /v1/models answered {kind}, not JSON"
        ) from None
    models = data.get("data") if isinstance(data, Mapping) else None
    if not isinstance(models, list):
        raise AutotuneError(f"no OpenAI-compatible server at {where}: /v1/models is not a model list")
    return [m for m in models if isinstance(m, Mapping) and "id" in m]


def served_config(base_url: str, model: Mapping[str, Any] | None) -> ServedConfig:
    """What the server at `base_url` reports of its config (`model`: its /v1/models entry, if any)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    samples = scrape_metrics(base_url.rstrip("/"))
    labels = cache_config_labels(samples)
    for label, (flag, read) in _CACHE_LABELS.items():
        with contextlib.suppress(KeyError, ValueError):
            values[flag] = read(labels[label])
            sources[flag] = CACHE_INFO_SOURCE
    if model is not None and isinstance(model.get("max_model_len"), int):
        values["max_model_len"] = model["max_model_len"]
        sources["max_model_len"] = MODELS_SOURCE
    blocks = None
    with contextlib.suppress(KeyError, ValueError):
        blocks = int(float(labels["num_gpu_blocks"]))
    return ServedConfig(values, sources, blocks, time_scale(samples))


def cache_config_labels(samples: Sequence[Sample]) -> dict[str, str]:
    """The labels of the first `vllm:cache_config_info` sample ({} when the server has none)."""
    return next((dict(s.labels) for s in samples if s.name == CACHE_INFO), {})


def time_scale(samples: Sequence[Sample]) -> float:
    """A sim-server's --time-scale as its /metrics gives it: simulated seconds per wall-clock second (1 for
    any other server, and never below 1)."""
    scale = next((s.value for s in samples if s.name == TIME_SCALE_METRIC), 1.0)
    return max(1.0, float(scale))


@dataclass(frozen=True)
class RemoteBackend(Backend):
    """The server at `base_url` as a backend: a session attaches to it (nothing is launched or stopped).

    `early_abort` False measures every request even once an SLO is lost (a deployer's benchmark wants
    the whole picture; a capacity search wants the GPU time back).
    """

    base_url: str
    startup_timeout_s: float = 60.0
    benchmark_timeout_s: float = 1800.0
    early_abort: bool = True

    @property
    def runs_servers(self) -> bool:
        """Nothing is launched: there is nothing to tear down."""
        return False

    def session(
        self, config: EngineConfig, gpu_ids: Sequence[int] = (), trial_dir: Path | None = None
    ) -> AbstractContextManager[ServerSession]:
        """The running server, for one or more measurements of `config.model` on it."""
        handle = _Attached(self.base_url.rstrip("/"))
        limits = TrialLimits(self.startup_timeout_s, self.benchmark_timeout_s, early_abort=self.early_abort)
        return server_session(lambda port, log: handle, config, limits, trial_dir, ServerReport())


@dataclass(frozen=True)
class _Attached:
    """A server someone else runs: it is not ours to stop, and its exit and log are not ours to see."""

    base_url: str
    api_key: str | None = None  # not known: the client's own key is sent

    def exit_code(self) -> int | None:
        """Never known here."""
        return None

    def log_text(self) -> str:
        """Not readable from here."""
        return ""

    def stop(self) -> None:
        """Left running."""
