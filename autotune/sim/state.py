"""The simulated engine's records: a request's engine-side state, what a step did, the server's counters."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autotune.measure.metrics import RequestRecord
from autotune.sim.frontend import Wave
from autotune.workloads.spec import Request

_KEY_STRIDE = 1 << 22  # block index bound per request in the integer block-hash keys


@dataclass
class StepOutput:
    """What one engine step did: its duration, the tokens it emitted and the requests it finished."""

    duration: float
    new_tokens: list[tuple[int, int]] = field(default_factory=list)  # (request_id, tokens emitted)
    finished: list[int] = field(default_factory=list)


@dataclass
class EngineStats:
    """vLLM's server-side counters and gauges (the /metrics names without the `vllm:` prefix)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    peak_kv_cache_usage: float = 0.0
    num_preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0  # tokens looked up
    prefix_cache_hits: int = 0  # tokens found
    num_aborted: int = 0  # requests aborted before they finished (vllm:request_success_total{abort})


class EngineRequest:
    """Engine-side state of one request."""

    __slots__ = (
        "rid", "prompt_len", "output_len", "prefix_id", "prefix_blocks", "send_time", "outputs",
        "computed", "blocks", "cached_upto", "gen", "decode_start", "decode_outputs", "finish_step",
        "segments", "prompt_counted", "seq", "wave", "latency", "preempted",
    )  # fmt: skip

    def __init__(self, request: Request, send_time: float, block_size: int) -> None:
        self.rid = request.request_id
        self.prompt_len = max(1, request.prompt_len)
        self.output_len = max(1, request.output_len)
        self.prefix_id = request.prefix_id
        self.prefix_blocks = (
            min(request.prefix_len, self.prompt_len) // block_size if request.prefix_id is not None else 0
        )
        self.send_time = send_time
        self.outputs = 0  # output tokens emitted before the current decode run
        self.computed = 0  # tokens with KV (valid while waiting or prefilling)
        self.blocks: list[int] = []
        self.cached_upto = 0  # blocks[:cached_upto] are registered in the prefix cache
        self.gen = 0  # bumped on preemption: invalidates pending events
        self.decode_start = -1  # step of the first decode of the current run (-1: not decoding)
        self.decode_outputs = 0  # outputs when the current decode run started
        self.finish_step = -1
        self.segments: list[tuple[int, int]] = []  # [first, last] steps of token emission runs
        self.prompt_counted = False
        self.seq = 0  # admission sequence number: running order
        self.wave = Wave(send_time)  # the API server's intake wave it is in (frontend.py)
        self.latency = 0.0  # from the wave's end to schedulable
        self.preempted = False  # once preempted, its own blocks may be looked up when it is re-admitted

    @property
    def ready(self) -> float:
        """When the API server has handed it to the engine core (moves while its wave grows)."""
        return self.wave.done + self.latency

    def key(self, i: int) -> object:
        """Hash of full block i: shared prefix blocks by prefix, the rest unique to the request."""
        if i < self.prefix_blocks:
            return (self.prefix_id, i)
        return self.rid * _KEY_STRIDE + i

    def computed_at(self, step: int) -> int:
        """KV tokens of a decoding request before `step` runs."""
        return self.prompt_len + self.decode_outputs - 1 + (step - self.decode_start)


def by_admission(r: EngineRequest) -> int:
    return r.seq


def client_record(req: EngineRequest, times: np.ndarray) -> RequestRecord:
    """What the client saw of a finished request: its tokens at `times[step]`, when each step's tokens
    reached the client (FrontendModel.delivery). Tokens delivered together went out as one chunk: one
    ITL gap."""
    parts = [times[a : b + 1] for a, b in req.segments]
    emitted = np.concatenate(parts) if len(parts) > 1 else parts[0]
    gaps = emitted[1:] - emitted[:-1]
    if not gaps.all():
        gaps = gaps[gaps > 0]  # tokens delivered together: one chunk, one gap
    return RequestRecord(
        prompt_len=req.prompt_len,
        output_len=int(emitted.size),
        start_time=req.send_time,
        ttft=float(emitted[0] - req.send_time),
        itl=gaps,  # an array: 8 bytes a token (a list of floats took 32: 3 GB for 200,000 requests)
        latency=float(emitted[-1] - req.send_time),
    )
