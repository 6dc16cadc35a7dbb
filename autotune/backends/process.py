"""The `vllm` backend: each session (a trial) runs `vllm serve` (or a drop-in such as
`autotune sim-server`) as a subprocess on this host, in its own process group, and tears the whole
group down afterwards."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend
from autotune.backends.failures import LOG_HEADER
from autotune.backends.server import (
    ServerSession,
    TrialLimits,
    read_tail,
    server_session,
)
from autotune.core.api_keys import server_api_key
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError
from autotune.core.secrets import scrub, scrub_args, secret_args
from autotune.measure.server_report import ServerReport

PR_SET_PDEATHSIG = 1  # linux/prctl.h
COPIER_JOIN_S = 5.0


@dataclass(frozen=True)
class ProcessBackend(Backend):
    """Launches `serve_cmd + config.to_args() + --port P --host 127.0.0.1` per session (trial).

    `gpu` names the GPU type (passed to the server as AUTOTUNE_SIM_GPU, which a real vLLM ignores);
    `env` adds variables to the inherited environment. Plain data, so Ray can ship it to workers.
    """

    gpu: str
    serve_cmd: Sequence[str] = ("vllm", "serve")
    startup_timeout_s: float = 600.0
    benchmark_timeout_s: float = 1800.0
    env: Mapping[str, str] | None = None
    stop_grace_s: float = 10.0  # SIGTERM -> SIGKILL: vLLM needs a few seconds to free the GPU cleanly
    _limits: TrialLimits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "serve_cmd", tuple(self.serve_cmd))
        object.__setattr__(self, "env", dict(self.env or {}))
        object.__setattr__(self, "_limits", TrialLimits(self.startup_timeout_s, self.benchmark_timeout_s))
        if not self.serve_cmd:
            raise AutotuneError("the serve command is empty")

    @property
    def simulated(self) -> bool:
        """True when the serve command is `autotune sim-server` (in any spelling that names it)."""
        return "sim-server" in self.serve_cmd

    def preflight(self) -> None:
        """Raise AutotuneError when the serve command cannot be run on this host."""
        program = self.serve_cmd[0]
        if shutil.which(program) is None:
            if os.sep in program:  # a path: which() found no executable file there
                raise AutotuneError(f"serve command {program!r} is not an executable file")
            fix = "install vLLM or pass --serve-cmd" if program == "vllm" else "give its full path"
            raise AutotuneError(f"serve command {program!r} not found on PATH: {fix}")

    def session(
        self, config: EngineConfig, gpu_ids: Sequence[int] = (), trial_dir: Path | None = None
    ) -> AbstractContextManager[ServerSession]:
        """A server process for `config`, for one or more measurements (see autotune.backends.server)."""
        self.preflight()

        def launch(port: int, log_path: Path) -> _ServerProcess:
            return self._launch(config, port, gpu_ids, log_path)

        command = self.command(config, port=0)
        report = ServerReport(command=tuple(scrub_args(command)))
        env = self._environment(gpu_ids)
        return server_session(launch, config, self._limits, trial_dir, report, env, secret_args(command))

    def command(self, config: EngineConfig, port: int) -> list[str]:
        """The server's argument list (never a shell string)."""
        return [*self.serve_cmd, *config.to_args(), "--port", str(port), "--host", "127.0.0.1"]

    def _environment(self, gpu_ids: Sequence[int | str]) -> dict[str, str]:
        """The inherited environment plus `env`, the GPU type and the GPU pinning (the devices Ray
        assigned the trial's task, as ids of this node)."""
        env = {**os.environ, **self.env, "AUTOTUNE_SIM_GPU": self.gpu}
        if gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
        return env

    def _launch(
        self, config: EngineConfig, port: int, gpu_ids: Sequence[int | str], log_path: Path
    ) -> _ServerProcess:
        env = self._environment(gpu_ids)
        args = self.command(config, port)
        # The devices the trial was pinned to (the ones Ray assigned), first thing in the log.
        pinned = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} " if gpu_ids else ""
        log_path.write_text(f"{LOG_HEADER}{pinned}{' '.join(scrub_args(args))}\n")
        popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,  # copied to the log with secrets masked (a server may echo them)
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: one killpg reaches vLLM's workers too
            preexec_fn=_die_with_parent(os.getpid()),
        )
        copier = threading.Thread(
            target=_copy_scrubbed,
            args=(popen.stdout, log_path, env, secret_args(args)),
            name=f"server-log-{popen.pid}",
            daemon=True,
        )
        copier.start()
        api_key = server_api_key(args, env)
        return _ServerProcess(popen, f"http://127.0.0.1:{port}", log_path, self.stop_grace_s, copier, api_key)


class _ServerProcess:
    """A running server process group (the ServerHandle of the `vllm` backend)."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        base_url: str,
        log_path: Path,
        grace_s: float,
        copier: threading.Thread | None = None,
        api_key: str | None = None,
    ) -> None:
        self.popen = popen
        self.base_url = base_url
        self.log_path = log_path
        self.grace_s = grace_s
        self.copier = copier
        self.api_key = api_key  # the key its command or environment requires

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def log_text(self) -> str:
        return read_tail(self.log_path)

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL it after the grace period, and reap the leader (no zombie)."""
        try:
            if self.popen.poll() is None:
                _signal_group(self.popen.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(self.grace_s)
        finally:
            # Always: workers the leader left behind in its group die too, even on a second Ctrl-C.
            _signal_group(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
            if self.copier is not None:
                self.copier.join(timeout=COPIER_JOIN_S)  # the log's last lines (the pipe is at EOF)


def _copy_scrubbed(stream: Any, log_path: Path, env: Mapping[str, str], secrets: Sequence[str]) -> None:
    """Append the server's output to its log line by line, with secrets masked, until it closes."""
    with stream, log_path.open("ab") as log:
        for line in iter(stream.readline, b""):
            log.write(scrub(line.decode("utf-8", errors="replace"), env, secrets).encode())
            log.flush()  # the log is read while the server runs (classification, tails)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(pgid, sig)


def _die_with_parent(parent_pid: int) -> Any:
    """A preexec_fn: the server gets SIGKILL when the thread that started it dies (e.g. a Ray worker
    force-cancelled with SIGKILL), so no server outlives its trial. Linux only; None elsewhere."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork: dlopen is not fork-safe
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec
