"""The sim-server's service: the simulated engine stepped in real time and the requests in flight.

An asyncio task steps the simulated V1 engine and sleeps each step's simulated duration, so a client
sees the latencies the simulator predicts. Like vLLM's engine busy loop, requests that arrive during
a step join a later one; a request is stamped with the simulated time at which it was sent (mid-step
that is before the running step's end) and enters the engine through its API-server model
(autotune.sim.frontend), exactly as in-process `simulate` does. After each step the touched requests'
listeners (the HTTP responses, autotune.sim_server.sse) write their new tokens.

vllm:request_queue_time_seconds is measured up to the start of the step that produced the first
token, and the prefill and inference times from it (the simulated engine does not report when a
prefill chunk was first scheduled).

With a `time_scale` above 1 (`--time-scale`) the simulated clock runs that many times faster than
the wall clock: a step of d simulated seconds is slept for d / time_scale, a wall-clock interval
maps to time_scale times as much simulated time, and the latency histograms of /metrics are in
simulated seconds. Clients see every latency divided by the scale (tests and calibration runs finish
in seconds while the simulated GPU time is still what it would be); `autotune:sim_time_scale` on
/metrics says so (autotune.sim_server.exposition).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.sim.calibration import DEFAULT_CALIBRATION, Calibration
from autotune.sim_server.auth import ApiKeyCheck
from autotune.sim_server.exposition import ServerMetrics, metrics_registry
from autotune.sim_server.http_messages import MAX_BODY_BYTES, READ_TIMEOUT_S
from autotune.sim_server.parsing import ParsedRequest, RequestParser
from autotune.workloads.spec import Request


@dataclass(frozen=True)
class ServerOptions:
    """How to serve (everything that is not an engine flag)."""

    host: str = "127.0.0.1"
    port: int = 8000
    gpu: str = "H100"
    served_model_names: tuple[str, ...] = ()  # vLLM's --served-model-name (the first is shown)
    startup_delay_s: float = 0.0
    die_after: int | None = None
    hang_after: int | None = None
    debug_timings: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    read_timeout_s: float = READ_TIMEOUT_S
    calibration: Calibration = DEFAULT_CALIBRATION  # the engine model's constants
    time_scale: float = 1.0  # simulated seconds per wall-clock second
    allow_long_max_model_len: bool = False  # VLLM_ALLOW_LONG_MAX_MODEL_LEN: past the context is a warning
    api_keys: ApiKeyCheck = dataclasses.field(default_factory=lambda: ApiKeyCheck(()), repr=False)


def vllm_log(level: str, where: str, message: str) -> None:
    """A vLLM-style log line: `INFO 05-01 12:00:00 [api_server.py:1] message`."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [{where}] {message}", file=sys.stderr, flush=True)


@dataclass
class Pending:
    """One request being served: tokens the engine produced and the response that delivers them."""

    key: int  # the engine's request id
    rid: str
    arrival: float  # perf_counter when the request was handed to the engine
    prompt_tokens: int
    max_tokens: int
    finish_reason: str
    choices: list[Pending] | None = None  # every choice of its request (shared), when n > 1
    read: float = 0.0  # perf_counter when the server read the request's first bytes off the socket
    received: float = 0.0  # perf_counter when its HTTP handler started (the whole request was read)
    sent: float = 0.0  # its send time on the simulated clock: the engine's arrival_time for it
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

    @property
    def further_choice(self) -> bool:
        """A further choice (n > 1) of its prompt, not the first: the usage counts the prompt once."""
        return self.choices is not None and self.choices[0] is not self


class SimService:
    """The engine loop and the request bookkeeping behind the HTTP routes."""

    def __init__(self, engine: Any, options: ServerOptions, model_name: str, vocab_size: int) -> None:
        self.engine = engine
        self.options = options
        self.model_name = model_name
        self.max_model_len = int(engine.config.max_model_len)
        names = options.served_model_names or (model_name,)
        self.parser = RequestParser(names, self.max_model_len, vocab_size, engine.config.block_size)
        self.metrics = ServerMetrics(self.max_model_len)
        self.registry = metrics_registry(
            engine, self.metrics, model_name, engine.config.gpu_memory_utilization, options.time_scale
        )
        self._scale = options.time_scale
        self.pending: dict[int, Pending] = {}
        self.history: list[Pending] = []  # finished requests, kept only with --debug-timings
        self.started = 0
        self.hung = False
        self._ids = itertools.count()
        self._choice_groups = itertools.count()
        self._wake = asyncio.Event()
        self._t0 = time.perf_counter()
        self._step_end = 0.0  # perf_counter at which the running step's tokens appear
        self._committed = -math.inf  # simulated start of the latest step computed
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

    def parse(self, body: Any, chat: bool) -> list[ParsedRequest]:
        """Validate a request body the way vLLM does (one request per prompt of a batch); BadRequest
        otherwise."""
        return self.parser.parse(body, chat)

    def submit(
        self,
        parsed: ParsedRequest,
        rid: str | None = None,
        read_at: float | None = None,
        choice: bool = False,
    ) -> Pending:
        """Hand a request to the engine; it joins the next engine step. `rid`: the client's request id;
        `read_at`: perf_counter when its first bytes were read (default: now). The engine takes it as
        sent then: reading and parsing it here is the API server's work, which the engine's API-server
        model prices, so this process's own speed at it does not add to the simulated latencies.
        `choice`: a further choice (n > 1) of the request submitted just before."""
        self.started += 1
        if self.options.hang_after is not None and self.started >= self.options.hang_after:
            self.hung = True
        key = next(self._ids)
        now = time.perf_counter()
        at = now if read_at is None else min(read_at, now)
        prefix_id, prefix_len = parsed.prefix
        self._sync_clock(at)
        # The simulated clock is anchored to the wall clock: this is when the request was sent on it (mid-step
        # that is before the running step's end). A request read before the engine computed its latest step
        # but handed over only after (the event loop ran the engine first) is sent after that step's start:
        # the step was scheduled without it, as in process (simulate adds what was sent before each step).
        sent = max((at - self._t0) * self._scale, math.nextafter(self._committed, math.inf))
        request = Request(
            request_id=key,
            prompt_len=parsed.prompt_tokens,
            output_len=parsed.max_tokens,
            arrival_time=sent,
            prefix_id=prefix_id,
            prefix_len=min(prefix_len, parsed.prompt_tokens),
        )
        self.engine.add_request(request, chat=parsed.chat, send_time=sent, choice=choice)
        state = Pending(
            key=key,
            rid=rid or uuid.uuid4().hex,
            arrival=now,
            sent=sent,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=parsed.max_tokens,
            finish_reason=parsed.finish_reason,
        )
        self.pending[key] = state
        self._wake.set()
        return state

    def submit_choices(
        self, parsed: ParsedRequest, rid: str | None = None, read_at: float | None = None
    ) -> list[Pending]:
        """Hand a request with `n` choices to the engine: n requests sharing the prompt, as vLLM's
        parallel sampling fans them out (the prefix cache serves the prompt's KV to all but the first)."""
        if parsed.n == 1:
            return [self.submit(parsed, rid, read_at)]
        prefix = parsed.prefix
        if prefix[1] < parsed.prompt_tokens:  # share the whole prompt among the choices
            # negative ids: apart from the parser's prefix groups (0, 1, ...)
            prefix = (-1 - next(self._choice_groups), parsed.prompt_tokens)
        shared = dataclasses.replace(parsed, prefix=prefix)
        first = self.submit(shared, rid, read_at)
        states = [first] + [self.submit(shared, first.rid, read_at, choice=True) for _ in range(parsed.n - 1)]
        for state in states:
            state.choices = states
        return states

    def abort(self, states: Sequence[Pending]) -> None:
        """The client went away: drop its requests (every choice of it) from the engine in one pass, as
        vLLM does, so they stop using the batch. A request the engine already finished (its last tokens
        not delivered yet) ends normally."""
        for state in states:
            state.listener = None  # nothing is delivered to a response nobody reads
        unfinished = [s for s in states if not s.finished]
        if self.engine.abort_requests(s.key for s in unfinished):
            for state in unfinished:
                self.pending.pop(state.key, None)

    def _sync_clock(self, now: float) -> None:
        """While idle, the engine's virtual clock catches up with the wall clock (arrivals are stamped)."""
        if not self.engine.has_unfinished():
            self.engine.now = max(self.engine.now, (now - self._t0) * self._scale)

    # ---- the engine loop

    async def _engine_loop(self) -> None:
        """Step the engine in real time: a step's tokens appear when the wall clock reaches the step's end
        on the simulated clock, which is anchored to the wall clock (t0 + now / time_scale).

        An idle engine's clock jumps to the wall clock's when work arrives (`_sync_clock`), and its next
        step waits for the API server's intake wave to end (`_until_next_start`). A loop that fell
        behind (a busy CPU, a slow write to many streams) runs its next steps without sleeping until it
        is back on time: the server keeps the simulated rates instead of drifting slower by every late
        wake-up.
        """
        while True:
            if not self.engine.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
            if self.options.die_after is not None and self.started >= self.options.die_after:
                # The requests that started are streaming; the process vanishes under them.
                vllm_log(
                    "ERROR", "core.py:700", "EngineCore encountered a fatal error (simulated: --die-after)."
                )
                os._exit(1)
            while self.hung:
                await asyncio.sleep(3600)
            if not await self._until_next_start():
                continue  # its requests were aborted meanwhile
            self._committed = self.engine.next_start()
            output = self.engine.step()
            deadline = self._t0 + self.engine.now / self._scale
            start = deadline - output.duration / self._scale
            self._step_end = deadline
            delay = deadline - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let the HTTP side run even when the engine is behind
            self._deliver(output, start, time.perf_counter())

    async def _until_next_start(self) -> bool:
        """Sleep until the next step's start (the end of the API server's intake wave while the engine is
        idle): the engine core takes in what the server handed over by then, so a request read meanwhile
        joins the wave and that step, as in process. False if nothing is left to run by then."""
        while self.engine.has_unfinished():
            wait = self._t0 + self.engine.next_start() / self._scale - time.perf_counter()
            if wait <= 0:
                return True
            await asyncio.sleep(wait)  # the wave may have grown meanwhile: look again
        return False

    def _deliver(self, output: Any, step_start: float, now: float) -> None:
        """Account a step's tokens and finished requests, then let each touched request's response write."""
        firsts: dict[int, Pending] = {}  # got their first token in this step
        touched: dict[int, Pending] = {}  # the others with tokens or finished
        scale = self._scale  # the histograms are in simulated seconds
        step_tokens = 0  # vLLM's iteration tokens: those generated, plus the prompts of first tokens
        # TTFT and e2e run from the request's arrival to the end of its step, both on the engine's clock
        # (vllm/v1/metrics/stats.py): not from when this process ran its handler, nor to when its event
        # loop woke (wall-clock lags that the time scale would multiply)
        step_end = self.engine.now
        for key, n in output.new_tokens:
            state = self.pending.get(key)
            if state is None:
                continue
            if state.first_token is None:
                state.first_token = now
                state.first_step_start = step_start
                self.metrics.ttft.observe(step_end - state.sent)
                self.metrics.queue.observe(max(step_start - state.arrival, 0.0) * scale)
                firsts[key] = state
                step_tokens += state.prompt_tokens
            else:
                self.metrics.itl.observe((now - state.last_token) * scale)  # type: ignore[operator]
                touched[key] = state
            state.last_token = now
            state.tokens += n
            step_tokens += n
        if firsts or touched:  # vLLM records iteration stats for a step with outputs only
            self.metrics.iteration_tokens.observe(step_tokens)
        for key in output.finished:
            state = self.pending.pop(key, None)
            if state is None:
                continue
            state.finished = True
            state.done_at = now
            self.metrics.e2e.observe(step_end - state.sent)
            self._observe_finished(state)
            if self.options.debug_timings:
                self.history.append(state)
            if key not in firsts:
                touched[key] = state
        # After the bookkeeping, so that a request's tokens and its end go out in one write. First tokens
        # go out first: writing hundreds of streams takes milliseconds, and TTFT is where they show.
        for state in itertools.chain(firsts.values(), touched.values()):
            if state.listener is not None:
                state.listener(state)

    def _observe_finished(self, state: Pending) -> None:
        """vLLM's histograms of a finished request (FinishedRequestStats, vllm/v1/metrics/stats.py), in
        simulated seconds: its phases run from the start of its first token's step (when it was
        scheduled) to its first and last tokens."""
        assert state.first_token is not None and state.first_step_start is not None
        assert state.last_token is not None
        metrics, scale = self.metrics, self._scale
        metrics.success[state.finish_reason] += 1
        decode = (state.last_token - state.first_token) * scale
        metrics.prefill.observe((state.first_token - state.first_step_start) * scale)
        metrics.decode.observe(decode)
        metrics.inference.observe((state.last_token - state.first_step_start) * scale)
        # the first token is the prefill's: the mean is over the later ones (0 with none)
        metrics.request_tpot.observe(decode / (state.tokens - 1) if state.tokens > 1 else 0.0)
        metrics.prompt_tokens.observe(state.prompt_tokens)
        metrics.generation_tokens.observe(state.tokens)
        metrics.params_max_tokens.observe(state.max_tokens)
        # once the request's last choice ended (vllm/v1/engine/parallel_sampling.py)
        choices = state.choices or [state]
        if all(c.finished for c in choices):
            metrics.max_generation_tokens.observe(max(c.tokens for c in choices))
            metrics.params_n.observe(len(choices))

    # ---- responses

    def debug_rows(self) -> list[dict[str, Any]]:
        """Exact per-request server-side timings (perf_counter seconds, comparable across processes)."""
        rows = []
        for s in self.history:
            record = self.engine.record(s.key)
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
                    "engine_ttft": record.ttft,  # virtual: send -> first token
                    "engine_latency": record.latency,  # virtual: send -> last token
                    "engine_sent": record.start_time,  # virtual send time
                    "prompt_tokens": s.prompt_tokens,
                    "completion_tokens": s.tokens,
                }
            )
        return rows
