"""The API server in front of the simulated engine core: what a request costs before it can be scheduled.

vLLM's OpenAI server parses the HTTP request, renders the chat template, tokenizes, and hands the
request to the engine-core process over ZMQ; the answer goes back the same way, detokenized and
streamed. Three effects matter for the numbers `vllm bench serve` reports:

- a fixed latency on every request (light-load TTFT is never just the prefill): larger for the chat
  API (template rendering, message parsing) than for completions;
- a serial intake: one asyncio process admits requests one after another, so a burst of N requests at
  t=0 reaches the engine over N x the per-request cost (chat far more than token-id completions);
- a streaming floor: the same process detokenizes and writes one SSE chunk per token, so a step that
  streams many tokens cannot end sooner than that work (the engine applies `per_token_s`).

`FrontendModel.ready_time` turns a send time into the time the engine core can first schedule the
request. The constants are fitted on the train split of benchmarks/fidelity_points.yaml; no point there
isolates the completions intake, which is the chat one less the chat-only work (docs/simulator.md,
"Request intake").
"""

from __future__ import annotations

from dataclasses import dataclass

COMPLETIONS_FIXED_S = 0.008  # send -> schedulable for a lone completions request
CHAT_EXTRA_S = 0.006  # the chat API's message parsing and template rendering: extra latency
# Serial work per request in the one API-server process (HTTP parsing, tokenization, the hand-off to
# the engine core): 5 ms for completions, 2 ms more for chat (template rendering), fitted on PR 18566
# together with the streaming cost below, which the same process spends on every token.
INTAKE_PER_REQUEST_S = 0.005
CHAT_INTAKE_EXTRA_S = 0.002
OUTPUT_PER_TOKEN_S = 30e-6  # detokenize + one SSE chunk per streamed token, in the same process


@dataclass
class FrontendModel:
    """One API server: a fixed latency, a serial per-request intake and a per-token streaming cost."""

    fixed_s: float = COMPLETIONS_FIXED_S
    chat_extra_s: float = CHAT_EXTRA_S
    per_request_s: float = INTAKE_PER_REQUEST_S
    chat_intake_extra_s: float = CHAT_INTAKE_EXTRA_S
    per_token_s: float = OUTPUT_PER_TOKEN_S
    _free_at: float = 0.0  # when the serial intake is done with the requests it has

    def ready_time(self, send_time: float, chat: bool = False) -> float:
        """When a request sent at `send_time` can join an engine step (call in time order)."""
        start = max(self._free_at, send_time)
        self._free_at = start + self.per_request_s + (self.chat_intake_extra_s if chat else 0.0)
        return start + self.fixed_s + (self.chat_extra_s if chat else 0.0)

    def stream(self, step_end: float, tokens: int) -> float:
        """When the server has streamed the `tokens` a step that ended at `step_end` produced.

        The same process does the intake, so a step's tokens wait behind requests still being
        admitted (and later intake waits behind them): under a burst first tokens are late.
        """
        self._free_at = max(self._free_at, step_end) + tokens * self.per_token_s
        return self._free_at
