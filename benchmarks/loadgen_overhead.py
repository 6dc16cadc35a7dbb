"""Load-generator overhead: is the client ever the bottleneck?

Runs a real `autotune sim-server` subprocess (pinned to one core, --debug-timings) and the load
generator in this process (pinned to another core), 256 concurrent streams, and prints side by side:
  - p50/p99 TTFT as the client measured it vs the server's own (engine-side: the step that produced
    the first token ended; sent: the first chunk was handed to the HTTP layer), matched per request on
    one clock (CLOCK_MONOTONIC is shared by processes), and the p99 of the per-request difference;
  - streamed tokens per second, and per second of client CPU (what one core can take).
Targets (issue 4): client p99 TTFT within 5 ms of the server's; >= 5,000 streamed tokens/s on one core.

    python benchmarks/loadgen_overhead.py [--requests 2048] [--concurrency 256] [--output-len 128]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import httpx
import numpy as np

from autotune.loadgen import run_load_sync
from autotune.sim.server import start_sim_server
from autotune.workload import Request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


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
        run_load_sync(proc.base_url, MODEL, requests[:32], max_concurrency=32)  # warm-up: connections, caches
        warm_ids = {r["id"] for r in httpx.get(proc.base_url + "/debug/requests").json()["requests"]}
        cpu0, server_cpu0 = time.process_time(), _cpu_seconds(proc.process.pid)
        result = run_load_sync(proc.base_url, MODEL, requests, max_concurrency=args.concurrency)
        cpu, server_cpu = time.process_time() - cpu0, _cpu_seconds(proc.process.pid) - server_cpu0
        rows = httpx.get(proc.base_url + "/debug/requests", timeout=30).json()["requests"]
    # Warm-up and measured requests share ids: keep the server rows of the measured run only.
    server = {int(r["id"]): r for r in rows if r["id"] not in warm_ids or r["arrival"] >= result.t0}
    ok = [(rid, rec) for rid, rec in zip(result.request_ids, result.records, strict=True) if rec.success]
    client_ttft = np.array([rec.ttft for _, rec in ok]) * 1000
    engine_ttft = np.array([server[rid]["ttft"] for rid, _ in ok]) * 1000
    sent_ttft = np.array([server[rid]["ttft_sent"] for rid, _ in ok]) * 1000
    diff = client_ttft - engine_ttft
    # Where the difference goes: client send -> server accepts; server sends -> client parses.
    to_server = np.array([server[rid]["arrival"] - (result.t0 + rec.start_time) for rid, rec in ok]) * 1000
    to_client = (
        np.array([result.t0 + rec.start_time + rec.ttft - server[rid]["first_sent"] for rid, rec in ok])
        * 1000
    )
    tokens = sum(rec.output_len for _, rec in ok)

    print(f"sim-server ({args.gpu}, {MODEL}) on core {server_core}; client on core {client_core}")
    print(f"{len(ok)}/{args.requests} requests ok, concurrency {args.concurrency}, "
          f"{args.prompt_len} prompt / {args.output_len} output tokens")  # fmt: skip
    print(f"{'TTFT (ms)':<28}{'p50':>10}{'p99':>10}")
    for label, values in (
        ("client (loadgen)", client_ttft),
        ("server, engine-side", engine_ttft),
        ("server, first chunk sent", sent_ttft),
        ("client - engine, per request", diff),
        ("  send -> server accepts", to_server),
        ("  server sends -> client reads", to_client),
    ):
        print(f"{label:<28}{np.percentile(values, 50):>10.2f}{np.percentile(values, 99):>10.2f}")
    p99_gap = np.percentile(client_ttft, 99) - np.percentile(engine_ttft, 99)
    print(f"p99 TTFT client - server: {p99_gap:.2f} ms (target <= 5 ms)")
    print(f"streamed tokens/s: {tokens / result.duration:,.0f} over {result.duration:.2f} s; "
          f"client CPU {cpu:.2f} s ({100 * cpu / result.duration:.0f}% of one core) -> "
          f"{tokens / cpu:,.0f} tokens per client CPU-second (target >= 5,000)")  # fmt: skip
    share = 100 * server_cpu / result.duration
    print(f"server CPU {server_cpu:.2f} s ({share:.0f}% of one core); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (others skew every figure)")  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
