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
CHAT_EXTRA_S = 0.006  # the chat API's message parsing and template rendering, on top (both costs)
# Effective serial cost per request of an API server under a burst (it streams the running requests'
# tokens meanwhile, so this is more than a lone request's latency): 20 ms for chat, fitted on PR 18566;
# completions take that less the chat-only work.
INTAKE_PER_REQUEST_S = 0.014
OUTPUT_PER_TOKEN_S = 60e-6  # detokenize + one SSE chunk per streamed token, in the same process


@dataclass
class FrontendModel:
    """One API server: a fixed latency, a serial per-request intake and a per-token streaming cost."""

    fixed_s: float = COMPLETIONS_FIXED_S
    chat_extra_s: float = CHAT_EXTRA_S
    per_request_s: float = INTAKE_PER_REQUEST_S
    per_token_s: float = OUTPUT_PER_TOKEN_S
    _free_at: float = 0.0  # when the serial intake is done with the requests it has

    def ready_time(self, send_time: float, chat: bool = False) -> float:
        """When a request sent at `send_time` can join an engine step (call in send order)."""
        extra = self.chat_extra_s if chat else 0.0
        intake = self.per_request_s + extra
        self._free_at = max(self._free_at, send_time) + intake
        return self._free_at - intake + self.fixed_s + extra
