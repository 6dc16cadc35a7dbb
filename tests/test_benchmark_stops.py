"""A benchmark stopped with SIGTERM (`timeout`, kill) stops the servers it started, as Ctrl-C does: they
were left running, orphaned, holding their ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        found += [int(k) for k in (task / "children").read_text().split()]
    return found


def test_sigterm_stops_the_sim_server_a_benchmark_started() -> None:
    script = [sys.executable, "benchmarks/loadgen_overhead.py", "--requests", "100000", "--server", "sim"]
    proc = subprocess.Popen(script, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _children(proc.pid):
            assert time.monotonic() < deadline and proc.poll() is None, "no server started"
            time.sleep(0.2)
        time.sleep(2.0)  # the load runs
        servers = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGINT  # stopped as by Ctrl-C
    finally:
        proc.kill()
    time.sleep(1.0)
    left = [pid for pid in servers if Path(f"/proc/{pid}").exists()]
    for pid in left:  # the test leaves nothing running either way
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left running: {left}"
