"""vLLM's refusal of a request longer than the model's context, worded as vLLM words it
(vllm/entrypoints/openai/serving_engine.py `_validate_input`, vLLM 0.10.2 on): clients that parse the
message (to trim a prompt or clamp max_tokens) then read the simulated server as a real one."""

from __future__ import annotations


def context_problem(max_model_len: int, prompt_tokens: int, max_tokens: int | None) -> str | None:
    """Why vLLM refuses a request of `prompt_tokens` asking for `max_tokens` (None: not given), or None.

    A prompt may take at most max_model_len - 1 tokens (one is left to generate); with max_tokens given,
    prompt and completion together at most max_model_len.
    """
    if prompt_tokens >= max_model_len:
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages."
        )
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        return (
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens})."
        )
    return None
