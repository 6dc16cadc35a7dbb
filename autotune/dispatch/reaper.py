"""The processes of a local Ray cluster end with the run that started it, even a killed one (SIGKILL).

Ray ties its raylet to the driver, but the raylet's agents (ray::DashboardAgent, ray::RuntimeEnvAgent)
outlive a driver killed with SIGKILL: they are left running, reparented to init. So before `ray.init`
the driver marks its environment with a token that its cluster's processes inherit (raylet, workers and
the servers they start) and starts a reaper in its own session; after `ray.init` it tells the reaper
the cluster's session folder, where every Ray process keeps a log file open (the agents do not always
get the token: the raylet sometimes starts them without it). The reaper waits for the driver's pipe to
close (the driver exiting in any way, or stopping it after `ray.shutdown`), then stops every process
that carries the token or has a file open in that folder. Linux only (/proc); elsewhere there is none.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TOKEN_VAR = "AUTOTUNE_RAY_OWNER"
GRACE_S = 3.0  # between SIGTERM and SIGKILL


@dataclass
class Reaper:
    """A running reaper: `stop()` once Ray is shut down (it then stops any straggler)."""

    process: subprocess.Popen[bytes]

    def watch(self, folder: str) -> None:
        """Also stop, at the end, the processes with a file open in `folder` (the Ray session's)."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.write(folder.encode() + b"\n")
                self.process.stdin.flush()

    def stop(self, timeout_s: float = 2 * GRACE_S + 5) -> None:
        """Close the pipe (the reaper stops what is left of the cluster) and wait for it."""
        os.environ.pop(TOKEN_VAR, None)
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)


def start_reaper() -> Reaper | None:
    """Mark this process's environment for the cluster about to start, and start its reaper."""
    if not Path("/proc/self/environ").exists():
        return None
    token = uuid.uuid4().hex
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune.dispatch.reaper", token],
        stdin=subprocess.PIPE,  # not inherited by Ray's processes (PEP 446): only this driver holds it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the terminal's process group does not reach it
    )
    os.environ[TOKEN_VAR] = token
    return Reaper(process)


def marked(token: str, folders: Sequence[str] = (), spare: int = 0) -> list[int]:
    """The processes whose environment carries `token` or that have a file open under one of `folders`;
    this one and `spare` (the driver, whose own logs are there) left out."""
    needle = f"{TOKEN_VAR}={token}".encode()
    prefixes = tuple(f"{f.rstrip('/')}/" for f in folders)
    pids = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]
    return [
        pid
        for pid in pids
        if pid not in (os.getpid(), spare)
        and (_carries(pid, needle) or bool(prefixes and _opened_under(pid, prefixes)))
    ]


def _carries(pid: int, needle: bytes) -> bool:
    with contextlib.suppress(OSError):
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return False


def _opened_under(pid: int, prefixes: tuple[str, ...]) -> bool:
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(prefixes):
                    return True
    return False


def reap(token: str, folders: Sequence[str] = (), spare: int = 0) -> int:
    """SIGTERM every marked process, then SIGKILL what is still there after GRACE_S, again for as long
    as marked processes remain (one may start meanwhile: a worker launching a server), up to GRACE_S
    more; how many there were at first."""
    pids = marked(token, folders, spare)
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while marked(token, folders, spare) and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + GRACE_S
    while (left := marked(token, folders, spare)) and time.monotonic() < deadline:
        _signal(left, signal.SIGKILL)
        time.sleep(0.1)
    return len(pids)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def main() -> None:
    """`python -m autotune.dispatch.reaper TOKEN`: wait for the driver's pipe to close, then reap."""
    driver = os.getppid()  # never stopped by its own reaper (a live one waits for it)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    folders = [line.decode(errors="replace").strip() for line in sys.stdin.buffer]  # until EOF
    reap(sys.argv[1], [f for f in folders if f], spare=driver)


if __name__ == "__main__":
    main()
