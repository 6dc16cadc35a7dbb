"""The API server in front of the simulated engine core: request intake and token delivery.

vLLM V1 splits the server in two processes (`vllm/v1/engine/core.py`, `vllm/v1/engine/async_llm.py`).
The engine core steps on its own: after each step it puts the step's outputs on a queue for an IO
thread that pushes them over ZMQ, and goes on with the next step; nothing waits for the API server.
The API server is one asyncio process; what it does costs the client time, never engine steps:

- Intake. A request's handler parses it, renders the chat template, tokenizes, and only then hands
  it to the engine core. Its stages are separated by awaits, and asyncio runs ready tasks in FIFO
  order, so when many requests arrive together every one of them goes through the early stages
  before the first reaches the engine core: a burst reaches the engine as one wave, after the
  server's intake work for all of it (and a request that arrives while a wave is taken in joins
  it). Under a light load each request is its own wave.
- Delivery. `output_handler` detokenizes each step's outputs and puts them in the requests'
  `RequestOutputCollector`s; the per-request generators then send one SSE chunk each. When the
  handler falls behind it drains the waiting step outputs without yielding, and a collector merges
  the deltas it holds (`RequestOutputCollector.put`): several steps leave as one chunk, which
  `vllm bench serve` counts as one ITL gap. The handler yields between slices of 128 outputs
  (VLLM_V1_OUTPUT_PROC_CHUNK_SIZE), so a step with more outputs than that is consumed on its own.

`FrontendModel.take_in` puts a request in the current wave (its `ready` time follows the wave's
end); `stream` hands over a step's outputs; `delivery` gives when each step's tokens reached the
client. The output work is done promptly and also holds up the wave being taken in (one process).
The constants are the Calibration's (completions_fixed_s, chat_extra_s, intake_per_request_s,
chat_intake_extra_s, output_per_step_s, output_per_token_s, output_per_chunk_s), fitted on the train
split of benchmarks/fidelity_points.yaml (docs/simulator.md, "Request intake and delivery").
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration

OUTPUT_SLICE = 128  # outputs the handler processes between yields (vLLM's VLLM_V1_OUTPUT_PROC_CHUNK_SIZE)


class Wave:
    """Requests taken in together; `done` is when the server hands the last of them to the engine."""

    __slots__ = ("done",)

    def __init__(self, done: float) -> None:
        self.done = done


@dataclass
class _Output:
    step: int
    end: float  # when the engine core handed it over (the step's end)
    tokens: int


@dataclass
class FrontendModel:
    """One API server: intake in waves, outputs delivered as the server gets to them."""

    fixed_s: float  # send -> schedulable of a lone completions request, beyond the server's work
    chat_extra_s: float  # the chat API's extra latency
    per_request_s: float  # serial intake work per request
    chat_intake_extra_s: float  # extra intake work per chat request (template rendering)
    per_step_s: float  # output work per engine step (one ZMQ message)
    per_token_s: float  # output work per token (detokenize, RequestOutput)
    per_chunk_s: float  # output work per SSE chunk (the request's generator)
    delivered: list[float] = field(default_factory=list)  # by step: when its tokens reached the client
    _wave: Wave = field(default_factory=lambda: Wave(float("-inf")))
    _out_free: float = 0.0  # when the output handler is done with the outputs it has taken up
    _pending: deque[_Output] = field(default_factory=deque)  # outputs waiting for the handler

    @classmethod
    def of(cls, calibration: Calibration = DEFAULT_CALIBRATION) -> FrontendModel:
        """The API server with `calibration`'s constants."""
        cal = calibration
        return cls(
            fixed_s=cal.completions_fixed_s,
            chat_extra_s=cal.chat_extra_s,
            per_request_s=cal.intake_per_request_s,
            chat_intake_extra_s=cal.chat_intake_extra_s,
            per_step_s=cal.output_per_step_s,
            per_token_s=cal.output_per_token_s,
            per_chunk_s=cal.output_per_chunk_s,
        )

    def take_in(self, send_time: float, chat: bool = False) -> tuple[Wave, float]:
        """The wave a request sent at `send_time` joins, and its latency after the wave's end.

        Call in send order. The request can join an engine step from `wave.done + latency` on (the
        wave's end moves while later requests join it).
        """
        self._drain(send_time)
        if send_time >= self._wave.done:
            self._wave = Wave(send_time)  # the server is idle: a new wave
        self._wave.done += self.per_request_s + (self.chat_intake_extra_s if chat else 0.0)
        return self._wave, self.fixed_s + (self.chat_extra_s if chat else 0.0)

    def stream(self, step: int, step_end: float, tokens: int) -> None:
        """Hand over the `tokens` of step number `step` (steps in order), which ended at `step_end`."""
        if not tokens:
            self.delivered.append(step_end)  # nothing to deliver (prefill chunks only)
            return
        if not self._pending and self._out_free <= step_end:  # the handler is idle: at once
            work = self.per_step_s + tokens * (self.per_token_s + self.per_chunk_s)
            self._out_free = step_end + work
            self.delivered.append(self._out_free)
            if step_end < self._wave.done:
                self._wave.done += work
            return
        self._pending.append(_Output(step, step_end, tokens))
        self.delivered.append(float("inf"))  # set when the handler takes it up
        self._drain(step_end)

    def delivery(self) -> list[float]:
        """When each step's tokens reached the client (takes up every output still waiting)."""
        self._drain(float("inf"))
        return self.delivered

    def expected_delivery(self, step_end: float) -> float:
        """When the outputs handed over so far will have reached the client, if none merges with them.

        A client at fixed concurrency sends its next request when it sees the last one finish.
        """
        if not self._pending:
            return max(step_end, self.delivered[-1]) if self.delivered else step_end
        start = max(self._out_free, self._pending[0].end)
        return max(start, self._pending[-1].end) + self._work(list(self._pending))

    def _drain(self, now: float) -> None:
        """Take up the waiting outputs the handler gets to by `now`, merging those that wait together."""
        pending = self._pending
        while pending and max(self._out_free, pending[0].end) <= now:
            start = max(self._out_free, pending[0].end)
            batch = [pending.popleft()]
            # The handler merges waiting steps while it does not yield (each within one slice).
            while (
                batch[-1].tokens <= OUTPUT_SLICE
                and pending
                and pending[0].tokens <= OUTPUT_SLICE
                and pending[0].end <= start
            ):
                batch.append(pending.popleft())
            work = self._work(batch)
            self._out_free = start + work
            for out in batch:
                self.delivered[out.step] = self._out_free
            if start < self._wave.done:
                self._wave.done += work  # one process: the wave being taken in waits for it

    def _work(self, batch: list[_Output]) -> float:
        """Server time for a batch of step outputs: per step, per token, one chunk per request."""
        tokens = sum(out.tokens for out in batch)
        chunks = max(out.tokens for out in batch)  # a request has at most one token per step
        return len(batch) * self.per_step_s + tokens * self.per_token_s + chunks * self.per_chunk_s
