"""Per-request records -> BenchmarkResult, computed exactly as `vllm bench serve` does.

Reference: vllm/benchmarks/serve.py `calculate_metrics`. TPOT per request is
(E2EL - TTFT) / (output_len - 1); ITL gaps of all requests are pooled into one list;
percentiles are numpy's (linear interpolation); everything is reported in ms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # the ones `vllm bench serve --goodput` accepts


@dataclass(eq=False)  # __eq__ below: `itl` may be a numpy array, whose == is elementwise
class RequestRecord:
    """One request as the client saw it. Times are seconds; `start_time` is on the run's clock."""

    prompt_len: int
    output_len: int  # output tokens actually received
    start_time: float = 0.0
    ttft: float = 0.0
    itl: Sequence[float] = field(default_factory=list)  # gaps between token chunks after the first
    latency: float = 0.0  # E2EL: last token chunk - send time
    success: bool = True
    error: str = ""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestRecord):
            return NotImplemented
        fields = [f.name for f in dataclasses.fields(self) if f.name != "itl"]
        same = all(getattr(self, name) == getattr(other, name) for name in fields)
        return same and np.array_equal(np.asarray(self.itl, dtype=float), np.asarray(other.itl, dtype=float))

    @property
    def tpot(self) -> float:
        """(E2EL - TTFT) / (output_len - 1); 0 for one-token outputs, as in vLLM."""
        if self.output_len <= 1:
            return 0.0
        return (self.latency - self.ttft) / (self.output_len - 1)


@dataclass
class BenchmarkResult:
    """The metrics of one benchmark run, with the key names of `vllm bench serve`'s result JSON."""

    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    # {"ttft": {"mean": ms, "median": ms, "std": ms, "p50": ms, ...}, "tpot": ..., "itl": ..., "e2el": ...}
    latency_ms: dict[str, dict[str, float]]
    errors: list[str] = field(default_factory=list)
    # Server-side figures (preemptions, KV blocks, peak KV usage...), when the backend knows them.
    server: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> float:
        """A metric by its vllm bench serve key, e.g. "p99_ttft_ms" or "output_throughput"."""
        flat = self.to_dict()
        if key not in flat:
            raise KeyError(f"unknown metric {key!r}")
        return flat[key]

    def to_dict(self) -> dict[str, Any]:
        """A flat dict with vllm bench serve's keys (plus `server` figures under their own names)."""
        out: dict[str, Any] = {
            "duration": self.duration,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "errors": list(self.errors),  # as in vLLM's result JSON; without it from_dict lost them
        }
        for metric in LATENCY_METRICS:
            for stat, value in self.latency_ms[metric].items():
                out[f"{stat}_{metric}_ms"] = value
        out.update(self.server)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchmarkResult:
        """Inverse of `to_dict` (unknown keys go to `server`)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"latency_ms", "errors", "server"}
        latency: dict[str, dict[str, float]] = {m: {} for m in LATENCY_METRICS}
        server: dict[str, Any] = {}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            parts = key.split("_")
            if key in names:
                kwargs[key] = value
            elif len(parts) == 3 and parts[2] == "ms" and parts[1] in LATENCY_METRICS:
                latency[parts[1]][parts[0]] = value
            elif key != "errors":
                server[key] = value
        return cls(latency_ms=latency, errors=list(data.get("errors", [])), server=server, **kwargs)


def _stats_ms(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    arr = np.asarray(values, dtype=float) * 1000.0
    if arr.size == 0:
        arr = np.zeros(1)  # vLLM reports 0, not NaN, when nothing completed
    out = {"mean": float(arr.mean()), "median": float(np.median(arr)), "std": float(arr.std())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    return out


def compute_metrics(
    records: Sequence[RequestRecord],
    duration: float,
    goodput_slos_ms: Mapping[str, float] | None = None,
    server: Mapping[str, Any] | None = None,
) -> BenchmarkResult:
    """Aggregate per-request records over a run that lasted `duration` seconds.

    `goodput_slos_ms` maps "ttft"/"tpot"/"e2el" to a bound in ms, as `--goodput ttft:300`:
    a request is good when every named metric is <= its bound.
    """
    ok = [r for r in records if r.success]
    ttfts = [r.ttft for r in ok]
    e2els = [r.latency for r in ok]
    tpots = [r.tpot for r in ok if r.output_len > 1]
    itl_parts = [np.asarray(r.itl, dtype=float) for r in ok if len(r.itl)]
    itls = np.concatenate(itl_parts) if itl_parts else np.zeros(0)
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    dur = max(duration, 1e-9)
    goodput = None
    if goodput_slos_ms:
        unknown = set(goodput_slos_ms) - set(GOODPUT_METRICS)
        if unknown:
            raise ValueError(f"goodput supports {', '.join(GOODPUT_METRICS)}, not {sorted(unknown)}")
        values = {"ttft": lambda r: r.ttft, "tpot": lambda r: r.tpot, "e2el": lambda r: r.latency}
        # Compare seconds with bound / 1000 as vLLM does: value * 1000 <= bound disagrees with it at the
        # boundary (2.007 * 1000 > 2007.0 in floating point).
        good = sum(all(values[m](r) <= bound / 1000.0 for m, bound in goodput_slos_ms.items()) for r in ok)
        goodput = good / dur
    return BenchmarkResult(
        duration=duration,
        completed=len(ok),
        failed=len(records) - len(ok),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / dur,
        request_goodput=goodput,
        output_throughput=total_out / dur,
        total_token_throughput=(total_in + total_out) / dur,
        latency_ms={
            "ttft": _stats_ms(ttfts),
            "tpot": _stats_ms(tpots),
            "itl": _stats_ms(itls),
            "e2el": _stats_ms(e2els),
        },
        errors=sorted({r.error for r in records if not r.success and r.error}),
        server=dict(server or {}),
    )
