"""sim-server's own HTTP/1.1 layer (autotune.sim_server.httpd) on a raw socket: routing errors, keep-alive,
pipelining, `Connection: close`, HEAD, malformed requests, and a quick exit on SIGTERM mid-stream."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from autotune.sim_server.server import SimServerProcess, start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def server() -> Iterator[SimServerProcess]:
    with start_sim_server([MODEL]) as proc:
        yield proc


def _exchange(server: SimServerProcess, data: bytes, settle_s: float = 0.3) -> bytes:
    """Send raw bytes on a new connection; everything read until the server closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(settle_s)
        seen = b""
        try:
            while data := sock.recv(65536):
                seen += data
        except TimeoutError:
            return seen
        return seen + b"<closed>"


def _post(body: dict, extra: str = "") -> bytes:
    payload = json.dumps(body).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"{extra}Content-Length: {len(payload)}\r\n\r\n"
    return head.encode() + payload


def test_unknown_path_and_wrong_method(server: SimServerProcess) -> None:
    assert _exchange(server, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").startswith(
        b"HTTP/1.1 404 Not Found\r\n"
    )
    wrong = _exchange(server, b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wrong.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and b"allow: POST\r\n" in wrong


def test_pipelined_requests_are_answered_in_order_and_close_is_honoured(server: SimServerProcess) -> None:
    wire = (
        _post({"prompt": "first request", "max_tokens": 3})
        + b"HEAD /version HTTP/1.1\r\nHost: x\r\n\r\n"
        + _post({"prompt": "last one", "max_tokens": 2, "stream": True}, "Connection: close\r\n")
    )
    seen = _exchange(server, wire, settle_s=3.0)
    assert seen.endswith(b"0\r\n\r\n<closed>")  # the server closed after the last response
    first, head, last = seen.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert b'"completion_tokens":3' in first
    assert head.endswith(b"\r\n\r\n") and b"content-length: " in head  # HEAD: the head, no body
    assert b"transfer-encoding: chunked\r\n" in last and b"connection: close\r\n" in last
    assert last.count(b"data: {") == 2 and b"data: [DONE]\n\n" in last


def test_malformed_request_gets_400_and_the_connection_closes(server: SimServerProcess) -> None:
    seen = _exchange(server, b"NOT HTTP AT ALL\r\n\r\n")
    assert seen.startswith(b"HTTP/1.1 400 Bad Request\r\n") and seen.endswith(b"<closed>")


def test_sigterm_ends_a_hung_stream_at_once() -> None:
    with start_sim_server([MODEL, "--hang-after", "1"]) as proc:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=5) as sock:
            sock.sendall(_post({"prompt": "hello", "max_tokens": 50, "stream": True}))
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 OK\r\n")  # the head; tokens never come
            start = time.monotonic()
            proc.process.send_signal(signal.SIGTERM)
            assert proc.process.wait(timeout=5) == 0
            assert time.monotonic() - start < 1.0
        assert "Finished server process" in proc.log()


class _Conn:
    """The part of HttpConnection an SseStream writes to."""

    def __init__(self) -> None:
        self.paused = True
        self.chunks: list[tuple[bytes, bool]] = []

    def send_chunk(self, data: bytes, last: bool = False) -> None:
        self.chunks.append((data, last))


def test_a_paused_stream_holds_its_tokens_and_writes_them_in_one_chunk_on_resume() -> None:
    from autotune.sim_server.service import Pending
    from autotune.sim_server.sse import ChunkWriter, SseStream

    state = Pending(key=0, rid="r", arrival=0.0, prompt_tokens=5, max_tokens=4, finish_reason="length")
    conn = _Conn()
    stream = SseStream(None, conn, [ChunkWriter(MODEL, False, state)], include_usage=True)  # type: ignore[arg-type]
    state.listener = stream.on_tokens
    state.tokens = 2
    stream.on_tokens(state)
    state.tokens, state.finished = 4, True
    stream.on_tokens(state)
    assert conn.chunks == []  # the client reads slowly: nothing more is buffered for it
    conn.paused = False
    stream.resume()
    ((data, last),) = conn.chunks
    events = data.decode().split("\n\n")[:-1]
    assert last and len(events) == 6 and events[-1] == "data: [DONE]"
    assert '"finish_reason":"length"' in events[3] and '"usage"' in events[4]
    assert state.first_sent is not None and state.listener is None


def test_a_burst_of_requests_is_read_before_their_handlers_run() -> None:
    """Simultaneous requests are all read (and stamped) before their handlers run, so none waits unread
    in its socket while earlier handlers work (time the client counts and the server's clock would not)."""
    import asyncio

    from autotune.sim_server.http_messages import HttpRequest
    from autotune.sim_server.httpd import DISPATCH_BATCH, HttpConnection, start_http_server

    burst = DISPATCH_BATCH + 4
    handled: list[tuple[float, float]] = []  # (read_at, handler start) per request

    def handler(conn: HttpConnection, request: HttpRequest) -> None:
        handled.append((request.read_at, time.perf_counter()))
        time.sleep(0.002)  # a handler's work
        conn.respond(200, b"ok", "text/plain")

    async def main() -> None:
        server, live = await start_http_server("127.0.0.1", 0, handler)
        port = server.sockets[0].getsockname()[1]
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(burst)]
        while len(live) < burst:  # every connection accepted: the next poll sees only their requests
            await asyncio.sleep(0.01)
        for sock in socks:
            sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")  # all in the kernel before the loop runs
        await asyncio.sleep(0.05)
        while len(handled) < burst:
            await asyncio.sleep(0.01)
        for sock in socks:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 OK\r\n")
            sock.close()
        server.close()

    asyncio.run(main())
    reads = sorted(read for read, _ in handled)
    starts = sorted(start for _, start in handled)
    assert reads[-1] < starts[0]  # the whole burst read before the first handler
