"""Measuring designed points on a running OpenAI-compatible server (a real `vllm serve`, or the sim-server).

What the server says about itself is read first: its model and context length from /v1/models, and
from /metrics vLLM's `vllm:cache_config_info` (block size, memory utilization, KV cache dtype, prefix
caching, the number of KV blocks it allocated: a memory point) where it is exposed. A sim-server run
with `--time-scale X` says X on /metrics (`autotune:sim_time_scale`): arrivals are then sent X times
faster and every measured time multiplied by X, so points are always on the simulated GPU's clock.

Each serve point is one load-generator run of the point's own requests (point_requests: what its
replay simulates), with its own prompt salt so that no run hits the prefix cache with another's: the
salts start at a random number per campaign, so a rerun on the same server (after an interrupted
calibrate) does not meet the earlier campaign's prompts in the cache either.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from autotune.backends.remote import cache_config_labels, get_models, time_scale
from autotune.backends.server_metrics import KvSampler, parse_prometheus
from autotune.calibrate.points import point_requests
from autotune.core.api_keys import client_api_key
from autotune.core.config import gpus_per_replica
from autotune.core.errors import AutotuneError, RunFailure
from autotune.core.secrets import masked
from autotune.measure.loadgen import CHAT, COMPLETIONS, LoadResult, run_load
from autotune.measure.metrics import RequestRecord, compute_metrics
from autotune.measure.stall import StallWatch
from autotune.workloads.spec import Request, salt_base

Progress = Callable[[str], None]
REQUEST_TIMEOUT_S = 600.0
# A designed run's requests hear from the server at every engine step (under a second at its lengths):
# a minute of silence with requests in flight is a hung server, not a slow one.
STALL_S = 60.0
# What vllm:cache_config_info says, as the engine flags it maps to.
_CACHE_FLAGS = {
    "block_size": ("block_size", int),
    "gpu_memory_utilization": ("gpu_memory_utilization", float),
    "cache_dtype": ("kv_cache_dtype", str),
    "enable_prefix_caching": ("enable_prefix_caching", lambda v: v.lower() == "true"),
}


@dataclass(frozen=True)
class ServerInfo:
    """What a server says about itself."""

    url: str
    model: str  # the served model name (what requests name)
    max_model_len: int | None
    cache: dict[str, str]  # the labels of vllm:cache_config_info ({} when not exposed)
    time_scale: float = 1.0  # simulated seconds per wall-clock second (a sim-server with --time-scale)

    @property
    def shown(self) -> str:
        """The URL as messages and files show it: a password in it masked (user:***@host)."""
        return masked(self.url)

    def flags(self) -> dict[str, Any]:
        """The engine flags the server reports (the rest is vLLM's defaults or what --set says)."""
        out: dict[str, Any] = {}
        if self.max_model_len:
            out["max_model_len"] = self.max_model_len
        for label, (flag, convert) in _CACHE_FLAGS.items():
            if label in self.cache:
                try:
                    out[flag] = convert(self.cache[label])
                except ValueError:
                    continue
        return out

    @property
    def kv_tokens(self) -> int | None:
        """The KV cache the server allocated (num_gpu_blocks x block_size), None when not reported."""
        try:
            return int(float(self.cache["num_gpu_blocks"])) * int(self.cache["block_size"])
        except (KeyError, ValueError):
            return None


def probe_server(url: str) -> ServerInfo:
    """Read /v1/models and /metrics; AutotuneError (one line) when nothing or no OpenAI server answers,
    or when the server refuses autotune's API key (or the lack of one)."""
    base = url.rstrip("/")
    try:
        response = get_models(url)
    except httpx.HTTPError as exc:
        raise AutotuneError(masked(f"cannot reach {url}: {exc or type(exc).__name__}")) from None
    try:
        models = response.json().get("data") if response.status_code == 200 else None
    except (ValueError, AttributeError):
        models = None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise AutotuneError(
            f"{masked(url)} is not an OpenAI-compatible server: GET /v1/models answered "
            f"{response.status_code} without a model list"
        )
    card = models[0]
    cache, scale = _metrics(base)
    max_len = card.get("max_model_len")
    return ServerInfo(base, str(card["id"]), int(max_len) if isinstance(max_len, int) else None, cache, scale)


def _metrics(base: str) -> tuple[dict[str, str], float]:
    """vllm:cache_config_info's labels and the sim-server's time scale (1 when absent)."""
    try:
        response = httpx.get(base + "/metrics", timeout=10.0)
        samples = parse_prometheus(response.text) if response.status_code == 200 else []
    except httpx.HTTPError:
        samples = []
    return cache_config_labels(samples), time_scale(samples)


def measure_points(
    info: ServerInfo,
    points: Sequence[dict[str, Any]],
    progress: Progress | None = None,
    keep: Callable[[dict[str, Any], float], None] | None = None,
    sampled: dict[str, KvSampler] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """The points with their measured values, and the GPU seconds the runs took (each run's duration x
    its config's GPUs, simulated seconds on a time-scaled sim-server). Memory points take the server's
    KV size; RunFailure when a run fails. `keep` gets each point as it is measured, with its GPU
    seconds: what a failure or Ctrl-C later leaves. Run n's prompts are salted base + n, base random
    per call (a campaign). `sampled` gets each serve point's /metrics sampler (its peak requests
    running and KV usage) under the point's id."""
    say = progress or (lambda line: None)
    kept = keep or (lambda point, seconds: None)
    # The warm-up's salt 10**6 may repeat: it only pays the server's one-time costs.
    base = salt_base()
    _warm_up(info)
    measured, gpu_s = [], 0.0
    serve = [p for p in points if p["kind"] == "serve"]
    for point in points:
        if point["kind"] == "memory":
            kv = info.kv_tokens
            if kv is not None:
                measured.append({**point, "measured": {"kv_tokens": kv}})
                kept(measured[-1], 0.0)
            continue
        n = len(measured) - sum(p["kind"] == "memory" for p in measured) + 1
        sampler = KvSampler(info.url)
        done, seconds = measure_serve(info, point, salt=base + n, sampler=sampler)
        if sampled is not None:
            sampled[point["id"]] = sampler
        seconds *= gpus_per_replica(point.get("flags", {}))  # a TP=2 run takes two GPUs' time
        gpu_s += seconds
        measured.append(done)
        kept(done, seconds)
        what = f"{point['requests']} requests, {seconds:.1f} GPU-s"
        say(f"[{n}/{len(serve)}] {point['id']}: {what}; {_brief(done['measured'])}")
    return measured, gpu_s


def measure_serve(
    info: ServerInfo, point: dict[str, Any], salt: int, sampler: KvSampler | None = None
) -> tuple[dict[str, Any], float]:
    """The serve point measured (metrics on the simulated clock, the send times without a concurrency
    cap) and its duration in GPU seconds; `sampler` samples /metrics during the load."""
    scale = info.time_scale
    requests = [dataclasses.replace(r, arrival_time=r.arrival_time / scale) for r in point_requests(point)]
    load = asyncio.run(_load(info, point, requests, salt, sampler))
    failed = [r for r in load.records if not r.success]
    if load.aborted:
        answered = f"{len(load.records) - len(failed)} of {len(requests)} requests answered"
        raise RunFailure(masked(f"run {point['id']} failed: {load.aborted} ({answered})"))
    if failed or len(load.records) < len(requests):
        error = failed[0].error if failed else "requests went unanswered"
        # a client error's text may quote the URL, password and all
        raise RunFailure(
            masked(f"run {point['id']} failed ({len(failed)} of {len(requests)} requests): {error}")
        )
    records = [rescaled(r, scale) for r in load.records]
    result = compute_metrics(records, load.duration * scale).to_dict()
    out = {**point, "measured": {m: float(f"{result[m]:.5g}") for m in point["measured"]}}
    if "concurrency" not in point:  # when the client really sent each request (the replay sends it then)
        by_id = dict(zip(load.request_ids, records, strict=True))
        first = min(r.start_time for r in records)
        out["sent"] = [round(by_id[r.request_id].start_time - first, 5) for r in requests]
    return out, load.duration * scale


async def _load(
    info: ServerInfo,
    point: dict[str, Any],
    requests: Sequence[Request],
    salt: int,
    sampler: KvSampler | None,
) -> LoadResult:
    """The point's load, with `sampler` reading /metrics while it runs (cancelled at its end)."""
    sampling = asyncio.create_task(sampler.run()) if sampler is not None else None
    try:
        return await run_load(
            info.url,
            info.model,
            requests,
            max_concurrency=point.get("concurrency"),
            endpoint=CHAT if point.get("api") == "chat" else COMPLETIONS,
            request_timeout_s=REQUEST_TIMEOUT_S,
            guard=StallWatch(STALL_S),
            salt=salt,
            api_key=client_api_key(),
        )
    finally:
        if sampling is not None:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling


def rescaled(record: RequestRecord, scale: float) -> RequestRecord:
    """A record timed on a server whose simulated clock runs `scale` x real time, on that clock."""
    if scale == 1.0:
        return record
    return dataclasses.replace(
        record,
        start_time=record.start_time * scale,
        ttft=record.ttft * scale,
        itl=[gap * scale for gap in record.itl],
        latency=record.latency * scale,
    )


def _warm_up(info: ServerInfo) -> None:
    """One short request first (a server's first request pays one-time costs), as vllm bench does."""
    probe = [Request(request_id=2**31 - 1, prompt_len=16, output_len=4)]
    key = client_api_key()
    load = asyncio.run(
        run_load(
            info.url, info.model, probe, request_timeout_s=REQUEST_TIMEOUT_S, guard=StallWatch(STALL_S),
            salt=10**6, api_key=key,
        )
    )  # fmt: skip
    if not load.records or not load.records[0].success:
        error = load.records[0].error if load.records else load.aborted or "no answer"
        raise AutotuneError(masked(f"{info.url}: the warm-up request failed: {error}"))


def _brief(values: dict[str, float]) -> str:
    shown = []
    for key, label in (("mean_ttft_ms", "TTFT"), ("mean_tpot_ms", "TPOT")):
        if key in values:
            shown.append(f"{label} {values[key]:.1f} ms")
    for key in ("output_throughput", "total_token_throughput"):
        if key in values:
            shown.append(f"{values[key]:,.0f} tok/s")
    return ", ".join(shown)
