"""Load-generator overhead: is the client ever the bottleneck?

Runs the load generator in this process (pinned to one core) against a server subprocess pinned to
the other core, 256 concurrent streams, twice:
  1. a real `autotune sim-server --debug-timings` (the simulated engine behind its own
     asyncio + httptools HTTP server);
  2. a minimal reference SSE server (this file, `--serve-reference`): no engine and no framework,
     a token chunk to every open stream each 20 ms "step", each stamped just before its socket write.
     Its own HTTP overhead is small, so what the client adds to TTFT is what is left.
For each it prints side by side:
  - p50/p99 TTFT as the client measured it vs the server's: its own (from reading the request off
    the socket to handing the first token chunk to it, its queueing included: what the server takes),
    engine-side (vLLM's histogram: from the engine's arrival to the step that produced the token) and
    sent (engine arrival to the first chunk), matched per request on one clock (CLOCK_MONOTONIC is
    shared by processes), and where the per-request difference goes;
  - the client's event-loop lag (a probe task that sleeps 2 ms at a time, in the load's own loop):
    how late the client can be to anything, sending and reading included;
  - streamed tokens per second, and per second of client CPU (what one core can take);
  - each process's CPU share, and which side saturates.
Targets (issue 4): client p99 TTFT within 5 ms of the server's own; >= 5,000 streamed tokens/s on one
core.

    python benchmarks/loadgen_overhead.py [--requests 2048] [--concurrency 256] [--output-len 128]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import httpx
import numpy as np
from arguments import Parser, user_errors, whole

from autotune.catalog.gpus import get_gpu
from autotune.measure.loadgen import LoadResult, run_load, run_load_sync
from autotune.sim_server.server import free_port, start_sim_server
from autotune.workloads.spec import Request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROBE_S = 0.002  # the loop-lag probe's sleep
SATURATED = 0.9  # a process busy this share of one core is the bottleneck
TARGET_GAP_MS = 5.0  # issue 4: client p99 TTFT within this of the server's
REFERENCE_STEP_S = 0.02  # the reference server's "decode step": about sim-server's at 256 streams


@dataclass
class Server:
    """A running server subprocess to measure against."""

    name: str
    base_url: str
    pid: int


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = Parser(__doc__)
    parser.add_argument("--requests", type=whole(1), default=2048)
    parser.add_argument("--concurrency", type=whole(1), default=256)
    parser.add_argument("--prompt-len", type=whole(1), default=128)
    parser.add_argument("--output-len", type=whole(1), default=128)
    parser.add_argument("--gpu", default="H100")
    parser.add_argument("--server", choices=("both", "sim", "reference"), default="both")
    parser.add_argument("--serve-reference", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    with user_errors(parser):  # before a server starts
        get_gpu(args.gpu)
    if args.serve_reference:
        asyncio.run(_serve_reference(args.serve_reference))
        return

    cores = sorted(os.sched_getaffinity(0))
    client_core, server_core = cores[0], cores[-1]
    os.sched_setaffinity(0, {client_core})
    server_cpu = server_core if len(cores) > 1 else None
    requests = [Request(i, args.prompt_len, args.output_len) for i in range(args.requests)]
    print(
        f"client on core {client_core}, server on core {server_core}; {args.requests} requests, "
        f"concurrency {args.concurrency}, {args.prompt_len}/{args.output_len} prompt/output tokens"
    )
    if args.server in ("both", "sim"):
        sim_args = [MODEL, "--debug-timings"]
        with start_sim_server(sim_args, gpu=args.gpu, cpu=server_cpu) as proc:
            _bench(
                Server(f"sim-server ({args.gpu}, {MODEL})", proc.base_url, proc.process.pid), requests, args
            )
    if args.server in ("both", "reference"):
        with _reference_server(server_cpu) as server:
            _bench(server, requests, args)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work skews every figure)")


def _bench(server: Server, requests: list[Request], args: argparse.Namespace) -> None:
    """One measured run against `server`, with its figures printed."""
    run_load_sync(server.base_url, MODEL, requests[:32], max_concurrency=32)  # warm-up: caches, code paths
    warm_ids = {r["id"] for r in httpx.get(server.base_url + "/debug/requests").json()["requests"]}
    cpu0, server_cpu0 = time.process_time(), _cpu_seconds(server.pid)
    result, lags = asyncio.run(_measure(server.base_url, requests, args.concurrency))
    cpu, server_cpu = time.process_time() - cpu0, _cpu_seconds(server.pid) - server_cpu0
    rows = httpx.get(server.base_url + "/debug/requests", timeout=30).json()["requests"]
    # Warm-up and measured requests share ids: keep the server rows of the measured run only.
    by_id = {int(r["id"]): r for r in rows if r["id"] not in warm_ids or r["arrival"] >= result.t0}
    ok = [(rid, rec) for rid, rec in zip(result.request_ids, result.records, strict=True) if rec.success]
    sent = {rid: result.t0 + rec.start_time for rid, rec in ok}  # perf_counter when the client started it
    ms = 1000.0

    def per_request(fn) -> np.ndarray:
        return np.array([fn(rid, rec, by_id[rid]) for rid, rec in ok]) * ms

    client_ttft = per_request(lambda _, rec, __: rec.ttft)
    engine_ttft = per_request(lambda _, __, row: row["ttft"])
    sent_ttft = per_request(lambda _, __, row: row["ttft_sent"])
    own_ttft = per_request(lambda _, __, row: row["first_sent"] - row["read"])
    to_read = per_request(lambda rid, _, row: row["read"] - sent[rid])
    to_handler = per_request(lambda _, __, row: row["received"] - row["read"])
    to_engine = per_request(lambda _, __, row: row["arrival"] - row["received"])
    fan_out = per_request(lambda _, __, row: row["first_sent"] - row["first_token"])
    to_client = per_request(lambda rid, rec, row: sent[rid] + rec.ttft - row["first_sent"])
    tokens = sum(rec.output_len for _, rec in ok)

    print(f"\n== {server.name}: {len(ok)}/{len(requests)} requests ok")
    print(f"{'(ms)':<48}{'p50':>9}{'p99':>9}")
    for label, values in (
        ("TTFT, client (loadgen)", client_ttft),
        ("TTFT, server engine-side", engine_ttft),
        ("TTFT, server first chunk sent", sent_ttft),
        ("TTFT, server's own: request read -> chunk sent", own_ttft),
        ("client - engine TTFT, per request:", client_ttft - engine_ttft),
        ("  client sends -> server reads the request", to_read),
        ("  server reads it -> its handler starts", to_handler),
        ("  server handler -> request in the engine", to_engine),
        ("  server: first token -> first chunk sent", fan_out),
        ("  server sent -> client read it", to_client),
        ("client event-loop lag (2 ms probe)", np.array(lags) * ms),
    ):
        print(f"{label:<48}{np.percentile(values, 50):>9.2f}{np.percentile(values, 99):>9.2f}")
    p99_gap = np.percentile(client_ttft, 99) - np.percentile(own_ttft, 99)
    p99_engine_gap = np.percentile(client_ttft, 99) - np.percentile(engine_ttft, 99)
    print(f"p99 TTFT client - server: {p99_gap:.2f} ms vs the server's own (target <= {TARGET_GAP_MS:g} ms), "
          f"{p99_engine_gap:.2f} ms vs engine-side")  # fmt: skip
    print(f"streamed tokens/s: {tokens / result.duration:,.0f} over {result.duration:.2f} s; "
          f"{tokens / cpu:,.0f} tokens per client CPU-second (target >= 5,000)")  # fmt: skip
    client_share, server_share = cpu / result.duration, server_cpu / result.duration
    print(f"CPU, share of one core: client {100 * client_share:.0f}% ({cpu:.2f} s), "
          f"server {100 * server_share:.0f}% ({server_cpu:.2f} s)")  # fmt: skip
    client_ms = max(np.percentile(lags, 99) * ms, np.percentile(to_client, 99))
    print(_verdict(client_share, server_share, client_ms, p99_gap))


async def _measure(
    base_url: str, requests: list[Request], concurrency: int
) -> tuple[LoadResult, list[float]]:
    """The load, with a probe in the same event loop that records how late a 2 ms sleep wakes up."""
    lags: list[float] = []

    async def probe() -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            lags.append(time.perf_counter() - start - PROBE_S)

    prober = asyncio.create_task(probe())
    try:
        result = await run_load(base_url, MODEL, requests, max_concurrency=concurrency)
    finally:
        prober.cancel()
    return result, lags


def _verdict(client_share: float, server_share: float, client_ms: float, p99_gap_ms: float) -> str:
    """Which side limits the run: a CPU-bound process, else which side the p99 TTFT gap comes from.

    `client_ms` is what the client can account for at p99: the later of its event-loop lag (how late it
    sends or reads) and how long after the server's send it read the first chunk.
    """
    busy = [
        name for name, share in (("client", client_share), ("server", server_share)) if share >= SATURATED
    ]
    if busy:
        return f"saturated: {' and '.join(busy)} (>= {SATURATED:.0%} of its core)"
    if p99_gap_ms <= TARGET_GAP_MS:
        return f"saturated: neither; the client's p99 TTFT is within {TARGET_GAP_MS:g} ms of the server's"
    side = "client" if client_ms >= p99_gap_ms / 2 else "server (its HTTP layer: accepting requests, fan-out)"
    return (
        f"saturated: neither process is CPU-bound; the client accounts for at most {client_ms:.1f} ms of the "
        f"{p99_gap_ms:.1f} ms p99 gap, so the gap is on the {side} side"
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- the reference server


@contextlib.contextmanager
def _reference_server(cpu: int | None) -> Iterator[Server]:
    """This file run as `--serve-reference PORT` in a subprocess (pinned to `cpu`), until the block ends."""
    port = free_port()
    preexec = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    process = subprocess.Popen([sys.executable, __file__, "--serve-reference", str(port)], preexec_fn=preexec)
    base_url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            with contextlib.suppress(httpx.TransportError):
                httpx.get(base_url + "/debug/requests", timeout=1)
                break
            time.sleep(0.1)
        yield Server(f"reference SSE server (a chunk to every stream each {REFERENCE_STEP_S * 1000:g} ms)",
                     base_url, process.pid)  # fmt: skip
    finally:
        process.terminate()
        process.wait(timeout=5)


@dataclass
class _RefStream:
    """One streaming request on the reference server, with the sim-server's debug-row timings."""

    transport: asyncio.Transport
    rid: str
    total: int
    arrival: float
    sent: int = 0
    first_sent: float | None = None

    def send_token(self) -> bool:
        """Write the next token chunk (the last one with usage, [DONE] and the end); True if more follow."""
        self.sent += 1
        more = self.sent < self.total
        event = _TOKEN if more else _TOKEN + _USAGE % self.total + b"data: [DONE]\n\n"
        if self.first_sent is None:
            self.first_sent = time.perf_counter()  # just before the write: plain asyncio sends at once
        self.transport.write(b"%x\r\n%s\r\n%s" % (len(event), event, b"" if more else b"0\r\n\r\n"))
        return more

    def row(self) -> dict:
        first = self.first_sent or self.arrival
        ttft = first - self.arrival
        return {"id": self.rid, "read": self.arrival, "received": self.arrival, "arrival": self.arrival,
                "first_token": first, "first_sent": first, "ttft": ttft, "ttft_sent": ttft}  # fmt: skip


@dataclass
class _RefState:
    streams: list[_RefStream] = field(default_factory=list)
    done: list[_RefStream] = field(default_factory=list)


_TOKEN = b'data: {"id":"cmpl-0","object":"text_completion","choices":[{"index":0,"text":" x"}]}\n\n'
_USAGE = b'data: {"id":"cmpl-0","object":"text_completion","choices":[],"usage":{"completion_tokens":%d}}\n\n'
_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class _RefConnection(asyncio.Protocol):
    """HTTP/1.1 on the reference server: POST starts a stream, GET /debug/requests returns the rows."""

    def __init__(self, state: _RefState) -> None:
        self.state = state
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.rid = ""
        self.body = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-request-id":
            self.rid = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.parser.get_method() == b"GET":
            rows = json.dumps({"requests": [s.row() for s in self.state.done]}).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(rows), rows))
            return
        total = json.loads(self.body)["max_tokens"]
        self.body = b""
        self.transport.write(_SSE_HEAD)
        self.state.streams.append(_RefStream(self.transport, self.rid, total, time.perf_counter()))


async def _serve_reference(port: int) -> None:
    """Serve until killed; each step, every open stream gets one token chunk (the last one: usage, [DONE])."""
    state = _RefState()
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: _RefConnection(state), "127.0.0.1", port)
    while True:
        await asyncio.sleep(REFERENCE_STEP_S)
        still = []
        for stream in state.streams:
            (still if stream.send_token() else state.done).append(stream)
        state.streams = still


if __name__ == "__main__":
    from autotune.core.interrupts import stops_as_sigint

    with stops_as_sigint():  # SIGTERM (`timeout`, kill) stops its servers as Ctrl-C does: they outlived it
        main()
