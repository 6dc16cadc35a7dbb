"""The saturation burst that opens a capacity search: every request at once, four running batches, so
that requests still wait until its 75th-percentile completion. Its mid-run completion rate bounds the
rates worth probing and its decode time sets the config's request lifetime (trial/capacity.py)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from autotune.backends.base import Session
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.capacity_report import BUDGET_STOP, BurstSummary
from autotune.measure.result import TrialResult
from autotune.measure.server_report import EngineFacts, ServerReport
from autotune.workloads.spec import WorkloadSpec

SATURATION_BATCHES = 4  # the saturation run sends this many times the batch the config can hold
MAX_SATURATION_REQUESTS = 4096
SIZING_REQUESTS = 256  # the first burst: it saturates a batch that KV memory limits, and sizes the next
DEFAULT_MAX_NUM_SEQS = 1024  # vLLM's largest per-GPU default, when the config leaves it unset
# What a burst shows of the engine's speed, which the guide's replay of it is checked against
# (tune/guide_check.py): the prefill queue (mean TTFT), the step at full batch (median ITL, mean TPOT)
# and the throughput. Not the p99s: one window's tail is noise at this size.
BURST_METRICS = ("mean_ttft_ms", "median_itl_ms", "mean_tpot_ms", "output_throughput")


def saturation_runs(
    session: Session, config: EngineConfig, workload: WorkloadSpec, seed: int, max_gpu_s: float | None = None
) -> list[TrialResult]:
    """The all-at-once runs that measure saturation throughput: the last one is the measurement.

    The burst is four running batches, so that requests still wait until its 75th-percentile
    completion (the throughput is read between the 25th and 75th). The batch is max_num_seqs only
    when KV memory holds that many requests: a decode-heavy 8B config on an L4 holds ~25, and 2,048
    requests at t=0 cost it 88 GPU-minutes. So a first burst of SIZING_REQUESTS reports the KV cache
    size, and a second, larger one runs only when the batch it implies needs it.

    `max_gpu_s` (a trial's cap, per GPU): a second burst that would pass it at the first one's pace is
    not run, and the first is returned as cut short (FailureKind.BUDGET_SPENT): no saturation, no search.
    """
    seqs = config.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    first = session.measure(workload.burst(saturation_burst(seqs)), (), seed)
    if not first.ok:
        return [first]
    needed = saturation_burst(seqs, _batch_limit(first, seqs))
    if needed <= SIZING_REQUESTS:
        return [first]
    sent = first.benchmark.completed + first.benchmark.failed if first.benchmark is not None else 0
    second_s = first.benchmark_s * needed / max(1, sent)  # a burst's time grows with its requests
    if max_gpu_s is not None and first.gpu_seconds + second_s > max_gpu_s:
        cap_h = max_gpu_s / 3600
        message = (
            f"{BUDGET_STOP}: a saturation burst of {needed} requests would pass the trial's "
            f"{cap_h:.2f} GPU-h per GPU"
        )
        return [dataclasses.replace(first, failure=FailureKind.BUDGET_SPENT, message=message)]
    return [first, session.measure(workload.burst(needed), (), seed)]


def burst_summaries(runs: Sequence[TrialResult], seed: int) -> tuple[BurstSummary, ...]:
    """`saturation_runs`' runs as the guide can replay them: each one's size, seed and BURST_METRICS
    (none when a run has no benchmark: it did not start or served nothing)."""
    out = []
    for run in runs:
        bench = run.benchmark
        if bench is None or not bench.completed:
            return ()
        out.append(BurstSummary(bench.completed + bench.failed, seed, burst_figures(run)))
    return tuple(out)


def burst_figures(run: TrialResult) -> dict[str, float]:
    """A burst's BURST_METRICS, rounded as a study stores them ({}: the run has no benchmark)."""
    figures = run.benchmark.to_dict() if run.benchmark is not None else {}
    return {name: round(float(figures[name]), 4) for name in BURST_METRICS if figures.get(name)}


def saturation_burst(seqs: int, batch: int | None = None) -> int:
    """The requests of a saturation burst: without `batch`, the first (sizing) one, at most
    SIZING_REQUESTS; with it (the requests KV memory holds at once), the one that measures:
    SATURATION_BATCHES batches, at most MAX_SATURATION_REQUESTS, or the sizing one when that is as many."""
    full = min(MAX_SATURATION_REQUESTS, SATURATION_BATCHES * seqs)
    needed = SIZING_REQUESTS if batch is None else min(full, SATURATION_BATCHES * batch)
    return needed if needed > SIZING_REQUESTS else min(full, SIZING_REQUESTS)


def _batch_limit(result: TrialResult, seqs: int) -> int:
    """How many of the burst's requests the server can run at once: the most it was seen running when
    that is fewer than the burst (a server whose flags are not ours to know, `bench --url`, says so in
    /metrics), else its max_num_seqs (the resolved one when the backend reports it), or fewer when its
    KV cache holds fewer (reported as tokens or blocks; unknown: max_num_seqs)."""
    server = result.server or ServerReport()
    engine = server.engine or EngineFacts()
    resolved = server.resolved or {}
    bench = result.benchmark
    running = bench.server.get("peak_num_requests_running") if bench is not None else None
    if running and bench is not None and running < bench.completed:
        return int(running)
    seqs = int(resolved.get("max_num_seqs") or seqs)
    kv_tokens = engine.kv_cache_tokens
    if kv_tokens is None and engine.num_gpu_blocks:
        kv_tokens = int(engine.num_gpu_blocks) * int(resolved.get("block_size") or 16)
    if not kv_tokens or bench is None or not bench.completed:
        return seqs
    return kv_batch(seqs, kv_tokens, (bench.total_input_tokens + bench.total_output_tokens) / bench.completed)


def kv_batch(seqs: int, kv_tokens: int, tokens_per_request: float) -> int:
    """The requests of `tokens_per_request` a KV cache of `kv_tokens` holds at once, at most `seqs`."""
    return max(1, min(seqs, math.ceil(kv_tokens / max(tokens_per_request, 1.0))))
