"""API keys, as vLLM takes them: `vllm serve --api-key KEY` (or VLLM_API_KEY in its environment) makes
vLLM answer 401 to a /v1 request without `Authorization: Bearer KEY`; `vllm bench serve` sends
OPENAI_API_KEY's key."""

from __future__ import annotations

SERVER_KEY_VAR = "VLLM_API_KEY"
CLIENT_KEY_VARS = (SERVER_KEY_VAR, "OPENAI_API_KEY")  # in the order they are looked up
