"""A vLLM server's /metrics, as the real-server path reads it: Prometheus text parsed with
prometheus_client's parser, the counters compared before and after a load (preemptions, prefix-cache
hits), the KV-cache usage and running-requests gauges sampled during it (their peaks: the end misses
them), and the startup's KV block count (`vllm:cache_config_info`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

KV_SAMPLE_S = 0.25  # how often /metrics is sampled during the load (peak KV usage, requests running)
RUNNING = "vllm:num_requests_running"


class KvSampler:
    """Samples /metrics during the load to catch the peak KV-cache usage (a gauge: the end misses it)
    and the most requests the server ran at once (its batch: a server's max_num_seqs, or fewer when its
    KV cache holds fewer, which a server that is not ours to configure reports nowhere else)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.peak_kv: float | None = None
        self.peak_running: int | None = None

    async def run(self) -> None:
        """Sample until cancelled (the load's end cancels it)."""
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.get(self.base_url + "/metrics")
                    samples = parse_prometheus(response.text)
                    usage = kv_usage(samples)
                    if usage is not None:
                        self.peak_kv = max(usage, self.peak_kv or 0.0)
                    running = _total(samples, RUNNING)
                    if running is not None:
                        self.peak_running = max(int(running), self.peak_running or 0)
                await asyncio.sleep(KV_SAMPLE_S)


@dataclass(frozen=True)
class Sample:
    """One Prometheus sample line."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Parse Prometheus' text exposition format with prometheus_client's parser.

    Sample names are as exposed (a counter keeps its `_total`). Text the parser rejects ends the parse:
    the samples read before it are kept (a half-written scrape still gives what it has).
    """
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            samples.extend(Sample(s.name, dict(s.labels), float(s.value)) for s in family.samples)
    except ValueError:
        pass
    return samples


def scrape_metrics(base_url: str) -> list[Sample]:
    """GET /metrics; an empty list when the server does not answer."""
    try:
        response = httpx.get(base_url + "/metrics", timeout=5.0)
        response.raise_for_status()
    except httpx.HTTPError:
        return []
    return parse_prometheus(response.text)


def _total(samples: Sequence[Sample], name: str) -> float | None:
    """The sum over label sets of a counter, under its name with or without Prometheus' _total."""
    values = [s.value for s in samples if s.name in (name, name + "_total")]
    return sum(values) if values else None


def kv_usage(samples: Sequence[Sample]) -> float | None:
    """The KV-cache usage gauge (0-1; vLLM's V1 name or the older one), None when not exposed."""
    values = [s.value for s in samples if s.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")]
    return max(values) if values else None


def server_figures(
    before: Sequence[Sample], after: Sequence[Sample], peak_kv: float | None, peak_running: int | None = None
) -> dict[str, Any]:
    """Server-side figures of the run: preemptions, KV blocks, peak KV usage, prefix-cache hit rate, and
    the most requests it ran at once (when sampled)."""
    out: dict[str, Any] = {}

    def delta(name: str) -> float | None:
        end = _total(after, name)
        return None if end is None else end - (_total(before, name) or 0.0)

    preemptions = delta("vllm:num_preemptions")
    if preemptions is not None:
        out["num_preemptions"] = int(preemptions)
    for sample in after:
        if sample.name == "vllm:cache_config_info" and "num_gpu_blocks" in sample.labels:
            with contextlib.suppress(ValueError):
                out["num_gpu_blocks"] = int(float(sample.labels["num_gpu_blocks"]))
    last_kv = kv_usage(after)
    peaks = [v for v in (peak_kv, last_kv) if v is not None]
    if peaks:
        out["peak_kv_cache_usage"] = max(peaks)
    queries, hits = delta("vllm:prefix_cache_queries"), delta("vllm:prefix_cache_hits")
    if queries and hits is not None:
        out["prefix_cache_hit_rate"] = hits / queries
    if peak_running is not None:
        out["peak_num_requests_running"] = peak_running
    return out
