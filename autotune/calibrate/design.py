"""The designed benchmark set: a few short runs whose results separate the calibration's constants.

Each run is a serve point (autotune.calibrate.points) measured on the server, and each pins a
different part of the model:

  light-c1, -c4, -c16  a light-load concurrency ladder: the fixed API-server latency (TTFT), the step's
                       CPU base and the weight streaming (TPOT at batch 1), the per-request CPU cost
                       and the decode attention (TPOT as the batch grows)
  chat-c1              the chat API's extra latency (TTFT against light-c1's)
  prefill-c1           a long prompt alone: prefill GEMM and attention efficiency (TTFT)
  prefill-burst        long prompts at once: chunked prefill at the token budget (throughput)
  decode-heavy         many long decodes: the KV read and the per-token streaming work (TPOT, ITL)
  burst, burst-chat    a saturated burst of mixed lengths: the serial request intake (the TTFT ramp),
                       saturated throughput; the chat burst the chat intake
  memory               the KV cache the server sized at startup (vllm:cache_config_info on /metrics)

Request counts are sized so that the whole set takes about the GPU time it is given, as the prior
calibration predicts it (the measured time is printed as it runs). A second config (another token
budget and max_num_seqs, launched by a backend) repeats the runs that depend on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.calibrate.points import Replay
from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.core.config import EngineConfig, gpus_per_replica
from autotune.sim.calibration import Calibration

_SHAREGPT_PROMPT = {"mean": 300, "sigma": 0.8, "max": 1024}  # a ShareGPT-like mix of lengths
_SHAREGPT_OUTPUT = {"mean": 150, "sigma": 0.8, "max": 512}
# Means and medians: a median shrugs off a request a busy client or server was late with. No ITL: vLLM
# streams tokens in bursts that the simulator, one token per step, does not model (docs/simulator.md).
_TTFT = ("mean_ttft_ms", "median_ttft_ms")
_TPOT = ("mean_tpot_ms", "median_tpot_ms")


@dataclass(frozen=True)
class Run:
    """One designed run at reference size (requests for about a minute of an 8B on one H100)."""

    name: str
    requests: int
    prompt: int | dict[str, Any]
    output: int | dict[str, Any]
    metrics: tuple[str, ...]
    concurrency: int | None = None
    api: str = "completions"
    least: int = 4  # requests below which the run says too little
    most: int = 1000  # requests beyond which it says nothing new (and only slows the fit's replays)

    def point(self, label: str, base: dict[str, Any], max_model_len: int) -> dict[str, Any]:
        """The run as a serve point of config `label` (lengths fitted into max_model_len)."""
        prompt, output = self.prompt, self.output
        if isinstance(prompt, int) and isinstance(output, int) and prompt + output > max_model_len:
            prompt = max(16, max_model_len - output - 1)
        point = {**base, "id": f"{label}-{self.name}", "run": self.name, "kind": "serve"}
        point["requests"] = self.requests
        point.update(prompt=prompt, output=output)
        if self.api == "chat":
            point["api"] = "chat"
        if self.concurrency is not None:
            point["concurrency"] = self.concurrency
        point["measured"] = dict.fromkeys(self.metrics, 0.0)  # filled in by the measurement
        return point


RUNS = (
    Run("light-c1", 6, 256, 128, (*_TTFT, *_TPOT), concurrency=1, least=3, most=24),
    Run("light-c4", 16, 256, 128, (*_TTFT, *_TPOT), concurrency=4, least=8, most=64),
    Run("light-c16", 48, 512, 128, (*_TTFT, *_TPOT, "output_throughput"), concurrency=16, least=32, most=256),
    Run("chat-c1", 6, 128, 16, _TTFT, concurrency=1, api="chat", least=3, most=16),
    Run("prefill-c1", 6, 4096, 4, _TTFT, concurrency=1, least=3, most=16),
    Run("prefill-burst", 48, 2048, 8, ("total_token_throughput", *_TTFT), least=16, most=256),
    Run("decode-heavy", 128, 1024, 384, (*_TPOT, "output_throughput"), concurrency=64, least=64, most=512),
    Run(
        "burst",
        400,
        _SHAREGPT_PROMPT,
        _SHAREGPT_OUTPUT,
        ("output_throughput", *_TTFT, "p99_ttft_ms", "mean_tpot_ms"),
        least=100,
    ),  # fmt: skip
    Run("burst-chat", 200, 200, 64, ("output_throughput", *_TTFT), api="chat", least=64, most=500),
)
# A second config (another token budget and max_num_seqs) repeats the runs that depend on them.
SECOND_CONFIG_RUNS = ("light-c4", "prefill-burst", "decode-heavy", "burst")


def resolved_config(flags: dict[str, Any], model: str, gpu: str) -> EngineConfig:
    """`flags` on `model` with vLLM's defaults for the rest, as vLLM resolves them on `gpu`."""
    spec = get_gpu(gpu)
    config = EngineConfig(model=model).replace(**flags)
    return config.with_vllm_defaults(spec.memory_gib, spec.name, get_model(model).max_position_embeddings)


def second_config_flags(first: dict[str, Any], model: str, gpu: str) -> dict[str, Any]:
    """Another token budget and max_num_seqs than the first config's (as vLLM resolves it on the GPU).
    With chunked prefill off the budget stays at or above max_model_len: vLLM refuses to start below."""
    resolved = resolved_config(first, model, gpu)
    first_budget, max_len = resolved.max_num_batched_tokens or 0, resolved.max_model_len or 0
    if resolved.enable_chunked_prefill:
        budget = 2048 if first_budget > 2048 else 8192
    else:
        budget = max_len if first_budget > max_len else 2 * max(first_budget, max_len)
    seqs = 128 if (resolved.max_num_seqs or 0) != 128 else 64
    return {"max_num_batched_tokens": budget, "max_num_seqs": seqs}


@dataclass(frozen=True)
class ConfigUnderTest:
    """A server config the designed set runs on: its label, vLLM flags and context length."""

    label: str
    flags: dict[str, Any]
    max_model_len: int
    runs: tuple[str, ...] = tuple(r.name for r in RUNS)
    chosen: bool = False  # calibrate chose it, not the user: skipped, not refused, if it cannot start


def designed_points(model: str, gpu: str, configs: Sequence[ConfigUnderTest]) -> list[dict[str, Any]]:
    """The designed set's points at reference size, measured values still zero: per config a memory
    point (the server's KV size; dropped when the server does not report it) and its runs."""
    points = []
    for config in configs:
        base = {"source": "autotune calibrate", "split": "train", "model": model, "gpu": gpu}
        base["flags"] = dict(config.flags)
        memory = {"id": f"{config.label}-memory", "kind": "memory", "measured": {"kv_tokens": 0}}
        points.append({**base, **memory})
        points += [r.point(config.label, base, config.max_model_len) for r in RUNS if r.name in config.runs]
    return points


def sized(points: list[dict[str, Any]], gpu_seconds: float, prior: Calibration) -> list[dict[str, Any]]:
    """The points with request counts scaled so that their runs take at most about `gpu_seconds` (as
    `prior` predicts: each run's simulated duration), each run between its least and most counts."""
    runs = {r.name: r for r in RUNS}
    out = [dict(p) for p in points]
    for _ in range(2):  # a second pass corrects for the runs held at their least count
        seconds = predicted_seconds(out, prior)
        total = sum(seconds)
        if total <= 0:
            break
        factor = gpu_seconds / total
        for point in out:
            if point["kind"] == "serve":
                run = runs[point["run"]]
                point["requests"] = min(run.most, max(run.least, round(point["requests"] * factor)))
    return out


def least_seconds(points: Sequence[dict[str, Any]], prior: Calibration) -> float:
    """The GPU seconds `prior` predicts for the points with every run at its least request count: the
    smallest designed set (what no --gpu-minutes can shrink)."""
    least = {r.name: r.least for r in RUNS}
    smallest = [{**p, "requests": least[p["run"]]} if p["kind"] == "serve" else p for p in points]
    return sum(predicted_seconds(smallest, prior))


def predicted_seconds(points: Sequence[dict[str, Any]], prior: Calibration) -> list[float]:
    """Each point's simulated GPU time under `prior`: its run time x its GPUs (0 for a memory point)."""
    replay = Replay(points)
    out = []
    for i, point in enumerate(points):
        if point["kind"] != "serve":
            out.append(0.0)
            continue
        values = replay.simulate(i, prior)
        throughput = values.get("request_throughput", 0.0)
        seconds = point["requests"] / throughput if throughput > 0 else 0.0
        out.append(seconds * gpus_per_replica(point["flags"]))
    return out
