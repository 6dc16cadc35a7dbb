"""`autotune sim-server`: the simulated engine behind an OpenAI-compatible HTTP server, like `vllm serve`.

The engine runs in real time: an asyncio task steps the simulated V1 engine and sleeps each step's
simulated duration, so a client sees the latencies the simulator predicts. Like vLLM's engine busy
loop, requests that arrive during a step join the next one. Endpoints and formats follow vLLM's
OpenAI server (vllm-facts.md section 4): streaming SSE and plain responses for /v1/completions and
/v1/chat/completions, /health, /v1/models, /version and /metrics with vLLM's metric names.

What the simulation cannot know, and what it does instead:
  - Text prompts have no tokenizer: their length is estimated at ~4 characters per token
    (`autotune.workload.CHARS_PER_TOKEN`), plus a few template tokens per chat message. Token-id
    prompts (completions) have their exact length. Each generated token is the text " tok".
  - The model never emits EOS on its own before `max_tokens`: with `max_tokens` set, the output is
    exactly `max_tokens` long (finish_reason "length") with or without `ignore_eos`. Completions
    default to max_tokens=16 as in vLLM; a chat request (or `"max_tokens": null`) without a limit gets
    a simulated answer of DEFAULT_OUTPUT_TOKENS tokens (or up to max_model_len), finish_reason "stop".
  - Prefix caching needs to know which requests share a prompt prefix: the server groups requests by
    their first block of tokens (or characters) and shares their longest common prefix with the
    group's first request (`PrefixIndex`).
  - vllm:request_queue_time_seconds is measured up to the start of the step that produced the first
    token (the simulated engine does not report when a prefill chunk was first scheduled).

HTTP is served by `autotune.sim.httpd` (asyncio protocols and httptools, no framework): a request is
parsed as it is read and handed to the engine right after the loop's reads, and after each step the
engine loop writes every stream's new tokens, coalesced into one chunk, straight to its connection
(`SseStream`).
A client that reads too slowly pauses its own stream (transport flow control) rather than buffering.

A client that disconnects aborts its request, as in vLLM: the engine frees its KV blocks at once and
counts it in vllm:request_success_total{finished_reason="abort"}.

Fault injection for tests: --startup-delay (slow model loading), --die-after N (the process exits
abruptly once N requests have started), --hang-after N (tokens and /health stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.config import EngineConfig
from autotune.sim.httpd import HttpConnection, HttpRequest, start_http_server
from autotune.workload import CHARS_PER_TOKEN, Request

VLLM_VERSION = "0.11.0+autotune.sim"  # the vLLM version whose behaviour the simulator follows
DEFAULT_OUTPUT_TOKENS = 256  # simulated answer length when a request sets no max_tokens
CHAT_TOKENS_PER_MESSAGE = 5  # role header and end-of-turn tokens of a typical chat template
CHAT_TOKENS_FIXED = 4  # BOS plus the assistant header that starts the answer
TOKEN_TEXT = " tok"
TOKEN_JSON = json.dumps(TOKEN_TEXT)
_INT_TYPES = frozenset((int, bool))
CATCH_UP_S = 0.002  # a late step may start up to this much early to absorb sleep overshoot
PREFIX_GROUPS = 4096  # prefix groups remembered (LRU)

# vLLM's histogram buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

log = logging.getLogger("autotune.sim.server")


# --------------------------------------------------------------------------- options and logging


@dataclass(frozen=True)
class ServerOptions:
    """How to serve (everything that is not an engine flag)."""

    host: str = "127.0.0.1"
    port: int = 8000
    gpu: str = "H100"
    served_model_name: str | None = None
    startup_delay_s: float = 0.0
    die_after: int | None = None
    hang_after: int | None = None
    debug_timings: bool = False


def _log(level: str, where: str, message: str) -> None:
    """A vLLM-style log line: `INFO 05-01 12:00:00 [api_server.py:1] message`."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [{where}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- Prometheus metrics


@dataclass
class Histogram:
    """A Prometheus histogram with fixed buckets (cumulative counts are built when rendered)."""

    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.count += 1
        self.total += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def render(self, name: str, labels: str) -> list[str]:
        """The _sum, _bucket and _count sample lines."""
        lines = [f"{name}_sum{{{labels}}} {self.total!r}"]
        cumulative = 0
        for bound, n in zip((*self.buckets, math.inf), self.counts, strict=True):
            cumulative += n
            le = "+Inf" if bound == math.inf else repr(float(bound))
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(cumulative)!r}')
        lines.append(f"{name}_count{{{labels}}} {float(self.count)!r}")
        return lines


@dataclass
class ServerMetrics:
    """The request-level histograms the API server keeps (engine gauges and counters come from stats)."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    # Finished requests by reason; "abort" is the engine's count (stats.num_aborted).
    success: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0})


_GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches.", "num_running"),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "num_waiting"),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
)
_COUNTERS = (
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
     "prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
     "prefix_cache_hits"),
)  # fmt: skip
_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
)


def render_metrics(engine: Any, metrics: ServerMetrics, model_name: str, gpu_utilization: float) -> str:
    """Prometheus text exposition of vLLM's V1 metrics for this server."""
    labels = f'engine="0",model_name="{model_name}"'
    stats = engine.stats
    lines: list[str] = []
    for name, doc, attr in _GAUGES:
        lines += [
            f"# HELP {name} {doc}",
            f"# TYPE {name} gauge",
            f"{name}{{{labels}}} {float(getattr(stats, attr))!r}",
        ]
    for name, doc, attr in _COUNTERS:
        value = float(getattr(stats, attr))
        lines += [
            f"# HELP {name}_total {doc}",
            f"# TYPE {name}_total counter",
            f"{name}_total{{{labels}}} {value!r}",
        ]
    name = "vllm:request_success_total"
    lines += [f"# HELP {name} Count of successfully processed requests.", f"# TYPE {name} counter"]
    for reason, n in (*metrics.success.items(), ("abort", stats.num_aborted)):
        lines.append(f'{name}{{{labels},finished_reason="{reason}"}} {float(n)!r}')
    for name, doc, attr in _HISTOGRAMS:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
        lines += getattr(metrics, attr).render(name, labels)
    cfg = engine.config
    info = {
        "block_size": cfg.block_size,
        "cache_dtype": cfg.kv_cache_dtype,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "engine": "0",
        "gpu_memory_utilization": gpu_utilization,
        "num_gpu_blocks": engine.memory.num_gpu_blocks,
    }
    info_labels = ",".join(f'{k}="{v}"' for k, v in info.items())
    name = "vllm:cache_config_info"
    lines += [f"# HELP {name} Information of the LLMEngine CacheConfig", f"# TYPE {name} gauge",
              f"{name}{{{info_labels}}} 1.0"]  # fmt: skip
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- prompts


class PrefixIndex:
    """Groups prompts by their first block and finds how much each shares with its group's first prompt.

    The simulated engine models prefix sharing as (prefix_id, prefix_len): requests with the same
    prefix_id share their first prefix_len tokens. A group's first request claims its whole prompt,
    so any later prompt that shares its first block reuses the common part.
    """

    def __init__(self, unit: int, capacity: int = PREFIX_GROUPS) -> None:
        self.unit = unit  # items per block (tokens, or characters for text)
        self.capacity = capacity
        self._groups: OrderedDict[Any, tuple[int, Sequence]] = OrderedDict()
        self._ids = itertools.count()

    def match(self, items: Sequence) -> tuple[int | None, int]:
        """(prefix_id, shared items) for a prompt given as token ids or text."""
        if len(items) < self.unit:
            return None, 0
        key = tuple(items[: self.unit]) if isinstance(items, list) else items[: self.unit]
        group = self._groups.get(key)
        if group is None:
            group = (next(self._ids), items)
            self._groups[key] = group
            if len(self._groups) > self.capacity:
                self._groups.popitem(last=False)
            return group[0], len(items)
        self._groups.move_to_end(key)
        return group[0], _common_prefix(group[1], items)


def _common_prefix(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on equal slices: C-speed comparisons instead of a Python loop
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


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
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(str(content))
    return "".join(parts), CHAT_TOKENS_FIXED + CHAT_TOKENS_PER_MESSAGE * len(messages)


# --------------------------------------------------------------------------- requests in flight


class BadRequest(Exception):
    """A request vLLM would reject with 400 (or `status`)."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_body(message: str, status: int = 400, kind: str = "BadRequestError") -> dict[str, Any]:
    """vLLM's error JSON (the nested form of vLLM >= 0.10.1, as OpenAI's API)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


@dataclass
class Pending:
    """One request being served: tokens the engine produced and the response that delivers them."""

    key: int  # the engine's request id
    rid: str
    arrival: float  # perf_counter when the request was handed to the engine
    prompt_tokens: int
    max_tokens: int
    finish_reason: str
    read: float = 0.0  # perf_counter when the server read the request's first bytes off the socket
    received: float = 0.0  # perf_counter when its HTTP handler started (the whole request was read)
    tokens: int = 0  # produced so far
    delivered: int = 0  # written to the HTTP response
    finished: bool = False
    first_token: float | None = None  # engine-side time of the first token
    first_sent: float | None = None  # when its first token chunk was written to the socket
    first_step_start: float | None = None
    last_token: float | None = None
    done_at: float | None = None
    # Called by the engine loop after a step that gave this request tokens or finished it (once per step).
    listener: Callable[[Pending], None] | None = None


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


# --------------------------------------------------------------------------- the service


class SimService:
    """The engine loop and the request bookkeeping behind the HTTP routes."""

    def __init__(self, engine: Any, options: ServerOptions, model_name: str, vocab_size: int) -> None:
        self.engine = engine
        self.options = options
        self.model_name = model_name
        self.vocab_size = vocab_size
        self.max_model_len = int(engine.config.max_model_len)
        self.metrics = ServerMetrics()
        self.pending: dict[int, Pending] = {}
        self.history: list[Pending] = []  # finished requests, kept only with --debug-timings
        self.started = 0
        self.hung = False
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._token_prefixes = PrefixIndex(engine.config.block_size)
        self._text_prefixes = PrefixIndex(engine.config.block_size * CHARS_PER_TOKEN)
        self._t0 = time.perf_counter()
        self._step_end = 0.0  # perf_counter at which the running step's tokens appear
        self._loop_task: asyncio.Task | None = None

    # ---- lifecycle

    def start(self) -> None:
        """Start the engine loop (call from inside the server's event loop)."""
        self._loop_task = asyncio.get_running_loop().create_task(self._engine_loop())

    async def stop(self) -> None:
        """Stop the engine loop."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    # ---- requests

    def parse(self, body: Any, chat: bool) -> ParsedRequest:
        """Validate a request body the way vLLM does; BadRequest otherwise."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        if body.get("n", 1) != 1:
            raise BadRequest("n > 1 is not supported by the simulated engine")
        temperature = body.get("temperature")
        if isinstance(temperature, (int, float)) and temperature < 0:
            raise BadRequest(f"temperature must be non-negative, got {temperature}.")
        if chat:
            try:
                text, template = _chat_text(body.get("messages"))
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            prompt_tokens = estimate_text_tokens(text) + template
            prefix = self._text_prefixes.match(text)
            prefix = (prefix[0], prefix[1] // CHARS_PER_TOKEN)
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            prompt_tokens, prefix = self._parse_prompt(body.get("prompt"))
            max_tokens = body.get("max_tokens", 16)  # vLLM's completions default, as OpenAI's
        room = self.max_model_len - prompt_tokens
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
        requested = prompt_tokens + (max_tokens or 0)
        if room < 1 or (max_tokens is not None and requested > self.max_model_len):
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{requested} tokens ({prompt_tokens} in the messages, {max_tokens or 0} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        if max_tokens is None:
            length, reason = min(DEFAULT_OUTPUT_TOKENS, room), "stop"
        else:
            length, reason = max_tokens, "length"
        options = body.get("stream_options") or {}
        return ParsedRequest(
            prompt_tokens=prompt_tokens,
            prefix=prefix,
            max_tokens=length,
            finish_reason=reason,
            stream=bool(body.get("stream", False)),
            include_usage=bool(options.get("include_usage", False)),
            continuous_usage=bool(options.get("continuous_usage_stats", False)),
            chat=chat,
        )

    def _parse_prompt(self, prompt: Any) -> tuple[int, tuple[int | None, int]]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if not prompt:
                raise BadRequest("Prompt cannot be empty")
            shared = self._text_prefixes.match(prompt)
            return estimate_text_tokens(prompt), (shared[0], shared[1] // CHARS_PER_TOKEN)
        # Only ints (bools are ints) pass; JSON has no other int types. map/set: C speed on long prompts.
        if isinstance(prompt, list) and prompt and set(map(type, prompt)) <= _INT_TYPES:
            top = max(prompt)
            if top >= self.vocab_size or min(prompt) < 0:
                raise BadRequest(f"Token id {top} is out of vocabulary")
            return len(prompt), self._token_prefixes.match(prompt)
        raise BadRequest("prompt must be a non-empty string or a list of token ids (one prompt per request)")

    def submit(self, parsed: ParsedRequest, rid: str | None = None) -> Pending:
        """Hand a request to the engine; it joins the next engine step. `rid`: the client's request id."""
        self.started += 1
        if self.options.hang_after is not None and self.started >= self.options.hang_after:
            self.hung = True
        key = next(self._ids)
        now = time.perf_counter()
        prefix_id, prefix_len = parsed.prefix
        self._sync_clock(now)
        # Mid-step the virtual clock is at the running step's end; the request was sent before that.
        sent = self.engine.now - max(0.0, self._step_end - now)
        request = Request(
            request_id=key,
            prompt_len=parsed.prompt_tokens,
            output_len=parsed.max_tokens,
            arrival_time=sent,
            prefix_id=prefix_id,
            prefix_len=min(prefix_len, parsed.prompt_tokens),
        )
        self.engine.add_request(request, chat=parsed.chat, send_time=sent)
        state = Pending(
            key=key,
            rid=rid or uuid.uuid4().hex,
            arrival=now,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=parsed.max_tokens,
            finish_reason=parsed.finish_reason,
        )
        self.pending[key] = state
        self._wake.set()
        return state

    def abort(self, state: Pending) -> None:
        """The client went away: drop its request from the engine, as vLLM does, so it stops using the batch.

        A request the engine already finished (its last tokens not delivered yet) ends normally.
        """
        if self.engine.abort_request(state.key):
            self.pending.pop(state.key, None)

    def _sync_clock(self, now: float) -> None:
        """While idle, the engine's virtual clock catches up with the wall clock (arrivals are stamped)."""
        if not self.engine.has_unfinished():
            self.engine.now = max(self.engine.now, now - self._t0)

    # ---- the engine loop

    async def _engine_loop(self) -> None:
        """Step the engine in real time: each step's simulated duration is slept before its tokens appear."""
        deadline = time.perf_counter()
        while True:
            if not self.engine.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
                deadline = time.perf_counter()  # an idle engine starts when work arrives, not earlier
            if self.options.die_after is not None and self.started >= self.options.die_after:
                # The requests that started are streaming; the process vanishes under them.
                _log("ERROR", "core.py:700", "EngineCore encountered a fatal error (simulated: --die-after).")
                os._exit(1)
            while self.hung:
                await asyncio.sleep(3600)
            start = max(deadline, time.perf_counter() - CATCH_UP_S)
            output = self.engine.step()
            deadline = start + output.duration
            self._step_end = deadline
            delay = deadline - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let the HTTP side run even when the engine is behind
            self._deliver(output, start, time.perf_counter())

    def _deliver(self, output: Any, step_start: float, now: float) -> None:
        """Account a step's tokens and finished requests, then let each touched request's response write."""
        firsts: dict[int, Pending] = {}  # got their first token in this step
        touched: dict[int, Pending] = {}  # the others with tokens or finished
        for key, n in output.new_tokens:
            state = self.pending.get(key)
            if state is None:
                continue
            if state.first_token is None:
                state.first_token = now
                state.first_step_start = step_start
                self.metrics.ttft.observe(now - state.arrival)
                self.metrics.queue.observe(max(step_start - state.arrival, 0.0))
                firsts[key] = state
            else:
                self.metrics.itl.observe(now - state.last_token)  # type: ignore[operator]
                touched[key] = state
            state.last_token = now
            state.tokens += n
        for key in output.finished:
            state = self.pending.pop(key, None)
            if state is None:
                continue
            state.finished = True
            state.done_at = now
            self.metrics.e2e.observe(now - state.arrival)
            self.metrics.success[state.finish_reason] += 1
            if self.options.debug_timings:
                self.history.append(state)
            if key not in firsts:
                touched[key] = state
        # After the bookkeeping, so that a request's tokens and its end go out in one write. First tokens
        # go out first: writing hundreds of streams takes milliseconds, and TTFT is where they show.
        for state in itertools.chain(firsts.values(), touched.values()):
            if state.listener is not None:
                state.listener(state)

    # ---- responses

    def debug_rows(self) -> list[dict[str, Any]]:
        """Exact per-request server-side timings (perf_counter seconds, comparable across processes)."""
        rows = []
        for s in self.history:
            rows.append(
                {
                    "id": s.rid,
                    "read": s.read,
                    "received": s.received,
                    "arrival": s.arrival,
                    "first_token": s.first_token,
                    "first_sent": s.first_sent,
                    "done": s.done_at,
                    "ttft": (s.first_token or s.arrival) - s.arrival,
                    "ttft_sent": (s.first_sent or s.arrival) - s.arrival,
                    "engine_ttft": self.engine.record(s.key).ttft,  # virtual: send -> first token
                    "prompt_tokens": s.prompt_tokens,
                    "completion_tokens": s.tokens,
                }
            )
        return rows


# --------------------------------------------------------------------------- SSE formatting


class ChunkWriter:
    """Pre-rendered SSE chunks for one response (JSON built once, token chunks by concatenation)."""

    def __init__(self, model: str, chat: bool, state: Pending) -> None:
        self.model = model
        self.chat = chat
        self.state = state
        self.created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.id = ("chatcmpl-" if chat else "cmpl-") + state.rid
        self.head = json.dumps(
            {"id": self.id, "object": kind, "created": self.created, "model": model}, separators=(",", ":")
        )[:-1]
        text_key = '"delta":{"content":' if chat else '"text":'
        close = "}" if chat else ""
        self._token = f'data: {self.head},"choices":[{{"index":0,{text_key}{TOKEN_JSON}{close}'
        self.tail_open = ',"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}\n\n'

    def role_chunk(self) -> str:
        """The first chat chunk: the assistant role with empty content, as vLLM sends it."""
        return (
            f'data: {self.head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
            f'"logprobs":null,"finish_reason":null}}]}}\n\n'
        )

    def tokens(self, n: int, last: bool, continuous_usage: bool = False) -> str:
        """n token chunks; the last one carries the finish reason when `last`.

        With `continuous_usage` every chunk carries the usage so far (stream_options.continuous_usage_stats).
        """
        if continuous_usage:
            return "".join(self._usage_token(i, last and i == n) for i in range(1, n + 1))
        chunk = self._token + self.tail_open
        if not last:
            return chunk * n
        final = (
            f'{self._token},"logprobs":null,"finish_reason":"{self.state.finish_reason}",'
            '"stop_reason":null}],"usage":null}\n\n'
        )
        return chunk * (n - 1) + final

    def _usage_token(self, i: int, last: bool) -> str:
        """One token chunk with the usage after it (the i-th of the tokens not yet delivered)."""
        p, c = self.state.prompt_tokens, self.state.delivered + i
        usage = f'{{"prompt_tokens":{p},"total_tokens":{p + c},"completion_tokens":{c}}}'
        reason = f'"{self.state.finish_reason}"' if last else "null"
        return (
            f'{self._token},"logprobs":null,"finish_reason":{reason},"stop_reason":null}}],'
            f'"usage":{usage}}}\n\n'
        )

    def usage_chunk(self) -> str:
        """The `include_usage` chunk: no choices, the token counts."""
        usage = json.dumps(self.usage(), separators=(",", ":"))
        return f'data: {self.head},"choices":[],"usage":{usage}}}\n\n'

    def usage(self) -> dict[str, int]:
        """OpenAI usage block."""
        p, c = self.state.prompt_tokens, self.state.tokens
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}


class SseStream:
    """A streaming response: after each engine step the engine loop writes its new token chunks (coalesced
    into one chunked-body write) straight to the connection, and usage and [DONE] once it finishes."""

    def __init__(
        self,
        service: SimService,
        conn: HttpConnection,
        writer: ChunkWriter,
        include_usage: bool,
        continuous_usage: bool = False,
    ) -> None:
        self.service = service
        self.conn = conn
        self.writer = writer
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self._role_pending = writer.chat

    def on_tokens(self, state: Pending) -> None:
        """Write the tokens not written yet, then the end if the request finished (Pending.listener)."""
        if self.conn.paused:
            return  # a slow reader: `resume` writes them, together with those that come meanwhile
        ready = state.tokens - state.delivered
        parts: list[str] = []
        if ready:
            if self._role_pending:
                parts.append(self.writer.role_chunk())
                self._role_pending = False
            parts.append(self.writer.tokens(ready, state.finished, self.continuous_usage))
            state.delivered = state.tokens
        if state.finished:
            state.listener = None  # no cycle left (state -> stream -> writer -> state) for the GC to find
            if self.include_usage:
                parts.append(self.writer.usage_chunk())
            parts.append("data: [DONE]\n\n")
        if not parts:
            return
        if ready and state.first_sent is None:
            state.first_sent = time.perf_counter()  # just before the write: asyncio sends at once if it can
        self.conn.send_chunk("".join(parts).encode(), last=state.finished)

    def resume(self) -> None:
        """The client caught up: write what was held back."""
        self.on_tokens(self.writer.state)

    def lost(self) -> None:
        """The client disconnected mid-stream: abort the request, as vLLM does."""
        _abandon(self.service, self.writer.state)


class PlainAnswer:
    """A non-streaming response: its JSON body is written when the engine finishes the request."""

    def __init__(
        self, service: SimService, conn: HttpConnection, writer: ChunkWriter, headers: dict[str, str]
    ):
        self.service = service
        self.conn = conn
        self.writer = writer
        self.headers = headers

    def on_tokens(self, state: Pending) -> None:
        """Answer once the request finished (Pending.listener)."""
        if state.finished:
            state.listener = None
            state.delivered = state.tokens
            self.conn.respond_json(200, full_response(self.writer), self.headers)

    def resume(self) -> None:
        """Nothing is held back: the body is written whole."""

    def lost(self) -> None:
        """The client gave up waiting: abort the request (vLLM's 499, which nobody reads)."""
        _abandon(self.service, self.writer.state)


class NeverAnswered:
    """The answer of a hung engine's /health: none, until the client gives up."""

    def resume(self) -> None:
        """Nothing to write."""

    def lost(self) -> None:
        """Nothing to clean up."""


def _abandon(service: SimService, state: Pending) -> None:
    """Stop delivering to a response whose client left, and abort its request unless it finished."""
    state.listener = None
    if not state.finished:
        service.abort(state)


def full_response(writer: ChunkWriter) -> dict[str, Any]:
    """The non-streaming response body."""
    text = TOKEN_TEXT * writer.state.tokens
    reason = writer.state.finish_reason
    if writer.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                  "logprobs": None, "finish_reason": reason, "stop_reason": None}  # fmt: skip
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                  "prompt_logprobs": None}  # fmt: skip
        kind = "text_completion"
    return {"id": writer.id, "object": kind, "created": writer.created, "model": writer.model,
            "choices": [choice], "usage": writer.usage()}  # fmt: skip


# --------------------------------------------------------------------------- the routes

TEXT = "text/plain; charset=utf-8"
SSE = "text/event-stream; charset=utf-8"
METRICS = "text/plain; version=0.0.4; charset=utf-8"
Endpoint = Callable[[HttpConnection, HttpRequest], None]


class SimRoutes:
    """vLLM's routes. Each request is answered (or handed to the engine) as soon as httpd dispatches it."""

    def __init__(self, service: SimService) -> None:
        self.service = service
        gets: dict[str, Endpoint] = {
            "/health": self.health,
            "/v1/models": self.models,
            "/version": self.version,
            "/metrics": self.metrics,
        }
        if service.options.debug_timings:
            gets["/debug/requests"] = self.debug_requests
        self._routes: dict[str, tuple[tuple[str, ...], Endpoint]] = {
            path: (("GET", "HEAD"), endpoint) for path, endpoint in gets.items()
        }
        self._routes["/v1/completions"] = (("POST",), self.completions)
        self._routes["/v1/chat/completions"] = (("POST",), self.chat_completions)

    def handle(self, conn: HttpConnection, request: HttpRequest) -> None:
        """Route one request: 404 for an unknown path, 405 for a method the path does not take."""
        route = self._routes.get(request.path)
        if route is None:
            conn.respond_json(404, {"detail": "Not Found"})  # FastAPI's answer, as vLLM's server gives
            return
        methods, endpoint = route
        if request.method not in methods:
            conn.respond_json(405, {"detail": "Method Not Allowed"}, {"allow": ", ".join(methods)})
            return
        endpoint(conn, request)

    def completions(self, conn: HttpConnection, request: HttpRequest) -> None:
        """POST /v1/completions."""
        self._completion(conn, request, chat=False)

    def chat_completions(self, conn: HttpConnection, request: HttpRequest) -> None:
        """POST /v1/chat/completions."""
        self._completion(conn, request, chat=True)

    def _completion(self, conn: HttpConnection, request: HttpRequest, chat: bool) -> None:
        """Validate, submit to the engine, and attach the response the engine loop will write to."""
        received = time.perf_counter()
        service = self.service
        try:
            body = json.loads(request.body)
        except ValueError as exc:
            conn.respond_json(400, error_body(f"Invalid JSON body: {exc}"))
            return
        except RecursionError:
            conn.respond_json(400, error_body("Invalid JSON body: nested too deeply"))
            return
        try:
            parsed = service.parse(body, chat)
        except BadRequest as exc:
            conn.respond_json(exc.status, error_body(str(exc), exc.status, exc.kind))
            return
        state = service.submit(parsed, request.headers.get("x-request-id"))
        state.received = received
        state.read = request.read_at
        writer = ChunkWriter(service.model_name, chat, state)
        headers = {"x-request-id": state.rid}
        if parsed.stream:
            stream = SseStream(service, conn, writer, parsed.include_usage, parsed.continuous_usage)
            conn.start_stream(SSE, headers, stream)
            state.listener = stream.on_tokens
        else:
            answer = PlainAnswer(service, conn, writer, headers)
            conn.hold(answer)
            state.listener = answer.on_tokens

    def health(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /health: 200, or no answer at all while the engine is hung (as with a stuck vLLM)."""
        if self.service.hung:
            conn.hold(NeverAnswered())
            return
        conn.respond(200)

    def models(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /v1/models: the one served model."""
        service = self.service
        card = {
            "id": service.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": service.engine.config.model,
            "parent": None,
            "max_model_len": service.max_model_len,
            "permission": [],
        }
        conn.respond_json(200, {"object": "list", "data": [card]})

    def version(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /version."""
        conn.respond_json(200, {"version": VLLM_VERSION})

    def metrics(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /metrics: Prometheus text with vLLM's metric names."""
        service = self.service
        text = render_metrics(service.engine, service.metrics, service.model_name,
                              service.engine.config.gpu_memory_utilization)  # fmt: skip
        conn.respond(200, text.encode(), METRICS)

    def debug_requests(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /debug/requests (--debug-timings): exact server-side timings of finished requests."""
        conn.respond_json(200, {"requests": self.service.debug_rows()})


# --------------------------------------------------------------------------- serve


def serve(config: EngineConfig, options: ServerOptions) -> int:
    """Start the engine (exit 1 with vLLM's message if it refuses) and serve until interrupted."""
    from autotune.errors import EngineStartupError
    from autotune.sim.engine import SimEngine
    from autotune.sim.models import get_model

    model_name = options.served_model_name or config.model
    _log("INFO", "api_server.py:1885", f"vLLM API server version {VLLM_VERSION}")
    _log(
        "INFO",
        "utils.py:326",
        f"non-default args: {config.params()} model={config.model!r} gpu={options.gpu!r}",
    )
    if options.startup_delay_s > 0:
        time.sleep(options.startup_delay_s)  # loading weights
    try:
        engine = SimEngine(config, options.gpu)
    except EngineStartupError as exc:
        _log("ERROR", "core.py:718", "EngineCore failed to start.")
        message = str(exc)
        print(
            message if message.startswith("torch.") else f"ValueError: {message}", file=sys.stderr, flush=True
        )
        return 1
    resolved = engine.config
    memory = engine.memory
    tokens = memory.num_gpu_blocks * resolved.block_size
    _log(
        "INFO", "gpu_worker.py:298", f"Available KV cache memory: {memory.kv_available_bytes / 2**30:.2f} GiB"
    )
    _log("INFO", "kv_cache_utils.py:1087", f"GPU KV cache size: {tokens:,} tokens")
    _log("INFO", "kv_cache_utils.py:1091",
         f"Maximum concurrency for {resolved.max_model_len:,} tokens per request: "
         f"{tokens / resolved.max_model_len:.2f}x")  # fmt: skip
    _log("INFO", "core.py:200", f"# GPU blocks: {memory.num_gpu_blocks}")
    _log("INFO", "core.py:210",
         f"max_num_seqs={resolved.max_num_seqs} max_num_batched_tokens={resolved.max_num_batched_tokens} "
         f"enable_chunked_prefill={resolved.enable_chunked_prefill} "
         f"enable_prefix_caching={resolved.enable_prefix_caching}")  # fmt: skip
    service = SimService(engine, options, model_name, get_model(config.model).vocab_size)
    _log("INFO", "api_server.py:1971", f"Starting vLLM API server 0 on http://{options.host}:{options.port}")
    # As vLLM does after loading: objects made so far live for good, and a full collection that walks
    # them all stalls the event loop for tens of milliseconds (every request then waits that long).
    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(_serve_http(service, options))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        return 0


async def _serve_http(service: SimService, options: ServerOptions) -> int:
    """Listen, run the engine loop and serve until SIGTERM or SIGINT; 1 if the address cannot be bound."""
    try:
        server, live = await start_http_server(options.host, options.port, SimRoutes(service).handle)
    except OSError as exc:
        _server_log("ERROR", str(exc))  # "... address already in use": backends classify it
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service.start()
    # The lines uvicorn prints under vLLM, so logs read the same.
    _server_log("INFO", f"Started server process [{os.getpid()}]")
    _server_log("INFO", "Waiting for application startup.")
    _server_log("INFO", "Application startup complete.")
    await stop.wait()
    _server_log("INFO", "Shutting down")
    server.close()
    for conn in list(live):  # open streams end at once: a hung one must not hold up the exit
        conn.close()
    await service.stop()
    _server_log("INFO", f"Finished server process [{os.getpid()}]")
    return 0


def _server_log(level: str, message: str) -> None:
    """A line in uvicorn's format (`INFO:     message`), as vLLM's API server prints them."""
    print(f"{level + ':':<9} {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- test/benchmark helper


@dataclass
class SimServerProcess:
    """A sim-server subprocess started by `start_sim_server`."""

    process: subprocess.Popen
    port: int
    log_path: Path
    base_url: str

    def log(self) -> str:
        """Everything the server wrote so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def start_sim_server(
    args: Sequence[str],
    *,
    gpu: str = "H100",
    log_dir: Path | None = None,
    ready_timeout_s: float = 30.0,
    wait_ready: bool = True,
    cpu: int | None = None,
) -> Iterator[SimServerProcess]:
    """Run `autotune sim-server ARGS --port <free> --gpu GPU` as a real subprocess.

    It runs `python -m autotune.commands.sim_server`, the same command without importing every other
    CLI command (faster start).

    Waits for /health (unless `wait_ready` is False, e.g. for a config that must fail), yields the
    process, and always terminates it. `cpu` pins the server to one CPU core (benchmarks).
    Raises RuntimeError with the log tail when the server exits or never becomes ready.
    """
    import tempfile

    import httpx

    port = free_port()
    tmp = None
    if log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sim-server-")
        log_dir = Path(tmp.name)
    log_path = Path(log_dir) / f"sim-server-{port}.log"
    cmd = [sys.executable, "-m", "autotune.commands.sim_server", *args, "--port", str(port), "--gpu", gpu]
    preexec = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec
        )
    handle = SimServerProcess(process, port, log_path, f"http://127.0.0.1:{port}")
    try:
        if wait_ready:
            _wait_healthy(handle, ready_timeout_s, httpx)
        yield handle
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if tmp is not None:
            tmp.cleanup()


def _wait_healthy(handle: SimServerProcess, timeout_s: float, httpx: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise RuntimeError(f"sim-server exited with {handle.process.returncode}:\n{handle.log()[-2000:]}")
        try:
            if httpx.get(handle.base_url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"sim-server not ready after {timeout_s:g} s:\n{handle.log()[-2000:]}")
