"""The API server in front of the simulated engine core: what a request costs before it can be scheduled.

vLLM's OpenAI server parses the HTTP request, renders the chat template, tokenizes, and hands the
request to the engine-core process over ZMQ; the answer goes back the same way, detokenized and
streamed. Three effects matter for the numbers `vllm bench serve` reports:

- a fixed latency on every request (light-load TTFT is never just the prefill): larger for the chat
  API (template rendering, message parsing) than for completions;
- one process does the serial work of both directions: each request's intake (a few ms: parsing,
  tokenization, the hand-off; more for chat) and each streamed token (detokenize, one SSE chunk);
- so under a burst the two queue behind each other: N requests sent at t=0 reach the engine over
  N x the intake cost, and the tokens of the steps run meanwhile wait behind that intake (first
  tokens come late, then many requests decode together); with many streams the per-token work paces
  the engine (it hands a step's output over only once the server has taken the previous one).

`FrontendModel.ready_time` turns a send time into the time the engine core can first schedule the
request; `FrontendModel.stream` returns when a step's tokens have been streamed. The constants are the
Calibration's (completions_fixed_s, chat_extra_s, intake_per_request_s, chat_intake_extra_s,
output_per_token_s), fitted on the train split of benchmarks/fidelity_points.yaml (docs/simulator.md,
"Request intake"): the chat API's extra latency from GPUStack's vLLM 0.11 Qwen3-8B chat run at
concurrency 4 (a 64 ms mean TTFT for ~2 ms of prefill); the chat intake with the H100 compute scale
on PR 18566's 1,000-request burst and GPUStack's Qwen3-14B bursts (the completions intake is an
assumption: no completions burst in the data is bound by it); the per-token streaming cost bounded by
PR 18566 (above ~50 us its ~1,000 streams would slow its decode steps past the measured ITL).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration


@dataclass
class FrontendModel:
    """One API server: a fixed latency, and one serial queue for request intake and token streaming."""

    fixed_s: float
    chat_extra_s: float
    per_request_s: float
    chat_intake_extra_s: float
    per_token_s: float
    _free_at: float = 0.0  # when the server is done with the work it has taken up
    _stream_at: float = 0.0  # when the last step's tokens were handed over (not yet taken up)
    _stream_work: float = 0.0  # seconds of streaming work they need
    _streamed: float = 0.0  # when the last step's tokens were streamed, once taken up

    @classmethod
    def of(cls, calibration: Calibration = DEFAULT_CALIBRATION) -> FrontendModel:
        """The API server with `calibration`'s constants."""
        cal = calibration
        return cls(
            fixed_s=cal.completions_fixed_s,
            chat_extra_s=cal.chat_extra_s,
            per_request_s=cal.intake_per_request_s,
            chat_intake_extra_s=cal.chat_intake_extra_s,
            per_token_s=cal.output_per_token_s,
        )

    def ready_time(self, send_time: float, chat: bool = False) -> float:
        """When a request sent at `send_time` can join an engine step (call in send order).

        Work is taken up in event order: a request sent before the last step ended is taken in
        before that step's tokens are streamed, even when it is reported later (the sim-server hands
        requests over mid-step, with the time at which they were sent).
        """
        self._take_up_stream(send_time)
        start = max(self._free_at, send_time)
        self._free_at = start + self.per_request_s + (self.chat_intake_extra_s if chat else 0.0)
        return start + self.fixed_s + (self.chat_extra_s if chat else 0.0)

    def streamed_at(self) -> float:
        """When the server has streamed (or will have, behind the work it has) the last step's tokens."""
        if not self._stream_work:
            return self._streamed
        return max(self._free_at, self._stream_at) + self._stream_work

    def stream(self, step_end: float, tokens: int) -> None:
        """Hand over the `tokens` of a step that ended at `step_end`, to be streamed in turn."""
        self._take_up_stream(step_end)
        self._stream_at, self._stream_work = step_end, tokens * self.per_token_s

    def _take_up_stream(self, now: float) -> None:
        if self._stream_work and self._stream_at <= now:
            self._streamed = self._free_at = self.streamed_at()
            self._stream_work = 0.0
