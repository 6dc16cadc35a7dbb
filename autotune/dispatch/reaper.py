"""The processes of a local Ray cluster end with the run that started it, even a killed one (SIGKILL).

Ray ties its raylet to the driver, but the raylet's agents (ray::DashboardAgent, ray::RuntimeEnvAgent)
outlive a driver killed with SIGKILL: they are left running, reparented to init. So before `ray.init`
the driver marks its environment with a token that every process of its cluster inherits (raylet,
agents, workers and the servers they start), and starts a reaper in its own session: the reaper
waits for the driver's pipe to close (the driver exiting in any way, or stopping it after
`ray.shutdown`), then stops every process still carrying the token. Linux only (/proc); elsewhere
there is no reaper.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

TOKEN_VAR = "AUTOTUNE_RAY_OWNER"
GRACE_S = 3.0  # between SIGTERM and SIGKILL


@dataclass
class Reaper:
    """A running reaper: `stop()` once Ray is shut down (it then stops any straggler)."""

    process: subprocess.Popen[bytes]

    def stop(self, timeout_s: float = GRACE_S + 5) -> None:
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


def marked(token: str) -> list[int]:
    """The processes whose environment carries `token` (this one left out)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
    return pids


def reap(token: str) -> int:
    """SIGTERM every marked process, then SIGKILL what is still there after GRACE_S, again for as long
    as marked processes remain (one may start meanwhile: a worker launching a server), up to GRACE_S
    more; how many there were at first."""
    pids = marked(token)
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while marked(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + GRACE_S
    while (left := marked(token)) and time.monotonic() < deadline:
        _signal(left, signal.SIGKILL)
        time.sleep(0.1)
    return len(pids)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def main() -> None:
    """`python -m autotune.dispatch.reaper TOKEN`: wait for the driver's pipe to close, then reap."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdin.buffer.read()
    reap(sys.argv[1])


if __name__ == "__main__":
    main()
