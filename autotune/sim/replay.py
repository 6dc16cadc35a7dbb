"""Replaying a workload on the simulated engine as `vllm bench serve` sends it: arrivals, an optional
concurrency cap, every request's record."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.catalog.gpus import GpuSpec
from autotune.core.config import EngineConfig
from autotune.measure.metrics import RequestRecord
from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.sim.engine import SimEngine
from autotune.sim.memory import MemoryPlan
from autotune.sim.noise import StepNoise
from autotune.sim.prefixes import text_prefixes
from autotune.sim.state import EngineStats
from autotune.workloads.spec import Request


@dataclass
class SimRun:
    """The result of replaying a workload on the simulated engine."""

    records: list[RequestRecord]
    duration: float
    stats: EngineStats
    memory: MemoryPlan
    num_steps: int
    min_free_blocks: int  # the fewest free KV blocks at any point of the run (SimEngine.min_free_blocks)
    waited_for_blocks: bool  # a request waited because the KV pool was short (SimEngine)


def simulate(
    config: EngineConfig,
    gpu: str | GpuSpec,
    requests: Sequence[Request],
    max_concurrency: int | None = None,
    noise: StepNoise | None = None,
    api: str | None = None,
    calibration: Calibration = DEFAULT_CALIBRATION,
) -> SimRun:
    """Replay requests as `vllm bench serve` sends them (arrival times, optional concurrency cap).

    A request is sent once it has arrived and (with max_concurrency) a slot is free; its record's
    start_time is that send time, so TTFT excludes the wait for a slot, as in vLLM's client. A finished
    request's successor is sent when the client sees it finish (the API server's delivery of that
    step, frontend.py), so (as over HTTP) it cannot join the step that starts when it ended. `api`
    "chat" prices the chat API's extra frontend work. `calibration`: the engine model's constants
    (default: the built-in ones).
    """
    chat = api == "chat"
    engine = SimEngine(config, gpu, noise, calibration)
    # Text prompts (JSONL) share prefixes as the sim-server finds them in what it is sent.
    order = text_prefixes(
        sorted(requests, key=lambda r: (r.arrival_time, r.request_id)), engine.config.block_size
    )
    slots = [0.0] * max_concurrency if max_concurrency else None  # times at which slots became free
    records: dict[int, RequestRecord] = {}
    i = 0
    while True:
        while i < len(order):
            req = order[i]
            if slots is not None and not slots:
                break  # every slot is busy
            send = _send_time(req, slots)
            if send > engine.next_start():  # it joins the intake wave the next step waits for
                break
            if slots is not None:
                heapq.heappop(slots)
            i += 1
            try:
                engine.add_request(req, chat, send)
            except ValueError as exc:
                records[req.request_id] = RequestRecord(
                    prompt_len=req.prompt_len, output_len=0, start_time=send, success=False, error=str(exc)
                )
                if slots is not None:
                    heapq.heappush(slots, send)
        if engine.has_unfinished():
            sendable = i < len(order) and (slots is None or bool(slots))
            # The engine steps on by itself until the next request is sent (engine.advance).
            out = engine.advance(_send_time(order[i], slots) if sendable else math.inf)
            if slots is not None and out.finished:
                seen = engine.frontend.expected_delivery(engine.now)  # the client sees the end then
                for _ in out.finished:
                    heapq.heappush(slots, seen)
        elif i < len(order):
            engine.now = _send_time(order[i], slots)
        else:
            break
    records.update(engine.finished_records())
    return SimRun(
        records=[records[r.request_id] for r in requests],
        duration=engine.now,
        stats=engine.stats,
        memory=engine.memory,
        num_steps=engine.num_steps,
        min_free_blocks=engine.min_free_blocks,
        waited_for_blocks=engine.waited_for_blocks,
    )


def _send_time(request: Request, slots: list[float] | None) -> float:
    """When the client sends `request`: at its arrival, or once a slot is free (`slots`: the times the
    busy ones free up, a heap; None: no concurrency cap)."""
    return request.arrival_time if slots is None else max(request.arrival_time, slots[0])
