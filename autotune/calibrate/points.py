"""Measured points (benchmarks/fidelity_points.yaml's format) and their replay on the simulator.

A points file is YAML with `points:` (and optionally `sources:`, free text). Each point is one real
measurement the simulator can replay, under any Calibration:

  memory  the startup memory plan of `flags`: measured `kv_gib` (vLLM's "Available KV cache memory"),
          `kv_tokens` (num_gpu_blocks x block_size, from /metrics' vllm:cache_config_info) or `starts`
  step    one forward pass of `batch: {prefill, decode, context}`: measured `step_ms`
  serve   a `vllm bench serve`-style run: `requests`, `prompt` and `output` lengths (an int is fixed;
          {mean, sigma, max} a lognormal), all at t=0, at a fixed `concurrency` or at a Poisson `rate`;
          `api: chat` for the chat API; `cached: {first, rest}` prompt tokens already in the prefix
          cache; `sent` (without a concurrency): when each request was sent (s after the first), as
          a measurement recorded it, instead of t=0 or the rate's schedule; measured: throughputs
          (`request_throughput`, `output_throughput`, `total_token_throughput`) and
          `{mean,median,p99}_{ttft,tpot,itl,e2el}_ms`

Every point has `id` (unique in the file), `kind`, `model`, `gpu`, optional `flags` (vLLM flags in
snake_case), `split` (train / validation; default train), `source` and `run`; any other key is
refused. The requests of a serve point are a function of the point alone (seeded), so the requests a
calibration run sends are the ones its replay simulates.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.catalog.gpus import GIB, get_gpu
from autotune.catalog.models import get_model
from autotune.core.config import ENGINE_FLAGS, EngineConfig, check_flags
from autotune.core.errors import AutotuneError, EngineStartupError
from autotune.core.inputs import not_a_directory, read_yaml
from autotune.measure.metrics import compute_metrics
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.sim.costs import CostModel
from autotune.sim.memory import plan_memory
from autotune.sim.replay import simulate
from autotune.workloads.spec import MAX_REQUESTS, Request

THROUGHPUT = ("request_throughput", "output_throughput", "total_token_throughput")
LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p99")
METRICS = {
    "memory": ("kv_gib", "kv_tokens", "starts"),
    "step": ("step_ms",),
    "serve": THROUGHPUT + tuple(f"{s}_{m}_ms" for m in LATENCIES for s in STATS),
}
CLASSES = ("throughput", "latency", "memory")
# A point's keys: those of every kind ("any"; `run`: the designed run it measured) and each kind's own.
KEYS = {
    "any": ("id", "kind", "model", "gpu", "flags", "split", "source", "run", "measured"),
    "memory": (),
    "step": ("batch",),
    "serve": ("requests", "prompt", "output", "concurrency", "rate", "api", "cached", "sent"),
}
SPLITS = ("train", "validation")
FILE_KEYS = ("points", "sources", "rankings")
LENGTH_KEYS = ("mean", "sigma", "max")


@dataclass(frozen=True)
class Error:
    """One compared metric of one point."""

    point: str
    split: str
    metric: str
    simulated: float
    measured: float

    @property
    def signed(self) -> float:
        """simulated / measured - 1 (for `starts`: 0 when they agree, 1 when not)."""
        if self.metric == "starts":
            return float(self.simulated != self.measured)
        return self.simulated / self.measured - 1.0

    @property
    def metric_class(self) -> str:
        """throughput, latency (every *_ms) or memory (KV size, starts)."""
        if self.metric in THROUGHPUT:
            return "throughput"
        return "latency" if self.metric.endswith("_ms") else "memory"

    @property
    def fit_class(self) -> str:
        """What a calibration report groups by: throughput, ttft, tpot/itl, memory or latency (the rest)."""
        if self.metric_class != "latency":
            return self.metric_class
        if "_ttft_" in self.metric:
            return "ttft"
        return "tpot/itl" if "_tpot_" in self.metric or "_itl_" in self.metric else "latency"


def load_points(path: str | Path) -> list[dict[str, Any]]:
    """The points of a points file, checked (one AutotuneError line naming the point and the problem)."""
    path = Path(path)
    not_a_directory(path, "points file")
    if not path.is_file():
        raise AutotuneError(f"points file not found: {path}")
    data = read_yaml(path, "points file")
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list) or not points:
        raise AutotuneError(f"points file {path}: expected a non-empty list under 'points:'")
    unknown = next((k for k in data if k not in FILE_KEYS), None)
    if unknown is not None:  # a misspelt `ranking:` or `source:` would be dropped without a word
        raise AutotuneError(f"points file {path}: unknown key {unknown!r} ({', '.join(FILE_KEYS)})")
    _check_sources(data.get("sources"), f"points file {path}")
    first: dict[Any, int] = {}
    for i, point in enumerate(points):
        where = f"points file {path}, point {i + 1}"
        check_point(point, where)
        if point["id"] in first:  # --split, rankings and the report tell points by id
            raise AutotuneError(
                f"{where} ({point['id']}): id {point['id']!r} is point {first[point['id']]}'s too"
            )
        first[point["id"]] = i + 1
    return points


def check_point(point: Any, where: str) -> None:
    """AutotuneError (one line) when `point` is not a replayable measurement."""
    if not isinstance(point, dict):
        raise AutotuneError(f"{where}: expected a mapping, got {type(point).__name__}")
    where = f"{where} ({point.get('id', 'no id')})"
    for key in ("id", "kind", "model", "gpu", "measured"):
        if key not in point:
            raise AutotuneError(f"{where}: missing {key!r}")
    if isinstance(point["id"], bool) or not isinstance(point["id"], (str, int)):
        raise AutotuneError(f"{where}: id must be a name or a number, got {point['id']!r}")
    kind = point["kind"]
    if kind not in METRICS:
        raise AutotuneError(f"{where}: kind must be one of {', '.join(METRICS)}, got {kind!r}")
    unknown = next((k for k in point if k not in KEYS[kind] + KEYS["any"]), None)
    if unknown is not None:  # a typo (`concurency`) would replay another load than the one measured
        raise AutotuneError(
            f"{where}: unknown key {unknown!r} for a {kind} point ({', '.join(KEYS['any'] + KEYS[kind])})"
        )
    if point.get("split", "train") not in SPLITS:
        raise AutotuneError(f"{where}: split must be {' or '.join(SPLITS)}, got {point['split']!r}")
    try:
        get_model(str(point["model"]))
        get_gpu(str(point["gpu"]))
    except AutotuneError as exc:
        raise AutotuneError(f"{where}: {exc}") from None
    flags = point.get("flags", {})
    if not isinstance(flags, dict) or set(flags) - set(ENGINE_FLAGS):
        raise AutotuneError(f"{where}: flags must map vLLM flags ({', '.join(sorted(ENGINE_FLAGS))})")
    check_flags(flags, where)
    _check_measured(point, kind, where)
    if kind == "step":
        _check_ints(point.get("batch"), ("prefill", "decode", "context"), f"{where}: batch")
        if not point["batch"]["prefill"] + point["batch"]["decode"]:
            raise AutotuneError(f"{where}: batch has no token: a step needs prefill or decode tokens")
    if kind == "serve":
        _check_serve(point, where)


def _check_measured(point: dict[str, Any], kind: str, where: str) -> None:
    measured = point["measured"]
    if not isinstance(measured, dict) or not measured:
        raise AutotuneError(f"{where}: measured must map metric names to values")
    for metric, value in measured.items():
        if metric not in METRICS[kind]:
            raise AutotuneError(f"{where}: unknown {kind} metric {metric!r} ({', '.join(METRICS[kind])})")
        ok = isinstance(value, bool) if metric == "starts" else _positive(value)
        if not ok:
            raise AutotuneError(f"{where}: measured {metric} must be a positive number, got {value!r}")


def _check_sources(sources: Any, where: str) -> None:
    """`sources:` maps each source's name to its description (free text, or a mapping whose `fitted`,
    when given, is true or false)."""
    if sources is None:
        return
    if not isinstance(sources, dict):
        raise AutotuneError(f"{where}: sources must map source names to descriptions")
    for name, source in sources.items():
        fitted = source.get("fitted", True) if isinstance(source, dict) else True
        if not isinstance(fitted, bool):
            raise AutotuneError(f"{where}: source {name}: fitted must be true or false, got {fitted!r}")


def _check_serve(point: dict[str, Any], where: str) -> None:
    _check_ints(point, ("requests",), where)
    if point["requests"] > MAX_REQUESTS:
        raise AutotuneError(f"{where}: requests must be at most {MAX_REQUESTS:,}, got {point['requests']:,}")
    if "rate" in point and "concurrency" in point:
        raise AutotuneError(f"{where}: give a rate or a concurrency, not both")
    for key in ("prompt", "output"):
        spec = point.get(key)
        if isinstance(spec, dict):
            unknown = next((k for k in spec if k not in LENGTH_KEYS), None)
            if unknown is not None:
                raise AutotuneError(f"{where}: {key}: unknown key {unknown!r} ({', '.join(LENGTH_KEYS)})")
            if not (_positive(spec.get("mean")) and _positive(spec.get("sigma"))):
                raise AutotuneError(f"{where}: {key} needs a positive mean and sigma, got {spec!r}")
            most = spec.get("max", 1)
            if isinstance(most, bool) or not isinstance(most, int) or most < 1:
                raise AutotuneError(f"{where}: {key}'s max must be a whole number >= 1, got {most!r}")
        elif not (isinstance(spec, int) and not isinstance(spec, bool) and spec >= 1):
            raise AutotuneError(f"{where}: {key} must be a token count or {{mean, sigma, max}}, got {spec!r}")
    if "rate" in point and not _positive(point["rate"]):
        raise AutotuneError(f"{where}: rate must be a positive number of requests/s")
    if "concurrency" in point:
        _check_ints(point, ("concurrency",), where)
    if "cached" in point:
        _check_ints(point["cached"], ("first", "rest"), f"{where}: cached")
    if point.get("api", "completions") not in ("chat", "completions"):
        raise AutotuneError(f"{where}: api must be chat or completions, got {point['api']!r}")
    sent = point.get("sent")
    if sent is not None and (
        "concurrency" in point
        or not isinstance(sent, list)
        or len(sent) != point["requests"]
        or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 for t in sent)
    ):
        raise AutotuneError(f"{where}: sent must list one send time >= 0 per request (no concurrency)")


def _check_ints(block: Any, keys: Sequence[str], where: str) -> None:
    if not isinstance(block, dict):
        raise AutotuneError(f"{where}: expected a mapping with {', '.join(keys)}")
    for key in keys:
        value = block.get(key)
        least = 1 if key in ("requests", "concurrency") else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise AutotuneError(f"{where}: {key} must be a whole number, got {value!r}")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def point_config(point: dict[str, Any]) -> EngineConfig:
    """The point's engine config (its flags; the rest vLLM's defaults once resolved)."""
    return EngineConfig(model=point["model"]).replace(**point.get("flags", {}))


def _lengths(spec: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(spec, int):
        return np.full(n, spec)
    mu = np.log(spec["mean"]) - spec["sigma"] ** 2 / 2
    return np.clip(rng.lognormal(mu, spec["sigma"], n).round(), 4, spec.get("max", 1 << 20)).astype(int)


def point_requests(point: dict[str, Any]) -> list[Request]:
    """A serve point's requests (seeded: the same every time)."""
    n = int(point["requests"])
    rng = np.random.default_rng(0)
    prompts, outputs = _lengths(point["prompt"], n, rng), _lengths(point["output"], n, rng)
    # `rate`: Poisson arrivals (vllm bench serve --request-rate, burstiness 1); none: all at t=0.
    gaps = rng.exponential(1.0 / point["rate"], n) if "rate" in point else np.zeros(n)
    arrivals = np.cumsum(gaps) - gaps[0]
    if "sent" in point:
        arrivals = np.asarray(point["sent"], dtype=float)  # as measured (same lengths: same draws)
    return [
        Request(i, int(p), int(o), arrival_time=float(t))
        for i, (p, o, t) in enumerate(zip(prompts, outputs, arrivals, strict=True))
    ]


def _warmed(point: dict[str, Any], requests: list[Request]) -> tuple[list[Request], float]:
    """The requests preceded by those that left their prompts in the prefix cache, and the measured start.

    `cached: {first, rest}` gives the tokens of request 0 and of the others already cached when the
    measured run starts (the benchmark's single-prompt test run; earlier runs of a ladder on the same
    server, whose deterministic random prompts start with the same tokens). Each cached part is a
    prefix shared with one warm-up request (1 output token) sent long before the measured run.
    """
    cached = point.get("cached")
    if not cached:
        return requests, 0.0
    warm, measured = [], []
    start = 1e4  # the warm-up is long over by then
    for i, r in enumerate(requests):
        tokens = min(int(cached["first"] if i == 0 else cached["rest"]), r.prompt_len)
        if tokens > 0:
            warm.append(Request(len(requests) + i, tokens, 1, prefix_id=i, prefix_len=tokens))
        measured.append(
            dataclasses.replace(r, arrival_time=r.arrival_time + start, prefix_id=i, prefix_len=tokens)
        )
    return warm + measured, start


class Replay:
    """Points prepared once (configs, requests) and replayed under any Calibration."""

    def __init__(self, points: Iterable[dict[str, Any]]) -> None:
        self.points = list(points)
        self._requests = [
            _warmed(p, point_requests(p)) if p["kind"] == "serve" else ([], 0.0) for p in self.points
        ]

    def simulate(self, index: int, calibration: Calibration = DEFAULT_CALIBRATION) -> dict[str, float]:
        """Every metric the simulator gives for point `index`."""
        point = self.points[index]
        if point["kind"] == "memory":
            return _memory(point, calibration)
        if point["kind"] == "step":
            return _step(point, calibration)
        requests, start = self._requests[index]
        return _serve(point, requests, start, calibration)

    def errors(
        self, calibration: Calibration = DEFAULT_CALIBRATION, indices: Iterable[int] | None = None
    ) -> list[Error]:
        """One Error per measured metric of the points (all, or those at `indices`)."""
        out = []
        for i in range(len(self.points)) if indices is None else indices:
            point, simulated = self.points[i], self.simulate(i, calibration)
            for metric, measured in point["measured"].items():
                value = simulated.get(metric, float("nan"))
                out.append(Error(point["id"], point.get("split", "train"), metric, value, float(measured)))
        return out


def _memory(point: dict[str, Any], cal: Calibration) -> dict[str, float]:
    gpu, model = get_gpu(point["gpu"]), get_model(point["model"])
    config = point_config(point).with_vllm_defaults(gpu.memory_gib, gpu.name, model.max_position_embeddings)
    try:
        plan = plan_memory(config, model, gpu, cal)
    except EngineStartupError:
        return {"starts": 0.0, "kv_gib": 0.0, "kv_tokens": 0.0}  # a false "cannot start": -100% KV
    return {"starts": 1.0, "kv_gib": plan.kv_available_bytes / GIB, "kv_tokens": float(plan.kv_cache_tokens)}


def _step(point: dict[str, Any], cal: Calibration) -> dict[str, float]:
    gpu, model = get_gpu(point["gpu"]), get_model(point["model"])
    tp = int(point.get("flags", {}).get("tensor_parallel_size", 1))
    costs = CostModel(model, gpu, tp, model.kv_bytes_per_token(tp), cal)
    b = point["batch"]
    prefill, decode, ctx = int(b["prefill"]), int(b["decode"]), int(b["context"])
    pairs = prefill * (prefill + 1) / 2
    seconds = costs.step_time(
        prefill + decode, decode + (prefill > 0), decode + (prefill > 0), decode * ctx, pairs, prefill
    )
    return {"step_ms": seconds * 1000}


def _serve(
    point: dict[str, Any], requests: list[Request], start: float, cal: Calibration
) -> dict[str, float]:
    try:
        run = simulate(
            point_config(point),
            point["gpu"],
            requests,
            point.get("concurrency"),
            api=point.get("api"),
            calibration=cal,
        )
    except EngineStartupError:
        return {}  # the config does not start with these constants: every metric is missing
    records = [rec for rec in run.records if rec.start_time >= start]
    result = compute_metrics(records, run.duration - start)
    values = {name: getattr(result, name) for name in THROUGHPUT}
    for name, stats in result.latency_ms.items():
        for stat in STATS:
            values[f"{stat}_{name}_ms"] = stats[stat]
    return values


def evaluate(points: Iterable[dict[str, Any]], calibration: Calibration = DEFAULT_CALIBRATION) -> list[Error]:
    """Simulate every point; one Error per measured metric."""
    return Replay(points).errors(calibration)


def points_yaml(points: Sequence[dict[str, Any]], sources: dict[str, Any] | None = None) -> str:
    """A points file (what load_points reads back): one flow-style mapping per point."""
    import yaml

    lines = []
    if sources:
        lines.append(yaml.safe_dump({"sources": sources}, sort_keys=False, width=110).rstrip())
    lines.append("points:")
    first = ("id", "run", "kind", "source", "split", "model", "gpu", "flags")
    for point in points:
        ordered = {k: point[k] for k in first if k in point} | {
            k: v for k, v in point.items() if k not in first
        }
        text = yaml.safe_dump(ordered, sort_keys=False, default_flow_style=True, width=110).rstrip()
        lines.append("  - " + text.replace("\n", "\n    "))
    return "\n".join(lines) + "\n"


def medians(errors: Iterable[Error], group: str = "metric_class") -> dict[tuple[str, str], float]:
    """Median |error| per (split, class); `group` names the Error property that gives the class."""
    groups: dict[tuple[str, str], list[float]] = {}
    for e in errors:
        if e.metric == "starts" and group == "fit_class":
            continue  # a yes/no, not an error size
        groups.setdefault((e.split, getattr(e, group)), []).append(abs(e.signed))
    return {key: statistics.median(values) for key, values in groups.items()}
