"""The sim-server's /metrics: vLLM's V1 Prometheus metrics, rendered by `prometheus_client`.

Names, label sets and types are vLLM's (vllm/v1/metrics/loggers.py; docs/vllm.md, "Metrics"), so
scrapers written for vLLM read the sim-server unchanged: gauges from the engine's stats, counters
(`*_total`), the request histograms the API server keeps, and the `vllm:cache_config_info` info
gauge. The histograms are counted here (cheap, on the engine loop's hot path) and handed to
`prometheus_client` as metric families at scrape time by a custom collector.

One name is not vLLM's: a server started with `--time-scale` (simulated seconds per wall-clock second,
not 1) adds the gauge `autotune:sim_time_scale`, so a client that times it (autotune calibrate) can
put its wall-clock measurements back on the simulated clock. Without the option /metrics is vLLM's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

# vLLM's histogram buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)

LABELS = ("engine", "model_name")
TIME_SCALE_METRIC = "autotune:sim_time_scale"
_GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches.", "num_running"),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "num_waiting"),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
)
_COUNTERS = (  # prometheus_client appends the _total suffix
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
     "prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
     "prefix_cache_hits"),
)  # fmt: skip
_HISTOGRAMS = (  # vLLM's order; time_per_output_token is the deprecated name of the ITL histogram (0.11)
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens"),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     "max_generation_tokens"),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "params_n"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "params_max_tokens"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.DEPRECATED: Use "
     "vllm:inter_token_latency_seconds instead.", "itl"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     "request_tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     "inference"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode"),
)  # fmt: skip


def one_two_five_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets, build_1_2_5_buckets (vllm/v1/metrics/loggers.py): 1, 2, 5, 10, 20,
    50, ... up to max_value."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


@dataclass
class Histogram:
    """Observation counts per fixed bucket (made cumulative when exported)."""

    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.count += 1
        self.total += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs, "+Inf" last, as prometheus_client takes them."""
        out, running = [], 0
        for bound, n in zip((*self.buckets, math.inf), self.counts, strict=True):
            running += n
            out.append((floatToGoString(bound), float(running)))  # prometheus_client's le text
        return out


def _latency() -> Histogram:
    return Histogram(REQUEST_LATENCY_BUCKETS)


@dataclass
class ServerMetrics:
    """The request-level histograms the API server keeps (engine gauges and counters come from stats).
    The token-count buckets follow `max_model_len`, as vLLM's do."""

    max_model_len: int
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    request_tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=_latency)
    queue: Histogram = field(default_factory=_latency)
    inference: Histogram = field(default_factory=_latency)
    prefill: Histogram = field(default_factory=_latency)
    decode: Histogram = field(default_factory=_latency)
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKEN_BUCKETS))
    prompt_tokens: Histogram = field(init=False)
    generation_tokens: Histogram = field(init=False)
    # per request once all its choices ended: the most tokens a choice generated, and n
    max_generation_tokens: Histogram = field(init=False)
    params_n: Histogram = field(default_factory=lambda: Histogram(N_BUCKETS))
    params_max_tokens: Histogram = field(init=False)  # per choice
    # Finished requests by reason; "abort" is the engine's count (stats.num_aborted).
    success: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0})

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "generation_tokens", "max_generation_tokens", "params_max_tokens"):
            setattr(self, name, Histogram(one_two_five_buckets(self.max_model_len)))


class SimCollector:
    """A prometheus_client collector reading the engine and the server's histograms at scrape time."""

    def __init__(
        self,
        engine: Any,
        metrics: ServerMetrics,
        model_name: str,
        gpu_utilization: float,
        time_scale: float = 1.0,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.labels = ["0", model_name]
        self.gpu_utilization = gpu_utilization
        self.time_scale = time_scale

    def collect(self) -> Iterator[Metric]:
        """Every metric family, in vLLM's order."""
        stats = self.engine.stats
        for name, doc, attr in _GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=LABELS)
            gauge.add_metric(self.labels, float(getattr(stats, attr)))
            yield gauge
        for name, doc, attr in _COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=LABELS)
            counter.add_metric(self.labels, float(getattr(stats, attr)))
            yield counter
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=(*LABELS, "finished_reason"),
        )
        for reason, n in (*self.metrics.success.items(), ("abort", stats.num_aborted)):
            success.add_metric([*self.labels, reason], float(n))
        yield success
        for name, doc, attr in _HISTOGRAMS:
            histogram: Histogram = getattr(self.metrics, attr)
            family = HistogramMetricFamily(name, doc, labels=LABELS)
            family.add_metric(self.labels, histogram.cumulative(), histogram.total)
            yield family
        yield self._cache_config_info()
        if self.time_scale != 1.0:
            scale = GaugeMetricFamily(TIME_SCALE_METRIC, "Simulated seconds per wall-clock second.")
            scale.add_metric([], self.time_scale)
            yield scale

    def _cache_config_info(self) -> GaugeMetricFamily:
        # vLLM's labels are CacheConfig's fields as str() (CacheConfig.metrics_info, vllm/config/cache.py):
        # those a client reads the serving config from carry the engine's values (autotune bench --url)
        cfg = self.engine.config
        info = {
            "block_size": str(cfg.block_size),
            "cache_dtype": str(cfg.kv_cache_dtype),
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
            "engine": "0",
            "gpu_memory_utilization": str(self.gpu_utilization),
            "is_attention_free": "False",
            "num_gpu_blocks": str(self.engine.memory.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
        }
        family = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(info)
        )
        family.add_metric(list(info.values()), 1.0)
        return family


def metrics_registry(
    engine: Any, metrics: ServerMetrics, model_name: str, gpu_utilization: float, time_scale: float = 1.0
) -> CollectorRegistry:
    """A private registry (no process or GC collectors: vLLM's names only) over this server's state."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SimCollector(engine, metrics, model_name, gpu_utilization, time_scale))
    return registry


def render_metrics(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of the registry."""
    return generate_latest(registry)
