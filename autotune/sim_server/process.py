"""A sim-server subprocess for tests and benchmarks: start it on a free port, wait for /health, stop it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class SimServerProcess:
    """A sim-server subprocess started by `start_sim_server`."""

    process: subprocess.Popen
    port: int
    log_path: Path
    base_url: str

    def log(self) -> str:
        """Everything the server wrote so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def start_sim_server(
    args: Sequence[str],
    *,
    gpu: str = "H100",
    log_dir: Path | None = None,
    ready_timeout_s: float = 30.0,
    wait_ready: bool = True,
    cpu: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[SimServerProcess]:
    """Run `autotune sim-server ARGS --port <free> --gpu GPU` as a real subprocess.

    It runs `python -m autotune.commands.sim_server`, the same command without importing every other
    CLI command (faster start).

    Waits for /health (unless `wait_ready` is False, e.g. for a config that must fail), yields the
    process, and always terminates it. `cpu` pins the server to one CPU core (benchmarks). `env` is its
    environment (default: this process's).
    Raises RuntimeError with the log tail when the server exits or never becomes ready.
    """
    import tempfile

    import httpx

    port = free_port()
    tmp = None
    if log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sim-server-")
        log_dir = Path(tmp.name)
    log_path = Path(log_dir) / f"sim-server-{port}.log"
    cmd = [sys.executable, "-m", "autotune.commands.sim_server", *args, "--port", str(port), "--gpu", gpu]
    preexec = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
            env=env,
        )
    handle = SimServerProcess(process, port, log_path, f"http://127.0.0.1:{port}")
    try:
        if wait_ready:
            _wait_healthy(handle, ready_timeout_s, httpx)
        yield handle
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if tmp is not None:
            tmp.cleanup()


def _wait_healthy(handle: SimServerProcess, timeout_s: float, httpx: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise RuntimeError(f"sim-server exited with {handle.process.returncode}:\n{handle.log()[-2000:]}")
        try:
            if httpx.get(handle.base_url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"sim-server not ready after {timeout_s:g} s:\n{handle.log()[-2000:]}")
