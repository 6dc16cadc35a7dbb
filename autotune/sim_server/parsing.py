"""Request parsing for the sim-server: vLLM's validation of a completions / chat body, prompt lengths
without a tokenizer, and which requests share a prompt prefix.

What the simulation cannot know, and what it does instead:
  - Text prompts have no tokenizer: their length is estimated at ~4 characters per token
    (`autotune.workloads.jsonl.CHARS_PER_TOKEN`), plus a few template tokens per chat message. Token-id
    prompts (completions) have their exact length.
  - The model never emits EOS on its own before `max_tokens`: with `max_tokens` set, the output is
    exactly `max_tokens` long (finish_reason "length") with or without `ignore_eos`. Completions
    default to max_tokens=16 as in vLLM; a chat request (or `"max_tokens": null`) without a limit gets
    a simulated answer of DEFAULT_OUTPUT_TOKENS tokens (`min_tokens` if more), finish_reason "stop";
    as in vLLM its limit is then the context left, and an answer cut there (or one with `ignore_eos`,
    which runs to it) finishes "length".
  - Prefix caching needs to know which requests share a prompt prefix: requests are grouped by their
    first block of tokens (or characters) and share their longest common prefix with the group's
    first request (`autotune.sim.prefixes.PrefixIndex`, which the in-process replay uses too).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

from autotune.sim.context import context_problem
from autotune.sim.prefixes import PrefixIndex, text_index
from autotune.sim_server.sampling import engine_problem, logprobs_problem, min_tokens, sampling_problem
from autotune.workloads.jsonl import CHARS_PER_TOKEN

DEFAULT_OUTPUT_TOKENS = 256  # simulated answer length when a request sets no max_tokens
CHAT_TOKENS_PER_MESSAGE = 5  # role header and end-of-turn tokens of a typical chat template
CHAT_TOKENS_FIXED = 4  # BOS plus the assistant header that starts the answer
_INT_TYPES = frozenset((int, bool))
DEFAULT_MAX_N = 16384  # vLLM's default VLLM_MAX_N_SEQUENCES


def estimate_text_tokens(text: str) -> int:
    """Tokens of a text prompt without a tokenizer (~4 characters per token, at least 1)."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def _chat_text(messages: Any) -> tuple[str, int]:
    """(all message text, template tokens) of a chat request; ValueError on a malformed message list."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError("each message needs a role")
        content = message.get("content") or ""
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("the text of a content part must be a string")
            content = "".join(texts)
        parts.append(str(content))
    return "".join(parts), CHAT_TOKENS_FIXED + CHAT_TOKENS_PER_MESSAGE * len(messages)


def max_n() -> int:
    """vLLM's bound on `n` (vllm/sampling_params.py, VLLM_MAX_N_SEQUENCES in vllm/envs.py): a huge
    fan-out is refused, not queued."""
    try:
        return int(os.environ.get("VLLM_MAX_N_SEQUENCES", DEFAULT_MAX_N))
    except ValueError:
        return DEFAULT_MAX_N


def _stream_options(options: Any, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of `stream_options`, checked as vLLM's request model
    does (a 400, never a 500): an object of booleans (or nulls), and only with `stream: true`. As vLLM's
    StreamOptions, an object without `include_usage` asks for the usage (its default is true), and
    continuous usage comes only with it (serving_completion.py, serving_chat.py)."""
    if options is None:
        return False, False
    if not isinstance(options, dict):
        raise BadRequest(f"stream_options: Input should be a valid dictionary, got {type(options).__name__}")
    for key in ("include_usage", "continuous_usage_stats"):
        if not isinstance(options.get(key), (bool, type(None))):
            raise BadRequest(f"stream_options.{key}: Input should be a valid boolean")
    if options and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    include = options.get("include_usage", True) is True
    return include, include and options.get("continuous_usage_stats") is True


PROMPT_TYPES = "prompt must be a string, a list of token ids, or a non-empty list of either"


def _batch(prompt: Any) -> list[Any]:
    """A completion's prompts: a list of strings or of token-id lists is a batch (CompletionRequest's
    `prompt: list[int] | list[list[int]] | str | list[str]`, vllm/entrypoints/openai/protocol.py), any
    other value one prompt (checked as one)."""
    kinds = {type(p) for p in prompt} if isinstance(prompt, list) else set()
    if kinds in ({str}, {list}):
        return prompt
    return [prompt]


class BadRequest(Exception):
    """A request vLLM would reject with 400 (or `status`)."""

    def __init__(
        self, message: str, status: int = 400, kind: str = "BadRequestError", in_stream: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        # refused by the engine after a streamed response began: vLLM sends the error as an SSE event
        self.in_stream = in_stream


def error_body(message: str, status: int = 400, kind: str = "BadRequestError") -> dict[str, Any]:
    """vLLM's error JSON (the nested form of vLLM >= 0.10.1, as OpenAI's API)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


@dataclass
class ParsedRequest:
    """What the engine needs from one HTTP request."""

    prompt_tokens: int
    prefix: tuple[int | None, int]
    max_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
    chat: bool = False
    n: int = 1  # choices to sample (vLLM fans them out as n requests sharing the prompt)


class RequestParser:
    """Validates request bodies for one served model and assigns their shared-prefix groups."""

    def __init__(self, names: tuple[str, ...], max_model_len: int, vocab_size: int, block_size: int) -> None:
        self.names = names  # the served model's names: a request may give any of them
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        ids = itertools.count()
        self._token_prefixes = PrefixIndex(block_size, ids=ids)
        self._text_prefixes = text_index(block_size, ids=ids)

    def parse(self, body: Any, chat: bool) -> list[ParsedRequest]:
        """Validate a request body the way vLLM does; BadRequest otherwise. One ParsedRequest per prompt:
        a completion may carry a batch of them (a list of strings or of token-id lists), which vLLM
        serves as one request each, their choices in order in one response."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        problem = logprobs_problem(body, chat)
        if problem is not None:
            raise BadRequest(problem)
        model = body.get("model")
        # an empty or null name is the served model (vllm/entrypoints/openai/serving_engine.py
        # _is_model_supported)
        if model and model not in self.names:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        if not chat and body.get("suffix") is not None:  # vllm/entrypoints/openai/serving_completion.py
            raise BadRequest("suffix is not currently supported")
        n = body.get("n", 1)
        if n is None:
            n = 1
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BadRequest(f"n must be at least 1, got {n}.")
        if n > max_n():
            raise BadRequest(
                f"n must be at most {max_n()}, got {n}. To increase this limit, set the VLLM_MAX_N_SEQUENCES "
                "environment variable."
            )
        if not chat:
            prompts = [self._parse_prompt(p) for p in _batch(body.get("prompt"))]
            max_tokens = body.get("max_tokens", 16)  # vLLM's completions default, as OpenAI's
            return [self._request(body, False, n, *prompt, max_tokens) for prompt in prompts]
        try:
            text, template = _chat_text(body.get("messages"))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        prefix = self._text_prefixes.match_text(text)
        # vLLM's `max_completion_tokens or max_tokens` (vllm/entrypoints/utils.py get_max_tokens): a null (or
        # 0) max_completion_tokens falls back to max_tokens
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        return [self._request(body, True, n, estimate_text_tokens(text) + template, prefix, max_tokens)]

    def _request(
        self, body: dict[str, Any], chat: bool, n: int, prompt_tokens: int, prefix: tuple[int | None, int],
        max_tokens: Any,
    ) -> ParsedRequest:  # fmt: skip
        """One prompt's request: its length limit and finish, checked as vLLM checks them."""
        room = self.max_model_len - prompt_tokens
        if max_tokens is not None and not isinstance(max_tokens, int):
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
        too_long = context_problem(self.max_model_len, prompt_tokens, max_tokens)
        if too_long is not None:
            raise BadRequest(too_long)
        problem = sampling_problem(body, n, room if max_tokens is None else max_tokens)
        if problem is not None:
            raise BadRequest(problem)
        if max_tokens is None:
            # vLLM's limit is then the context left (vllm/entrypoints/utils.py get_max_tokens); reaching it
            # finishes "length" (vllm/v1/core/sched/utils.py check_stop checks it before EOS)
            # min_tokens holds EOS back (MinTokensLogitsProcessor, vllm/v1/sample/logits_processor/builtin.py)
            answer = room if body.get("ignore_eos") else max(DEFAULT_OUTPUT_TOKENS, min_tokens(body))
            length = min(answer, room)
            reason = "length" if length == room else "stop"
        else:
            length, reason = max_tokens, "length"
        stream = bool(body.get("stream", False))
        include_usage, continuous_usage = _stream_options(body.get("stream_options"), stream)
        problem = engine_problem(body, chat, self.vocab_size)
        if problem is not None:
            raise BadRequest(problem, in_stream=stream)
        return ParsedRequest(
            prompt_tokens=prompt_tokens,
            prefix=prefix,
            max_tokens=length,
            finish_reason=reason,
            stream=stream,
            include_usage=include_usage,
            continuous_usage=continuous_usage,
            chat=chat,
            n=n,
        )

    def _parse_prompt(self, prompt: Any) -> tuple[int, tuple[int | None, int]]:
        """One prompt's token count and prefix group."""
        if isinstance(prompt, str):
            if not prompt:
                raise BadRequest("Prompt cannot be empty")
            return estimate_text_tokens(prompt), self._text_prefixes.match_text(prompt)
        # Only ints (bools are ints) pass; JSON has no other int types. map/set: C speed on long prompts.
        if isinstance(prompt, list) and prompt and set(map(type, prompt)) <= _INT_TYPES:
            low, top = min(prompt), max(prompt)
            if top >= self.vocab_size or low < 0:
                raise BadRequest(f"Token id {low if low < 0 else top} is out of vocabulary")
            return len(prompt), self._token_prefixes.match(prompt)
        raise BadRequest(PROMPT_TYPES)
