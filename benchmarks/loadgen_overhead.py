"""Load-generator overhead: is the client ever the bottleneck?

Runs a real `autotune sim-server` subprocess (pinned to one core, --debug-timings) and the load
generator in this process (pinned to another core), 256 concurrent streams, and prints side by side:
  - p50/p99 TTFT as the client measured it vs the server's own (engine-side: the step that produced
    the first token ended; sent: the first chunk was handed to the HTTP layer), matched per request on
    one clock (CLOCK_MONOTONIC is shared by processes), and where the per-request difference goes;
  - the client's event-loop lag (a probe task that sleeps 2 ms at a time, in the load's own loop):
    how late the client can be to anything, sending and reading included;
  - streamed tokens per second, and per second of client CPU (what one core can take);
  - each process's CPU share, and which side saturates.
Targets (issue 4): client p99 TTFT within 5 ms of the server's; >= 5,000 streamed tokens/s on one core.

    python benchmarks/loadgen_overhead.py [--requests 2048] [--concurrency 256] [--output-len 128]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import httpx
import numpy as np

from autotune.loadgen import LoadResult, run_load, run_load_sync
from autotune.sim.server import start_sim_server
from autotune.workload import Request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROBE_S = 0.002  # the loop-lag probe's sleep
SATURATED = 0.9  # a process busy this share of one core is the bottleneck


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--gpu", default="H100")
    args = parser.parse_args()

    cores = sorted(os.sched_getaffinity(0))
    client_core, server_core = cores[0], cores[-1]
    os.sched_setaffinity(0, {client_core})
    requests = [Request(i, args.prompt_len, args.output_len) for i in range(args.requests)]
    server_args = [MODEL, "--debug-timings"]
    with start_sim_server(server_args, gpu=args.gpu, cpu=server_core if len(cores) > 1 else None) as proc:
        run_load_sync(proc.base_url, MODEL, requests[:32], max_concurrency=32)  # warm-up: caches, code paths
        warm_ids = {r["id"] for r in httpx.get(proc.base_url + "/debug/requests").json()["requests"]}
        cpu0, server_cpu0 = time.process_time(), _cpu_seconds(proc.process.pid)
        result, lags = asyncio.run(_measure(proc.base_url, requests, args.concurrency))
        cpu, server_cpu = time.process_time() - cpu0, _cpu_seconds(proc.process.pid) - server_cpu0
        rows = httpx.get(proc.base_url + "/debug/requests", timeout=30).json()["requests"]
    # Warm-up and measured requests share ids: keep the server rows of the measured run only.
    server = {int(r["id"]): r for r in rows if r["id"] not in warm_ids or r["arrival"] >= result.t0}
    ok = [(rid, rec) for rid, rec in zip(result.request_ids, result.records, strict=True) if rec.success]
    sent = {rid: result.t0 + rec.start_time for rid, rec in ok}  # perf_counter when the client started it
    ms = 1000.0

    def per_request(fn) -> np.ndarray:
        return np.array([fn(rid, rec, server[rid]) for rid, rec in ok]) * ms

    client_ttft = per_request(lambda _, rec, __: rec.ttft)
    engine_ttft = per_request(lambda _, __, row: row["ttft"])
    sent_ttft = per_request(lambda _, __, row: row["ttft_sent"])
    to_handler = per_request(lambda rid, _, row: row["received"] - sent[rid])
    to_engine = per_request(lambda _, __, row: row["arrival"] - row["received"])
    fan_out = per_request(lambda _, __, row: row["first_sent"] - row["first_token"])
    to_client = per_request(lambda rid, rec, row: sent[rid] + rec.ttft - row["first_sent"])
    tokens = sum(rec.output_len for _, rec in ok)

    print(f"sim-server ({args.gpu}, {MODEL}) on core {server_core}; client on core {client_core}")
    print(f"{len(ok)}/{args.requests} requests ok, concurrency {args.concurrency}, "
          f"{args.prompt_len} prompt / {args.output_len} output tokens")  # fmt: skip
    print(f"{'(ms)':<48}{'p50':>9}{'p99':>9}")
    for label, values in (
        ("TTFT, client (loadgen)", client_ttft),
        ("TTFT, server engine-side", engine_ttft),
        ("TTFT, server first chunk sent", sent_ttft),
        ("client - engine TTFT, per request:", client_ttft - engine_ttft),
        ("  client sends -> server handler starts", to_handler),
        ("  server handler -> request in the engine", to_engine),
        ("  server: first token -> first chunk sent", fan_out),
        ("  server sent -> client read it", to_client),
        ("client event-loop lag (2 ms probe)", np.array(lags) * ms),
    ):
        print(f"{label:<48}{np.percentile(values, 50):>9.2f}{np.percentile(values, 99):>9.2f}")
    p99_gap = np.percentile(client_ttft, 99) - np.percentile(engine_ttft, 99)
    p99_sent_gap = np.percentile(client_ttft, 99) - np.percentile(sent_ttft, 99)
    print(f"p99 TTFT client - server: {p99_gap:.2f} ms vs engine-side, {p99_sent_gap:.2f} ms vs first chunk "
          f"sent (target <= 5 ms)")  # fmt: skip
    print(f"streamed tokens/s: {tokens / result.duration:,.0f} over {result.duration:.2f} s; "
          f"{tokens / cpu:,.0f} tokens per client CPU-second (target >= 5,000)")  # fmt: skip
    client_share, server_share = cpu / result.duration, server_cpu / result.duration
    print(f"CPU, share of one core: client {100 * client_share:.0f}% ({cpu:.2f} s), "
          f"server {100 * server_share:.0f}% ({server_cpu:.2f} s)")  # fmt: skip
    print(_verdict(client_share, server_share, np.percentile(lags, 99) * ms, p99_gap))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work skews every figure)")


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


def _verdict(client_share: float, server_share: float, client_lag_p99_ms: float, p99_gap_ms: float) -> str:
    """Which side limits the run: a CPU-bound process, else where the TTFT gap comes from."""
    busy = [
        name for name, share in (("client", client_share), ("server", server_share)) if share >= SATURATED
    ]
    if busy:
        return f"saturated: {' and '.join(busy)} (>= {SATURATED:.0%} of its core)"
    side = "client" if client_lag_p99_ms >= p99_gap_ms / 2 else "server (its HTTP layer)"
    return (
        f"saturated: neither process is CPU-bound; the client's p99 loop lag is {client_lag_p99_ms:.1f} ms "
        f"of the {p99_gap_ms:.1f} ms p99 gap, so most of the gap is on the {side} side"
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
