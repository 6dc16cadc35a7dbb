"""The streaming httpx transport against real TCP servers on 127.0.0.1 that write scripted HTTP bytes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from autotune.measure.http_transport import BODY_STREAM, StreamingTransport
from autotune.measure.loadgen import run_load
from autotune.sim_server.server import free_port
from autotune.workloads.spec import Request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class RawServer:
    """A TCP server whose handler writes exact bytes; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self._writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                self.requests.append(head + await reader.readexactly(length))
                await self.handler(reader, writer, len(self.requests))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client.set()
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        port = free_port()
        server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        async with server:
            yield f"http://127.0.0.1:{port}"
            for writer in self._writers:  # ends the handlers still waiting on kept-alive connections
                writer.transport.abort()
            await asyncio.sleep(0)


def _run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=StreamingTransport(), timeout=httpx.Timeout(5.0))


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def test_chunked_body_split_across_reads_at_every_byte() -> None:
    payload = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]
    wire = CHUNKED_HEAD + _chunked(*payload)

    async def trickle(_: asyncio.StreamReader, writer: asyncio.StreamWriter, __: int) -> None:
        for i in range(len(wire)):  # one byte per write, each flushed: every boundary is split
            writer.write(wire[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0.0005)

    async def main() -> None:
        server = RawServer(trickle)
        async with (
            server.running() as url,
            _client() as client,
            client.stream("GET", url + "/x") as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            body = response.extensions[BODY_STREAM]
            pieces, read_times = [], []
            async for piece in response.aiter_raw():
                pieces.append(piece)
                read_times.append(body.read_at)
        assert b"".join(pieces) == b"".join(payload)  # chunk framing removed, body intact
        assert len(pieces) > 3  # streamed as it arrived, not buffered to the end
        assert body.sent_at < read_times[0] and read_times == sorted(read_times)
        assert read_times[-1] - read_times[0] > 0.02  # each piece carries the time of its own read

    _run(main())


def test_keep_alive_connection_is_reused_and_a_closing_one_is_not() -> None:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        close = b"connection: close\r\n" if n == 3 else b""
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n" + close + b"\r\nok")
        await writer.drain()
        if close:
            writer.close()

    async def main() -> None:
        server = RawServer(answer)
        async with server.running() as url, _client() as client:
            for _ in range(3):
                assert (await client.post(url + "/a", content=b"{}")).text == "ok"
            assert server.connections == 1  # three requests, one keep-alive connection
            assert (await client.get(url + "/b")).text == "ok"
            assert server.connections == 2  # the third answer said close: a new connection
        assert server.requests[0].startswith(b"POST /a HTTP/1.1\r\n") and server.requests[0].endswith(b"{}")

    _run(main())


def test_opened_connections_are_used_first() -> None:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter, __: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")

    async def main() -> None:
        server = RawServer(answer)
        transport = StreamingTransport()
        async with server.running() as url, httpx.AsyncClient(transport=transport) as client:
            assert await transport.open_connections(url, 4) == 4
            responses = await asyncio.gather(*(client.get(url) for _ in range(4)))
            assert [r.status_code for r in responses] == [200] * 4
            assert server.connections == 4

    _run(main())


def test_a_non_200_answer_is_a_response_with_its_body() -> None:
    body = b'{"error":"bad"}'

    async def refuse(_: asyncio.StreamReader, writer: asyncio.StreamWriter, __: int) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    async def main() -> None:
        server = RawServer(refuse)
        async with server.running() as url, _client() as client:
            async with client.stream("POST", url, content=b"{}") as response:
                assert response.status_code == 400 and response.reason_phrase == "Bad Request"
                assert await response.aread() == body
            assert (await client.post(url, content=b"{}")).status_code == 400
            assert server.connections == 1

    _run(main())


@pytest.mark.parametrize(
    "wire",
    [
        CHUNKED_HEAD + b"b\r\ndata: one\n\n\r\n",  # chunked, no last chunk
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten..",  # short of its length
    ],
)
def test_a_server_that_closes_mid_stream_raises_after_the_bytes_it_sent(wire: bytes) -> None:
    async def die(_: asyncio.StreamReader, writer: asyncio.StreamWriter, __: int) -> None:
        writer.write(wire)
        await writer.drain()
        writer.transport.abort()  # the process died: a reset, not a tidy close

    async def main() -> None:
        server = RawServer(die)
        async with server.running() as url, _client() as client:
            received = b""
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                async with client.stream("GET", url) as response:
                    async for piece in response.aiter_raw():
                        received += piece
            assert received in (b"data: one\n\n", b"only ten..")

    _run(main())


def test_a_large_body_read_slowly_arrives_whole() -> None:
    body = bytes(range(256)) * (3 * 4096)  # 3 MiB: more than the transport buffers before it stops reading

    async def big(_: asyncio.StreamReader, writer: asyncio.StreamWriter, __: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async def main() -> None:
        server = RawServer(big)
        async with server.running() as url, _client() as client, client.stream("GET", url) as response:
            await asyncio.sleep(0.2)  # the whole body could have arrived by now: reading pauses, then resumes
            assert await response.aread() == body

    _run(main())


def test_a_body_delimited_by_the_close_ends_with_it() -> None:
    async def to_eof(_: asyncio.StreamReader, writer: asyncio.StreamWriter, __: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = RawServer(to_eof)
        async with server.running() as url, _client() as client:
            assert (await client.get(url)).content == b"all of it"

    _run(main())


def test_an_idle_connection_the_server_dropped_is_replaced_without_an_error() -> None:
    # The server answers once per connection, then closes the connection when the next request comes
    # (what a keep-alive expiry racing a new request looks like): the request goes out again, fresh.
    async def once(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n % 2 == 0:
            writer.transport.abort()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n%d" % (n % 10))

    async def main() -> None:
        server = RawServer(once)
        async with server.running() as url, _client() as client:
            assert (await client.get(url)).status_code == 200
            assert (await client.get(url)).status_code == 200
        assert server.connections == 2 and len(server.requests) == 3

    _run(main())


def test_refused_connection_and_read_timeout_are_httpx_errors() -> None:
    async def silent(reader: asyncio.StreamReader, _: asyncio.StreamWriter, __: int) -> None:
        await reader.read()  # never answers

    async def main() -> None:
        async with _client() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{free_port()}/")
        server = RawServer(silent)
        async with server.running() as url:
            client = httpx.AsyncClient(transport=StreamingTransport(), timeout=httpx.Timeout(0.3))
            async with client:
                with pytest.raises(httpx.ReadTimeout):
                    await client.get(url)

    _run(main())


def test_cancelling_a_stream_closes_its_connection() -> None:
    async def endless(_: asyncio.StreamReader, writer: asyncio.StreamWriter, __: int) -> None:
        writer.write(CHUNKED_HEAD)
        while True:
            writer.write(_chunked(b"data: x\n\n")[:-5])  # one chunk, never the last
            await writer.drain()
            await asyncio.sleep(0.01)

    async def main() -> None:
        server = RawServer(endless)
        async with server.running() as url, _client() as client:

            async def consume() -> None:
                async with client.stream("GET", url) as response:
                    async for _ in response.aiter_raw():
                        pass

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.1)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # The server sees the client go away (what lets vLLM abort the request).
            await asyncio.wait_for(server.closed_by_client.wait(), 2.0)

    _run(main())


def test_the_load_generator_times_events_however_the_reads_split_them() -> None:
    head = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
    token = head + b'"choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":null}]}\n\n'
    usage = head + b'"choices":[],"usage":{"prompt_tokens":4,"total_tokens":7,"completion_tokens":3}}\n\n'

    async def vllm_like(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 2:
            error = b'{"object":"error","message":"bad"}'
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n%s" % (len(error), error))
            return
        writer.write(CHUNKED_HEAD)
        # token 1 split in two reads; tokens 2 and 3 in one read; usage and [DONE] split at the boundary
        for piece in (token[:30], token[30:], token * 2, usage + b"data: [DO", b"NE]\n\n"):
            writer.write(_chunked(piece)[:-5])
            await writer.drain()
            await asyncio.sleep(0.03)
        writer.write(b"0\r\n\r\n")

    async def main() -> None:
        server = RawServer(vllm_like)
        async with server.running() as url:
            result = await run_load(url, "m", [Request(0, 4, 3), Request(1, 4, 3, arrival_time=0.5)])
        ok, failed = sorted(result.records, key=lambda r: not r.success)
        assert ok.success and ok.output_len == 3 and len(ok.itl) == 2
        assert ok.itl[0] >= 0.025 and ok.itl[1] == 0.0  # tokens 2 and 3 arrived in one read
        assert 0.025 <= ok.ttft <= ok.latency  # the first token counts once its event is whole
        assert ok.latency == pytest.approx(ok.ttft + sum(ok.itl))  # the usage chunk does not move the clock
        assert not failed.success and failed.error.startswith("HTTP 400: ")
        assert server.connections == 2  # opened before the run (one per request in flight), no more

    _run(main())


def test_a_sink_gets_every_piece_with_its_read_time_and_its_error_comes_back() -> None:
    async def two_reads(_: asyncio.StreamReader, writer: asyncio.StreamWriter, __: int) -> None:
        writer.write(CHUNKED_HEAD + _chunked(b"one")[:-5])
        await writer.drain()
        await asyncio.sleep(0.03)
        writer.write(_chunked(b"two"))

    async def main() -> None:
        server = RawServer(two_reads)
        async with server.running() as url, _client() as client:
            got: list[tuple[float, bytes]] = []
            async with client.stream("GET", url) as response:
                await response.extensions[BODY_STREAM].consume(lambda at, piece: got.append((at, piece)))
            assert [piece for _, piece in got] == [b"one", b"two"]
            assert got[1][0] - got[0][0] >= 0.025  # each piece carries the time of its own read

            def refuse(_: float, __: bytes) -> None:
                raise ValueError("not an event")

            with pytest.raises(ValueError, match="not an event"):
                async with client.stream("GET", url) as response:
                    await response.extensions[BODY_STREAM].consume(refuse)
            assert (await client.get(url)).content == b"onetwo"  # the broken connection was not reused
            assert server.connections == 2

    _run(main())
