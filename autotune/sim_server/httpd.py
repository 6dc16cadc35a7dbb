"""A lean HTTP/1.1 server for sim-server: asyncio protocols and the C `httptools` parser.

A framework (Starlette on anyio, behind uvicorn) costs a task, several wrappers and event wakeups per
request and per streamed chunk. With hundreds of simultaneous requests that kept the event loop busy
for tens of milliseconds at a time, and the server's own latency grew by as much. Here a request is
parsed inside the protocol callback that read it and handed to its handler right after the loop's
reads (see _Dispatcher), and a streamed response is written by whoever has its data (the engine loop,
after each step) straight to the transport.

What it does: keep-alive connections with requests answered one at a time in order (pipelined ones
wait their turn), content-length responses, chunked streamed responses, `Connection: close`, HEAD for
GET routes, `Expect: 100-continue`, flow control (a response whose client reads slowly stops being
written until the transport drains), an idle keep-alive timeout, and a callback when the client goes
away mid-response. Limits (HttpLimits): a request body larger than `max_body_bytes` is refused with
413 as soon as its Content-Length (or the chunks read so far) says so, and a request not read whole
within `read_timeout_s` of its first byte (a slow or half-sent one) gets 408; both answer JSON in
vLLM's error shape and close the connection, whose state is then unknown. What it does not do: TLS,
HTTP/2, upgrades, streamed request bodies. The requests' records and the responses' bytes:
autotune/sim_server/http_messages.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httptools

from autotune.sim_server.http_messages import (
    HttpLimits,
    HttpRequest,
    bad_request,
    chunk,
    json_body,
    refusal,
    response_head,
)

KEEP_ALIVE_S = 5.0  # an idle keep-alive connection is closed after this long (uvicorn's default)
BACKLOG = 2048  # pending connections the kernel queues: a burst of clients must not be refused
DISPATCH_BATCH = 16  # requests handled per loop iteration before the loop reads sockets again

log = logging.getLogger("autotune.sim_server.httpd")


class Exchange(Protocol):
    """A response still in progress on a connection (a stream, or an answer that comes later)."""

    def resume(self) -> None:
        """The transport drained after `HttpConnection.paused`: write what is pending."""

    def lost(self) -> None:
        """The client closed the connection before the response ended."""


Handler = Callable[["HttpConnection", HttpRequest], None]


@dataclass
class _Incoming:
    """The request being parsed."""

    read_at: float
    url: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    body: list[bytes] = field(default_factory=list)
    body_bytes: int = 0


class HttpConnection(asyncio.Protocol):
    """One client connection. The handler answers each request with `respond`, or with `start_stream`
    then `send_chunk`, or later after `hold`."""

    def __init__(
        self,
        handler: Handler,
        live: set[HttpConnection],
        dispatcher: _Dispatcher,
        limits: HttpLimits = HttpLimits(),  # noqa: B008 (frozen)
    ) -> None:
        self._handler = handler
        self._limits = limits
        self._read_timer: asyncio.TimerHandle | None = None
        self._live = live  # every open connection, for shutdown
        self._dispatcher = dispatcher
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.paused = False  # the transport's buffer is full: responses wait for `Exchange.resume`
        self._read_at = 0.0
        self._incoming: _Incoming | None = None
        self._queue: deque[HttpRequest] = deque()
        self._current: HttpRequest | None = None  # the request being answered
        # Headers every response to the current request carries, set by its handler (CORS)
        self.response_fields: dict[str, str] = {}
        self._exchange: Exchange | None = None
        self._dispatching = False
        self._idle_timer: asyncio.TimerHandle | None = None

    # ---- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Register the connection and start its idle timer."""
        self.transport = transport  # type: ignore[assignment]
        self._live.add(self)
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget queued requests and tell a response in progress that nobody reads it any more."""
        self.transport = None
        self._live.discard(self)
        self._cancel_idle_timer()
        self._cancel_read_timer()
        self._queue.clear()
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.lost()

    def data_received(self, data: bytes) -> None:
        """Parse what arrived; complete requests are answered from inside the parser's callbacks."""
        if self.transport is None or self.transport.is_closing():
            return  # refused (413/408) and closing: what else arrives is not read
        self._read_at = time.perf_counter()
        self._cancel_idle_timer()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # upgrades are not offered: the request was answered as a plain one
        except httptools.HttpParserError as exc:
            self._reject_malformed(exc)

    def pause_writing(self) -> None:
        """The transport's buffer passed its high-water mark: stop writing responses."""
        self.paused = True

    def resume_writing(self) -> None:
        """The buffer drained: the response in progress writes what it held back."""
        self.paused = False
        if self._exchange is not None:
            self._exchange.resume()

    # ---- httptools callbacks

    def on_message_begin(self) -> None:
        """A request starts: stamp when its first bytes were read."""
        self._incoming = _Incoming(read_at=self._read_at)
        self._cancel_read_timer()
        self._read_timer = asyncio.get_running_loop().call_later(
            self._limits.read_timeout_s, self._read_timed_out
        )

    def on_url(self, url: bytes) -> None:
        """Part of the request target (it may come in pieces)."""
        self._incoming.url += url  # type: ignore[union-attr]

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header (names are case-insensitive: kept lower-case)."""
        self._incoming.headers[name.decode("latin-1").lower()] = value.decode("latin-1")  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        """Tell a client that waits for it to send the body."""
        headers = self._incoming.headers  # type: ignore[union-attr]
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self._limits.max_body_bytes:
            self._refuse(
                413,
                f"Request body of {int(length)} bytes exceeds the limit of {self._limits.max_body_bytes}.",
            )
            return
        if headers.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        """Part of the request body (a chunked one is refused once it passes the limit)."""
        incoming = self._incoming
        if incoming is None or self.transport is None or self.transport.is_closing():
            return
        incoming.body_bytes += len(body)
        if incoming.body_bytes > self._limits.max_body_bytes:
            self._refuse(413, f"Request body exceeds the limit of {self._limits.max_body_bytes} bytes.")
            return
        incoming.body.append(body)

    def on_message_complete(self) -> None:
        """Queue the request; the dispatcher answers it between the loop's socket reads (see _Dispatcher)."""
        incoming, self._incoming = self._incoming, None
        self._cancel_read_timer()
        if incoming is None or self.transport is None or self.transport.is_closing():
            return  # refused while it was read
        parsed = httptools.parse_url(incoming.url)
        self._queue.append(
            HttpRequest(
                method=self._parser.get_method().decode("latin-1"),
                path=parsed.path.decode("latin-1"),
                headers=incoming.headers,
                body=b"".join(incoming.body),
                read_at=incoming.read_at,
                keep_alive=self._parser.should_keep_alive(),
            )
        )
        self._dispatcher.add(self)

    # ---- responses

    def respond(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """A whole response with a Content-Length body; the next queued request is answered after it."""
        request = self._current
        assert request is not None and self.transport is not None
        fields = {**(headers or {}), **self.response_fields}
        if content_type is not None:
            fields["content-type"] = content_type
        fields["content-length"] = str(len(body))
        head = response_head(status, fields, close=not request.keep_alive)
        self.transport.write(head if request.method == "HEAD" else head + body)
        self._finish()

    def respond_json(self, status: int, content: Any, headers: dict[str, str] | None = None) -> None:
        """A JSON response, compact as Starlette's JSONResponse renders it."""
        self.respond(status, json_body(content), "application/json", headers)

    def start_stream(self, content_type: str, headers: dict[str, str], exchange: Exchange) -> None:
        """A 200 head for a chunked body; `send_chunk` writes the body, `exchange` hears of the client."""
        assert self.transport is not None
        fields = {
            **headers,
            **self.response_fields,
            "content-type": content_type,
            "transfer-encoding": "chunked",
        }
        closing = self._current is not None and not self._current.keep_alive
        self.transport.write(response_head(200, fields, close=closing))
        self._exchange = exchange

    def send_chunk(self, data: bytes, last: bool = False) -> None:
        """One chunk of a streamed body (one transport write); `last` also ends the body and the response."""
        assert self.transport is not None
        self.transport.write(chunk(data, last))
        if last:
            self._finish()

    def hold(self, exchange: Exchange) -> None:
        """The answer comes later (`respond` then), or never; `exchange` hears if the client leaves first."""
        self._exchange = exchange

    def close(self) -> None:
        """Close the connection (what was written is still sent)."""
        if self.transport is not None:
            self.transport.close()

    # ---- internals

    def serve_queued(self) -> None:
        """Answer queued requests in order while each is answered at once (a later answer resumes it)."""
        if self._dispatching:
            return  # a handler answered synchronously: the loop below goes on with the next one
        self._dispatching = True
        try:
            while self._queue and self._current is None and self.transport is not None:
                self._current = self._queue.popleft()
                self._dispatch(self._current)
        finally:
            self._dispatching = False
        if self._current is None and self.transport is not None:
            self._arm_idle_timer()

    def _dispatch(self, request: HttpRequest) -> None:
        """Run the handler; a bug in it answers 500 (or closes a response already under way)."""
        try:
            self._handler(self, request)
        except Exception:
            log.exception("error while handling %s %s", request.method, request.path)
            if self._current is request and self._exchange is None:
                self.respond(500, b"Internal Server Error", "text/plain; charset=utf-8")
            else:
                self.close()

    def _finish(self) -> None:
        """The current response ended: close if the client asked to, else answer the next request."""
        request, self._current = self._current, None
        self._exchange = None
        self.response_fields = {}
        if request is not None and not request.keep_alive:
            self.close()
            return
        self.serve_queued()

    def _reject_malformed(self, exc: Exception) -> None:
        """Bytes that are not HTTP: a plain 400 and the connection closes (its state is unknown)."""
        if self.transport is None:
            return
        if self._current is None:
            self.transport.write(bad_request(exc))
        self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request that cannot be read (413, 408) with vLLM's JSON error, then close."""
        self._cancel_read_timer()
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(refusal(status, message))
        self.transport.close()

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self._incoming is not None:
            self._refuse(408, f"Request not received within {self._limits.read_timeout_s:g} s.")

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(KEEP_ALIVE_S, self._close_if_idle)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _close_if_idle(self) -> None:
        self._idle_timer = None
        if self._current is None and self._incoming is None:
            self.close()


class _Dispatcher:
    """Runs connections' complete requests a few at a time, between the event loop's socket reads.

    A handler run inside the read callback that completed its request would leave every other request
    of a simultaneous burst unread in its socket until the earlier handlers finish: time the client sees
    and the server's own clock does not (its stamp is the read). Deferred, and at most DISPATCH_BATCH
    per loop iteration, a burst is read (and stamped) at once and its handlers follow.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: deque[HttpConnection] = deque()
        self._scheduled = False

    def add(self, connection: HttpConnection) -> None:
        """`connection` has a request to answer."""
        self._waiting.append(connection)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def _run(self) -> None:
        for _ in range(min(DISPATCH_BATCH, len(self._waiting))):
            self._waiting.popleft().serve_queued()
        if self._waiting:
            self._loop.call_soon(self._run)  # after the reads the loop's next poll finds
        else:
            self._scheduled = False


async def start_http_server(
    host: str,
    port: int,
    handler: Handler,
    limits: HttpLimits = HttpLimits(),  # noqa: B008 (frozen)
) -> tuple[asyncio.Server, set[HttpConnection]]:
    """Listen on (host, port); returns the server and the live set of its open connections.

    Raises OSError when the address cannot be bound (in use, not local)."""
    live: set[HttpConnection] = set()
    loop = asyncio.get_running_loop()
    dispatcher = _Dispatcher(loop)
    server = await loop.create_server(
        lambda: HttpConnection(handler, live, dispatcher, limits), host, port, backlog=BACKLOG
    )
    return server, live
