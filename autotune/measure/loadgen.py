"""The load generator: replay a workload against an OpenAI-compatible server and time every request.

It does what `vllm bench serve` does (vllm/benchmarks/lib/endpoint_request_func.py, serve.py), with
asyncio and httpx requests/responses over `autotune.measure.http_transport` (a lean HTTP/1.1 transport: the
client must never be the bottleneck, see benchmarks/loadgen_overhead.py) instead of aiohttp:
  - requests are sent at their `arrival_time` after the start of the run; with `max_concurrency`,
    a semaphore caps those in flight and a request's clock starts once it holds the semaphore;
  - prompts are token ids (exact lengths, no tokenizer) unless the request carries text;
    `max_tokens` + `ignore_eos` make the output length exact; `stream_options.include_usage` asks
    for the usage chunk that gives the output token count;
  - TTFT is taken at the first SSE chunk that carries choices, each later such chunk adds one ITL
    gap, E2EL ends at the last such chunk; the usage-only chunk does not move the clock; a chunk's
    time is that of the socket read that completed it (vllm bench takes it when its task gets to the
    chunk, which adds the client's own event-loop delay at high concurrency);
  - a request with an HTTP error, a timeout or no token chunk is a failed record (never dropped);
    a given API key goes with every request as `Authorization: Bearer KEY` (vllm bench serve sends
    OPENAI_API_KEY's), and a refusal's error (401, 403) says what to set;
  - requests and connections are prepared before the clock starts, and no cyclic garbage collection
    runs while requests are timed.
With a guard (`SloGuard`), the run stops as soon as an SLO can no longer be met: in-flight requests are
cancelled, the reason is returned, and the records finished so far are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx

from autotune.core.api_keys import REFUSED_STATUSES, auth_headers, refusal_hint
from autotune.measure.early_abort import InFlight, LoadGuard
from autotune.measure.http_transport import BODY_STREAM, StreamingTransport
from autotune.measure.metrics import RequestRecord
from autotune.workloads.spec import Request, prompt_token_ids

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PREOPEN_MAX = 512  # connections opened before a run starts; more are opened when needed
GUARD_INTERVAL_S = 0.05  # how often in-flight requests are checked against the SLOs
_TOKEN_MARK = b'"choices":[{'
NO_TOKEN_ERROR = "Never received a valid chunk to calculate TTFT. This response will be marked as failed!"


@dataclass(repr=False)
class LoadResult:
    """What a load run produced: one record per finished request (in finishing order)."""

    records: list[RequestRecord]
    duration: float  # seconds from the start of the run to its end (or to the abort)
    aborted: str | None = None  # why the run stopped early (an SLO lost for certain), else None
    cancelled: int = 0  # requests in flight when the run was aborted (not in `records`)
    not_sent: int = 0  # requests never sent because the run was aborted
    request_ids: list[int] = field(default_factory=list)  # Request.request_id of each record
    t0: float = (
        0.0  # time.perf_counter() at the start of the run (CLOCK_MONOTONIC: comparable across processes)
    )

    def __repr__(self) -> str:
        # Short on purpose: asyncio.run (3.11) formats its main task, result included, when it restores the
        # SIGINT handler, and the dataclass repr of thousands of records with their ITL lists took seconds.
        return (
            f"LoadResult({len(self.records)} records, duration={self.duration:.3f}, "
            f"aborted={self.aborted!r}, cancelled={self.cancelled}, not_sent={self.not_sent})"
        )


@dataclass
class _Stream:
    """The client's live view of one request in flight (for the guard)."""

    start: float
    expected_tokens: int
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0

    def view(self) -> InFlight:
        return InFlight(self.start, self.first_token, self.last_token, self.tokens, self.expected_tokens)


@dataclass
class _Run:
    """State shared by the request tasks of one run."""

    transport: StreamingTransport
    timeout_s: float
    t0: float
    guard: LoadGuard | None
    measure_from: float = 0.0  # requests sent earlier are a warm-up: the guard counts them toward no SLO
    key_sent: bool = False  # whether requests carry an API key (what a refusal's error then says)
    records: list[RequestRecord] = field(default_factory=list)
    request_ids: list[int] = field(default_factory=list)
    in_flight: dict[int, _Stream] = field(default_factory=dict)
    tasks: list[asyncio.Task] = field(default_factory=list)
    aborted: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def finish(self, request_id: int, record: RequestRecord) -> None:
        self.records.append(record)
        self.request_ids.append(request_id)
        if self.guard is None or self.aborted is not None:
            return
        if record.start_time >= self.measure_from:
            self.guard.add(record)
        else:
            self.guard.warmup(record)
        self.check()

    def check(self) -> None:
        if self.guard is None or self.aborted is not None:
            return
        now = time.perf_counter()
        measured_from = self.t0 + self.measure_from
        # built only if the guard reads them: one checked at every finish would cost O(n^2) in a burst
        views = (s.view() for s in self.in_flight.values() if s.start >= measured_from)
        reason = self.guard.check(views, now)
        if reason:
            self.aborted = reason
            self.done.set()


def build_payload(request: Request, model: str, chat: bool, vocab_size: int, salt: int = 0) -> bytes:
    """The JSON body for one request: exact output length, streaming, usage in the last chunk.

    `salt` varies the token ids of token-id prompts (see `prompt_token_ids`); text prompts are sent as is.
    """
    prompt: str | list[int] = (
        request.prompt if request.prompt is not None else prompt_token_ids(request, vocab_size, salt)
    )
    body: dict = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0.0,
    }
    if chat:
        # Chat messages carry text only: each token id becomes 4 characters (" 123"), so the prompt keeps
        # its shared prefixes and a server that estimates ~4 characters per token sees its length.
        text = prompt if isinstance(prompt, str) else "".join(f" {t % 1000:03d}" for t in prompt)
        body["messages"] = [{"role": "user", "content": text}]
        body["max_completion_tokens"] = request.output_len
    else:
        body["prompt"] = prompt
        body["max_tokens"] = request.output_len
    return json.dumps(body, separators=(",", ":")).encode()


def _http_request(
    url: str, request: Request, body: bytes, timeout_s: float, api_key: str | None
) -> httpx.Request:
    """The httpx request for one workload request, built before the clock starts."""
    headers = {
        "Content-Type": "application/json",
        "Accept-Encoding": "identity",  # SSE bytes exactly as the server wrote them
        "x-request-id": str(request.request_id),
        **auth_headers(api_key),
    }
    # Only connecting has its own timeout: a request's whole life is bounded by `timeout_s` anyway.
    return httpx.Request(
        "POST", url, content=body, headers=headers, extensions={"timeout": {"connect": timeout_s}}
    )


async def _stream_request(run: _Run, rid: int, request: Request, http_request: httpx.Request) -> None:
    """Send one request and record it exactly as vllm bench serve's request functions do.

    The prepared request goes straight to the transport: httpx.AsyncClient's per-request work (URL and
    header merging, cookies, auth and redirect flows) cost more than the rest of a request's handling,
    and it runs in bursts when many requests start at once, delaying the reads of every other stream.
    The body goes to `_EventClock` as each socket read brings it (BodyStream.consume), without a task
    switch per chunk.
    """
    stream = _Stream(start=time.perf_counter(), expected_tokens=request.output_len)
    run.in_flight[rid] = stream
    record = RequestRecord(prompt_len=request.prompt_len, output_len=0, start_time=stream.start - run.t0)
    events = _EventClock(stream, record)
    try:
        async with asyncio.timeout(run.timeout_s):
            response = await run.transport.handle_async_request(http_request)
            try:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    raise _HttpError(_status_error(response.status_code, text, run.key_sent))
                await response.extensions[BODY_STREAM].consume(events.feed)
            finally:
                await response.aclose()  # keeps the connection if the body was read to its end
        if stream.first_token is None:
            raise _HttpError(NO_TOKEN_ERROR)
        record.itl = events.itl
        record.latency = stream.last_token - stream.start  # type: ignore[operator]
        record.output_len = events.usage_tokens if events.usage_tokens is not None else stream.tokens
        if events.usage_prompt is not None:  # the server's count: a text prompt's length is our estimate
            record.prompt_len = events.usage_prompt
    except asyncio.CancelledError:
        run.in_flight.pop(rid, None)
        raise
    except TimeoutError:
        _fail(record, f"timeout: no complete response after {run.timeout_s:g} s")
    except (_HttpError, httpx.HTTPError, OSError, ValueError) as exc:
        _fail(record, str(exc) or type(exc).__name__)
    run.in_flight.pop(rid, None)
    run.finish(request.request_id, record)


class _EventClock:
    """Times the SSE events of one response as vllm bench serve does, fed body pieces as they arrive.

    A piece's time is that of the socket read that brought it (vllm bench takes it when its task gets
    to the chunk, which adds the client's own event-loop delay at high concurrency).
    """

    def __init__(self, stream: _Stream, record: RequestRecord) -> None:
        self.stream = stream
        self.record = record
        self.itl: list[float] = []
        self.usage_tokens: int | None = None
        self.usage_prompt: int | None = None
        self.buffer = b""

    def feed(self, now: float, raw: bytes) -> None:
        """Take one body piece read at `now` (perf_counter)."""
        stream = self.stream
        # A read usually holds whole events: only a split event needs the bytes joined.
        *events, self.buffer = (self.buffer + raw if self.buffer else raw).split(b"\n\n")
        for event in events:
            data = event.strip().removeprefix(b"data: ")
            if not data or data == b"[DONE]":
                continue
            # Token chunks (non-empty choices) need no parsing: vLLM's compact JSON says so.
            if _TOKEN_MARK in data or bool((chunk := json.loads(data)).get("choices")):
                if stream.first_token is None:
                    stream.first_token = now
                    self.record.ttft = now - stream.start
                else:
                    self.itl.append(now - stream.last_token)  # type: ignore[operator]
                stream.last_token = now
                stream.tokens += 1
            elif usage := chunk.get("usage"):  # type: ignore[possibly-undefined]
                self.usage_tokens = usage.get("completion_tokens")
                self.usage_prompt = usage.get("prompt_tokens")


class _HttpError(Exception):
    """The server answered, but not with a usable stream."""


def _status_error(status: int, body: str, key_sent: bool) -> str:
    """A failed request's error: the status and the server's words, and for a refusal (401/403) what
    to do about it, so that every message built from it (a trial's, a warm-up's) names the cause."""
    error = f"HTTP {status}: {body[:500]}"
    return f"{error} ({refusal_hint(key_sent)})" if status in REFUSED_STATUSES else error


def _fail(record: RequestRecord, error: str) -> None:
    record.success = False
    record.error = error
    record.itl = []
    record.output_len = 0


async def _guard_loop(run: _Run) -> None:
    """Check in-flight requests periodically: a request stuck without a first token counts too."""
    while not run.done.is_set():
        await asyncio.sleep(GUARD_INTERVAL_S)
        run.check()


async def _dispatch(
    run: _Run, requests: Sequence[Request], http_requests: list[httpx.Request], limit: int | None
) -> None:
    """Start each request at its arrival time (behind the concurrency cap); wait for all of them."""
    semaphore = asyncio.Semaphore(limit) if limit else None

    async def limited(rid: int) -> None:
        if semaphore is None:
            await _stream_request(run, rid, requests[rid], http_requests[rid])
            return
        async with semaphore:
            await _stream_request(run, rid, requests[rid], http_requests[rid])

    try:
        for rid, request in enumerate(requests):
            delay = run.t0 + request.arrival_time - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            run.tasks.append(asyncio.create_task(limited(rid)))
        await asyncio.gather(*run.tasks)
    finally:
        run.done.set()


async def run_load(
    base_url: str,
    model: str,
    requests: Sequence[Request],
    *,
    max_concurrency: int | None = None,
    endpoint: str = COMPLETIONS,
    request_timeout_s: float = 600.0,
    vocab_size: int = 32000,
    guard: LoadGuard | None = None,
    salt: int = 0,
    measure_from: float = 0.0,
    api_key: str | None = None,
) -> LoadResult:
    """Replay `requests` against `base_url` (e.g. "http://127.0.0.1:8000") and time every request.

    `endpoint` is "/v1/completions" or "/v1/chat/completions"; `vocab_size` bounds the token ids of
    token-id prompts; a different `salt` per run keeps a server's prefix cache from serving one run's
    prompts to the next; `api_key` goes with every request as `Authorization: Bearer` (see
    autotune.core.api_keys). Requests are replayed in `arrival_time` order. Never raises for a failed
    request: its record has success=False and the error text. The `guard` counts only the requests
    sent from `measure_from` (s) on (`add`): earlier ones are a warm-up that no statistic includes
    (`warmup`: a failed one can still tell that the server is gone).
    """
    ordered = sorted(requests, key=lambda r: r.arrival_time)
    chat = endpoint.rstrip("/").endswith("chat/completions")
    url = base_url.rstrip("/") + endpoint
    # Requests are built before the clock starts so the hot path only sends and parses.
    http_requests = [
        _http_request(url, r, build_payload(r, model, chat, vocab_size, salt), request_timeout_s, api_key)
        for r in ordered
    ]
    transport = StreamingTransport()
    try:
        # Connections for the requests that will be in flight at once are opened before the clock starts.
        in_flight = min(max_concurrency or len(ordered), len(ordered), PREOPEN_MAX)
        await transport.open_connections(url, in_flight, timeout=request_timeout_s)
        with _gc_paused():
            run = _Run(transport, request_timeout_s, time.perf_counter(), guard, measure_from, bool(api_key))
            dispatcher = asyncio.create_task(_dispatch(run, ordered, http_requests, max_concurrency))
            watcher = asyncio.create_task(_guard_loop(run)) if guard is not None else None
            await run.done.wait()
            duration = time.perf_counter() - run.t0
            cancelled = 0
            if run.aborted is not None:
                cancelled = len(run.in_flight)
                for task in (dispatcher, *run.tasks):
                    task.cancel()
            await asyncio.gather(dispatcher, *run.tasks, return_exceptions=True)
            if watcher is not None:
                watcher.cancel()
    finally:
        await transport.aclose()
    not_sent = len(ordered) - len(run.records) - cancelled
    return LoadResult(run.records, duration, run.aborted, cancelled, not_sent, run.request_ids, run.t0)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while requests are timed (the caller's setting comes back after).

    A full collection walks every live object: with thousands of records and prepared requests it
    paused the event loop for ~15 ms, which landed in the TTFT of every stream being read at that
    moment (the p99). A run's cyclic garbage is small and is collected once the run ends.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_load_sync(base_url: str, model: str, requests: Sequence[Request], **kwargs) -> LoadResult:
    """`run_load` from synchronous code (starts and closes its own event loop)."""
    return asyncio.run(run_load(base_url, model, requests, **kwargs))
