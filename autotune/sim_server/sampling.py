"""vLLM's checks of a request's sampling parameters, with its messages (a 400 "BadRequestError").

`sampling_problem` is SamplingParams._verify_args (vllm/sampling_params.py), which vLLM's API server
runs when it builds a request's sampling parameters, after the context-length check and with the
max_tokens it settled on (get_max_tokens in vllm/entrypoints/utils.py: the context left when the
request sets none). `engine_problem` is what the V1 engine's input processor refuses when the request
reaches it. The checks run in vLLM's order, so a request with several faults is told the first vLLM
finds.

Values that are not numbers are vLLM's request model's to refuse (pydantic, which also takes numeric
strings); they are not checked here. Fields the request leaves null take their defaults, as
SamplingParams.from_optional gives them.
"""

from __future__ import annotations

from typing import Any

_PENALTY_RANGE = (-2.0, 2.0)
MAX_LOGPROBS = 20  # vLLM's --max-logprobs default (ModelConfig.max_logprobs, vllm/config/model.py)
GREEDY_BELOW = 1e-5  # a temperature below this samples greedily (_SAMPLING_EPS, vllm/sampling_params.py)


def _given(body: dict[str, Any], key: str) -> int | float | None:
    """A numeric field of the request (None when absent, null or not a number)."""
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def min_tokens(body: dict[str, Any]) -> int:
    """The request's min_tokens (0 when absent, null or not an int: vLLM's request model takes ints)."""
    value = _given(body, "min_tokens")
    return value if isinstance(value, int) else 0


def sampling_problem(body: dict[str, Any], n: int, max_tokens: int) -> str | None:
    """vLLM's message for the first sampling parameter SamplingParams refuses, None if it takes them all.

    `n` is the request's (already checked), `max_tokens` the limit vLLM settled on for it."""
    best_of = _given(body, "best_of")
    if best_of is not None:
        if best_of < 1:
            return f"best_of must be at least 1, got {best_of}"
        if best_of < n:
            return f"best_of must be greater than or equal to n, got n={n} and best_of={best_of}."
    for key in ("presence_penalty", "frequency_penalty"):
        penalty = _given(body, key)
        if penalty is not None and not _PENALTY_RANGE[0] <= penalty <= _PENALTY_RANGE[1]:
            return f"{key} must be in [-2, 2], got {float(penalty)}."
    # The float fields print as floats: pydantic made them floats before vLLM formatted them.
    repetition_penalty = _given(body, "repetition_penalty")
    if repetition_penalty is not None and repetition_penalty <= 0:
        return f"repetition_penalty must be greater than zero, got {float(repetition_penalty)}."
    temperature = _given(body, "temperature")
    if temperature is not None and temperature < 0:
        return f"temperature must be non-negative, got {float(temperature)}."
    top_p = _given(body, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        return f"top_p must be in (0, 1], got {float(top_p)}."
    top_k = _given(body, "top_k")
    if top_k is not None and top_k < -1:
        return f"top_k must be 0 (disable), or at least 1, got {top_k}."
    min_p = _given(body, "min_p")
    if min_p is not None and not 0 <= min_p <= 1:
        return f"min_p must be in [0, 1], got {float(min_p)}."
    if max_tokens < 1:
        return f"max_tokens must be at least 1, got {max_tokens}."
    least = min_tokens(body)
    if least < 0:
        return f"min_tokens must be greater than or equal to 0, got {least}."
    if least > max_tokens:
        return f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {least}."
    stop = body.get("stop")
    if stop == "" or (isinstance(stop, list) and "" in stop):
        return "stop cannot contain an empty string."
    temperature = _given(body, "temperature")
    if temperature is not None and temperature < GREEDY_BELOW and n > 1:  # greedy: every choice alike
        return f"n must be 1 when using greedy sampling, got {n}."
    return None


def logprobs_problem(body: dict[str, Any], chat: bool) -> str | None:
    """The request model's own check of the logprobs fields (check_logprobs, vllm/entrypoints/openai/
    protocol.py), which runs as the body is read, before any other check; None when it passes."""
    prompt_logprobs = _given(body, "prompt_logprobs")
    if prompt_logprobs is not None:
        if body.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            return "`prompt_logprobs` are not available when `stream=True`."
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            return "`prompt_logprobs` must be a positive value or -1."
    if not chat:
        logprobs = _given(body, "logprobs")
        return "`logprobs` must be a positive value." if logprobs is not None and logprobs < 0 else None
    top_logprobs = _given(body, "top_logprobs")
    if top_logprobs is not None:
        if top_logprobs < 0 and top_logprobs != -1:
            return "`top_logprobs` must be a positive value or -1."
        if (top_logprobs == -1 or top_logprobs > 0) and not body.get("logprobs"):
            return "when using `top_logprobs`, `logprobs` must be set to true."
    return None


def _logprobs(body: dict[str, Any], chat: bool) -> int | float | None:
    """The sample logprobs a request asks for: a chat request's top_logprobs when it sets `logprobs`
    (ChatCompletionRequest.to_sampling_params), a completion's `logprobs`."""
    if chat:
        return _given(body, "top_logprobs") if body.get("logprobs") else None
    return _given(body, "logprobs")


def engine_problem(body: dict[str, Any], chat: bool, vocab_size: int) -> str | None:
    """vLLM's message for what the V1 engine's input processor refuses (vllm/v1/engine/processor.py:
    _validate_logprobs, then _validate_supported_sampling_params), None if it takes the request.

    vLLM meets these when the request reaches the engine: a streamed request's 200 response has begun."""
    logprobs = _logprobs(body, chat)
    if logprobs:
        requested = vocab_size if logprobs == -1 else logprobs
        if requested > MAX_LOGPROBS:
            return (
                f"Requested sample logprobs of {requested}, which is greater than max allowed: {MAX_LOGPROBS}"
            )
    best_of = _given(body, "best_of")
    if best_of is not None and best_of > 1:
        return "vLLM V1 does not yet support best_of."
    return None
