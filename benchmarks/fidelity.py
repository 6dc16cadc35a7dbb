"""Simulator fidelity: replay published vLLM measurements on the simulator and print the errors.

Reads benchmarks/fidelity_points.yaml (sources, setups, measured values, train/validation split) and
prints, per point and metric, the simulated value, the measured value and the signed error
(simulated / measured - 1), then the median |error| per split and metric class (throughput, latency,
memory), then the ranking checks: the gain between two points that differ in the flags a tuner searches
(TP, token budget, max_num_seqs), simulated against measured. tests/test_fidelity.py bounds the
validation medians and the ranking checks.

    python benchmarks/fidelity.py [--points benchmarks/fidelity_points.yaml] [--split validation]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from autotune.catalog.gpus import GIB, get_gpu
from autotune.catalog.models import get_model
from autotune.core.config import EngineConfig
from autotune.core.errors import EngineStartupError
from autotune.measure.metrics import compute_metrics
from autotune.sim.costs import CostModel
from autotune.sim.memory import plan_memory
from autotune.sim.replay import simulate
from autotune.workloads.spec import Request

POINTS = Path(__file__).with_name("fidelity_points.yaml")
THROUGHPUT = ("request_throughput", "output_throughput", "total_token_throughput")
CLASSES = ("throughput", "latency", "memory")
RANKING_BOUND = 0.10  # |simulated gain / measured gain - 1| a ranking check must stay within


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


@dataclass(frozen=True)
class Ranking:
    """One ranking check: the measured and simulated gain of one point over another."""

    check: str
    split: str
    flags: str
    simulated: float  # simulated numerator / simulated denominator
    measured: float

    @property
    def error(self) -> float:
        """simulated gain / measured gain - 1."""
        return self.simulated / self.measured - 1.0

    @property
    def sign_agrees(self) -> bool:
        """Both gains on the same side of 1 (a config the tuner should prefer stays preferred)."""
        return (self.simulated - 1.0) * (self.measured - 1.0) > 0

    @property
    def passes(self) -> bool:
        """The sign agrees and the size is within RANKING_BOUND."""
        return self.sign_agrees and abs(self.error) <= RANKING_BOUND


def load_points(path: Path = POINTS) -> list[dict[str, Any]]:
    """The points of the data file."""
    return list(yaml.safe_load(path.read_text())["points"])


def unfitted_points(path: Path = POINTS) -> set[str]:
    """Ids of the points whose source is marked `fitted: false` (reported, left out of the fit)."""
    data = yaml.safe_load(path.read_text())
    skip = {name for name, src in data["sources"].items() if src.get("fitted") is False}
    return {p["id"] for p in data["points"] if p["source"] in skip}


def load_rankings(path: Path = POINTS) -> list[dict[str, Any]]:
    """The ranking checks of the data file."""
    return list(yaml.safe_load(path.read_text()).get("rankings", []))


def rankings(checks: Iterable[dict[str, Any]], errors: Iterable[Error]) -> list[Ranking]:
    """Each check's simulated and measured gain, from the evaluated points' errors."""
    by_key = {(e.point, e.metric): e for e in errors}
    out = []
    for check in checks:
        num = by_key[(check["numerator"], check["metric"])]
        den = by_key[(check["denominator"], check["metric"])]
        split = "validation" if "validation" in (num.split, den.split) else "train"
        out.append(
            Ranking(
                check["id"],
                split,
                check.get("flags", ""),
                num.simulated / den.simulated,
                num.measured / den.measured,
            )
        )
    return out


def _config(point: dict[str, Any]) -> EngineConfig:
    return EngineConfig(model=point["model"]).replace(**point.get("flags", {}))


def _lengths(spec: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(spec, int):
        return np.full(n, spec)
    mu = np.log(spec["mean"]) - spec["sigma"] ** 2 / 2
    return np.clip(rng.lognormal(mu, spec["sigma"], n).round(), 4, spec.get("max", 1 << 20)).astype(int)


def _requests(point: dict[str, Any]) -> list[Request]:
    n = int(point["requests"])
    rng = np.random.default_rng(0)
    prompts, outputs = _lengths(point["prompt"], n, rng), _lengths(point["output"], n, rng)
    # `rate`: Poisson arrivals (vllm bench serve --request-rate, burstiness 1); none: all at t=0.
    gaps = rng.exponential(1.0 / point["rate"], n) if "rate" in point else np.zeros(n)
    arrivals = np.cumsum(gaps) - gaps[0]
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


def _memory(point: dict[str, Any]) -> dict[str, float]:
    gpu, model = get_gpu(point["gpu"]), get_model(point["model"])
    config = _config(point).with_vllm_defaults(gpu.memory_gib, gpu.name, model.max_position_embeddings)
    try:
        plan = plan_memory(config, model, gpu)
    except EngineStartupError:
        return {"starts": 0.0, "kv_gib": 0.0}  # a false "cannot start": -100% KV
    return {"starts": 1.0, "kv_gib": plan.kv_available_bytes / GIB}


def _step(point: dict[str, Any]) -> dict[str, float]:
    gpu, model = get_gpu(point["gpu"]), get_model(point["model"])
    tp = int(point.get("flags", {}).get("tensor_parallel_size", 1))
    costs = CostModel(model, gpu, tp, model.kv_bytes_per_token(tp))
    b = point["batch"]
    prefill, decode, ctx = int(b["prefill"]), int(b["decode"]), int(b["context"])
    pairs = prefill * (prefill + 1) / 2
    seconds = costs.step_time(
        prefill + decode, decode + (prefill > 0), decode + (prefill > 0), decode * ctx, pairs, prefill
    )
    return {"step_ms": seconds * 1000}


def _serve(point: dict[str, Any]) -> dict[str, float]:
    requests, start = _warmed(point, _requests(point))
    run = simulate(_config(point), point["gpu"], requests, point.get("concurrency"), api=point.get("api"))
    records = [rec for rec in run.records if rec.start_time >= start]
    result = compute_metrics(records, run.duration - start)
    values = {name: getattr(result, name) for name in THROUGHPUT}
    for name, stats in result.latency_ms.items():
        for stat in ("mean", "median"):
            values[f"{stat}_{name}_ms"] = stats[stat]
    return values


def evaluate(points: Iterable[dict[str, Any]]) -> list[Error]:
    """Simulate every point; one Error per measured metric."""
    kinds = {"memory": _memory, "step": _step, "serve": _serve}
    errors = []
    for point in points:
        simulated = kinds[point["kind"]](point)
        for metric, measured in point["measured"].items():
            value = simulated.get(metric, float("nan"))
            errors.append(Error(point["id"], point["split"], metric, value, float(measured)))
    return errors


def medians(errors: Iterable[Error]) -> dict[tuple[str, str], float]:
    """Median |error| per (split, metric class)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for e in errors:
        groups.setdefault((e.split, e.metric_class), []).append(abs(e.signed))
    return {key: statistics.median(values) for key, values in groups.items()}


def main(argv: list[str] | None = None) -> int:
    """Print the per-point table and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=Path, default=POINTS)
    parser.add_argument("--split", choices=("train", "validation"), default=None)
    args = parser.parse_args(argv)
    points = load_points(args.points)
    checks = load_rankings(args.points)
    needed = {c[k] for c in checks for k in ("numerator", "denominator")}
    points = [p for p in points if args.split in (None, p["split"]) or p["id"] in needed]
    errors = evaluate(points)
    ranks = [r for r in rankings(checks, errors) if args.split in (None, r.split)]
    errors = [e for e in errors if args.split in (None, e.split)]
    print(f"{'point':34} {'split':10} {'metric':20} {'simulated':>11} {'measured':>11} {'error':>8}")
    for e in errors:
        print(
            f"{e.point:34} {e.split:10} {e.metric:20} {e.simulated:11.2f} {e.measured:11.2f} {e.signed:+8.1%}"
        )
    print("\nmedian |error| (points within bound)")
    for (split, cls), value in sorted(medians(errors).items()):
        group = [e for e in errors if e.split == split and e.metric_class == cls]
        bound = 0.10 if cls == "throughput" else 0.20
        within = sum(abs(e.signed) <= bound for e in group)
        print(f"  {split:10} {cls:10} {value:6.1%}  ({within}/{len(group)} within {bound:.0%})")
    unfitted = unfitted_points(args.points)
    fitted = [e for e in errors if e.split == "train" and e.point not in unfitted]
    for (_, cls), value in sorted(medians(fitted).items()):
        print(f"  {'train fit':10} {cls:10} {value:6.1%}  (train points of fitted sources only)")
    print_rankings(ranks)
    return 0


def print_rankings(ranks: list[Ranking]) -> None:
    """The ranking checks: simulated and measured gain, the ratio's error, pass/fail."""
    if not ranks:
        return
    print(f"\n{'ranking check':34} {'split':10} {'simulated':>9} {'measured':>9} {'error':>8}  flags")
    for r in ranks:
        mark = "ok" if r.passes else ("SIGN" if not r.sign_agrees else "FAIL")
        gains = f"{r.simulated:9.3f} {r.measured:9.3f} {r.error:+8.1%}"
        print(f"{r.check:34} {r.split:10} {gains}  {mark:4} {r.flags}")
    for split in ("train", "validation"):
        group = [r for r in ranks if r.split == split]
        if group:
            med = statistics.median(abs(r.error) for r in group)
            ok = sum(r.passes for r in group)
            verdict = f"({ok}/{len(group)} pass: sign and within {RANKING_BOUND:.0%})"
            print(f"  {split:10} ranking  median |error| {med:6.1%}  {verdict}")


if __name__ == "__main__":
    sys.exit(main())
