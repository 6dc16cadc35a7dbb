"""A lean HTTP/1.1 transport for httpx: asyncio protocols and the C `httptools` parser.

httpx's default transport (httpcore + h11 on anyio) parses every chunk of a chunked body in pure
Python behind several layers of wrappers, and yields to the event loop a few times before a request
is even written. At hundreds of concurrent token streams that made the load generator's event loop
the bottleneck: token chunks were read late and new requests were sent late. This transport keeps
httpx as the client API but does per-chunk work in C (llhttp via httptools) and writes a request in
the same loop step that asks for it.

What it does: http:// and https://, keep-alive connections reused from a per-origin idle list (O(1)
per request, no connection cap: the caller bounds concurrency), content-length, chunked and
close-delimited response bodies, streamed as raw body bytes as they arrive, each piece with the time
the socket read brought it (see `BodyStream`), connect and read timeouts. What it does not do:
HTTP/2, proxies, pipelining, `Expect: 100-continue`, streamed request uploads (a body is sent whole).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import httptools
import httpx

_MAX_BUFFERED = 1 << 20  # stop reading the socket while this many body bytes wait for the reader
BODY_STREAM = "body_stream"  # the response extension that holds its `BodyStream` (for its timestamps)
Sink = Callable[[float, bytes], None]  # takes (perf_counter() of the socket read, body piece)
_Origin = tuple[bytes, bytes, int]


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: parses responses as data arrives and wakes the one reader."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        # body pieces parsed but not yet handed to the reader, with the perf_counter() of their read
        self.body: deque[tuple[float, bytes]] = deque()
        self.sink: Sink | None = None  # set by BodyStream.consume: pieces go to it as they are parsed
        self.buffered = 0
        self.paused = False  # socket reads paused: the reader is more than _MAX_BUFFERED behind
        self.received = False  # any byte of the current response arrived
        self.error: Exception | None = None
        self.read_timeout: float | None = None
        self.sent_at = 0.0  # perf_counter() when the request was written
        self.last_read = 0.0  # perf_counter() of the latest socket read
        self._waiter: asyncio.Future | None = None
        self._watchdog: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        self.last_read = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"invalid HTTP response: {exc}"))
            self.close()
        if self.buffered > _MAX_BUFFERED and not self.paused and not self.closed:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        if self.sink is None or self.complete or self.error is not None:
            self._wake()  # a sink took the pieces already: its reader waits for the end only

    def eof_received(self) -> bool:
        return False  # close our side too: HTTP/1.1 has no use for a half-open connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_watchdog()
        if self.headers_done and not self.complete and self.error is None and self._until_eof():
            self.complete = True  # a close-delimited body ends with the connection
        elif not self.complete and self.error is None:
            if exc is not None:
                self.error = httpx.ReadError(str(exc) or type(exc).__name__)
            else:
                what = "message body" if self.headers_done else "response"
                self.error = httpx.RemoteProtocolError(
                    f"peer closed connection without sending complete {what}"
                )
        self._wake()

    # --- httptools callbacks

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.sink is None:
            self.body.append((self.last_read, body))
            self.buffered += len(body)
            return
        try:
            self.sink(self.last_read, body)
        except Exception as exc:  # the reader's own error: it gets it back, the connection is unusable
            self.sink = None
            self._fail(exc)
            self.close()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it once the message ends
        self._stop_watchdog()

    # --- used by the transport and the response stream

    def start(self, data: bytes, read_timeout: float | None) -> None:
        """Send one request (head and body in one write) and get ready for its response."""
        self.reason = b""
        self.headers = []
        self.headers_done = self.complete = self.keep_alive = self.received = False
        self.body.clear()
        self.sink = None
        self.buffered = 0
        self.error = None
        self.read_timeout = read_timeout
        self.sent_at = self.last_read = time.perf_counter()
        if read_timeout is not None:
            self._watchdog = self.loop.call_later(read_timeout, self._check_idle)
        self.transport.write(data)  # type: ignore[union-attr]

    async def wait(self) -> None:
        """Until something new happens: data, the end of the message, an error or the close."""
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take_body(self) -> tuple[float, bytes]:
        """The oldest body piece not yet taken, with the perf_counter() of the read that brought it."""
        read_at, piece = self.body.popleft()
        self.buffered -= len(piece)
        if self.paused and self.buffered <= _MAX_BUFFERED and not self.closed:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        return read_at, piece

    def reusable(self) -> bool:
        """Whether the response was read to its end on a connection the server keeps open."""
        return self.complete and self.error is None and not self.closed and self.keep_alive

    def close(self) -> None:
        """Drop the connection (an unfinished response cannot be skipped on HTTP/1.1)."""
        self._stop_watchdog()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def _until_eof(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _check_idle(self) -> None:
        # One timer per read-timeout period instead of one per read: the reader's hot path stays free.
        assert self.read_timeout is not None
        left = self.last_read + self.read_timeout - time.perf_counter()
        if left > 0:
            self._watchdog = self.loop.call_later(left, self._check_idle)
            return
        self._watchdog = None
        self._fail(httpx.ReadTimeout(f"no data for {self.read_timeout:g} s"))
        self.close()

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None


class BodyStream(httpx.AsyncByteStream):
    """The raw body of one response, piece by piece as the socket reads bring it.

    `response.extensions[BODY_STREAM]` is this object. `sent_at` is the time.perf_counter() at which
    the request was written; `read_at` the one at which the piece last yielded came off the socket,
    so a consumer's timings do not include how long its own event loop took to get to the piece.
    The connection goes back to the pool once the body is read to its end.
    """

    def __init__(self, transport: StreamingTransport, origin: _Origin, connection: _Connection) -> None:
        self._transport = transport
        self._origin = origin
        self._connection: _Connection | None = connection
        self.sent_at = connection.sent_at
        self.read_at = 0.0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._connection
        if conn is None:
            raise httpx.StreamClosed()
        while True:
            if conn.body:
                self.read_at, piece = conn.take_body()
                yield piece
            elif conn.error is not None:
                raise conn.error
            elif conn.complete:
                return
            else:
                await conn.wait()

    async def consume(self, sink: Sink) -> None:
        """Call `sink(read_at, piece)` for every body piece, in order; return once the body has ended.

        The pieces go to the sink from the connection's protocol callback, as the socket reads bring
        them, instead of waking the reading task for each one: at hundreds of streams the task switches
        were most of the client's work, and a read that waits behind them is timed late. Raises what
        iterating would (a connection error, or what the sink raised).
        """
        conn = self._connection
        if conn is None:
            raise httpx.StreamClosed()
        while conn.body:
            self.read_at, piece = conn.take_body()
            sink(self.read_at, piece)
        conn.sink = sink
        try:
            while conn.error is None and not conn.complete:
                await conn.wait()
        finally:
            conn.sink = None
        if conn.error is not None:
            raise conn.error

    async def aclose(self) -> None:
        conn, self._connection = self._connection, None
        if conn is not None:
            self._transport.release(self._origin, conn)


class StreamingTransport(httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport` for many concurrent streaming HTTP/1.1 responses.

    Use it as `httpx.AsyncClient(transport=StreamingTransport())`. A response's `aiter_raw()` yields
    body bytes as each socket read brings them; content decoding is left to httpx (send
    `Accept-Encoding: identity` to get the bytes as the server wrote them).
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` on an idle keep-alive connection (or a new one); return once headers arrive."""
        origin = _origin(request.url)
        timeouts = request.extensions.get("timeout", {})
        data = _serialize(request, await request.aread())
        conn = self._idle_connection(origin)
        reused = conn is not None
        if conn is None:
            conn = await self._connect(origin, timeouts.get("connect"))
        try:
            conn.start(data, timeouts.get("read"))
            while not conn.headers_done and conn.error is None:
                await conn.wait()
            if conn.error is not None and reused and not conn.received:
                # The server closed the idle connection as we reused it (keep-alive expiry): nothing of
                # this request was answered, so send it once more on a fresh connection.
                conn.close()
                conn = await self._connect(origin, timeouts.get("connect"))
                conn.start(data, timeouts.get("read"))
                while not conn.headers_done and conn.error is None:
                    await conn.wait()
            if conn.error is not None:
                raise conn.error
        except BaseException:
            self._drop(conn)
            raise
        stream = BodyStream(self, origin, conn)
        return httpx.Response(
            conn.parser.get_status_code(),
            headers=conn.headers,
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": conn.reason, BODY_STREAM: stream},
        )

    async def open_connections(self, url: str, count: int, timeout: float | None = None) -> int:
        """Open `count` keep-alive connections to `url`'s origin ahead of use; return how many opened.

        Opening hundreds of connections at the instant a load starts costs the server a burst of
        accepts that shows up in the first requests' latency; doing it beforehand keeps that out of
        the measurement. A connection that cannot be opened is skipped: a request will report why.
        """
        origin = _origin(httpx.URL(url))
        results = await asyncio.gather(
            *(self._connect(origin, timeout) for _ in range(count)), return_exceptions=True
        )
        opened = [conn for conn in results if isinstance(conn, _Connection)]
        self._idle.setdefault(origin, []).extend(opened)
        return len(opened)

    def release(self, origin: _Origin, conn: _Connection) -> None:
        """Keep a connection whose response was read to its end; close any other."""
        if conn.reusable():
            self._idle.setdefault(origin, []).append(conn)
        else:
            self._drop(conn)

    async def aclose(self) -> None:
        """Close every connection, idle or busy."""
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()

    def _idle_connection(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
            self._open.discard(conn)
        return None

    async def _connect(self, origin: _Origin, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls: Any = None
        if scheme == b"https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), host.decode(), port, ssl=tls
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection to {host.decode()}:{port} in {timeout:g} s") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        self._open.add(conn)
        return conn

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)


def _origin(url: httpx.URL) -> _Origin:
    return url.raw_scheme, url.raw_host, url.port or (443 if url.raw_scheme == b"https" else 80)


def _serialize(request: httpx.Request, body: bytes) -> bytes:
    """The request as bytes on the wire: request line, headers, body (framed as its headers say)."""
    head = [request.method.encode(), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
    chunked = False
    for name, value in request.headers.raw:
        head += (name, b": ", value, b"\r\n")
        chunked = chunked or (name.lower() == b"transfer-encoding" and value.lower() == b"chunked")
    head.append(b"\r\n")
    if chunked:
        body = (b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)) if body else b"0\r\n\r\n"
    head.append(body)
    return b"".join(head)
