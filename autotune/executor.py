"""Dispatch trials as Ray tasks onto free GPUs (or CPU slots for the simulator), with deadlines.

The driver owns the study; the executor only runs configs. Each trial is a Ray task with
`num_gpus = tensor_parallel_size` and concrete device ids from the pool (`--gpus 0,1,2,3`), so no
two trials share a GPU and never more are in flight than GPUs are free. The simulator needs no GPU:
its trials take one CPU slot each (`--parallel N`), or fake GPUs when `--gpus N` is given so TP
placement is exercised. A trial past its deadline is cancelled (forced) and becomes a
benchmark_timeout failure; a task that dies becomes a crash, never an exception in the driver.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend, FailureKind, TrialResult
from autotune.config import EngineConfig
from autotune.errors import AutotuneError
from autotune.slo import Slo

CANCEL_GRACE_S = 5.0  # a polite cancel first (backends tear their server down), then a forced one
REAP_WAIT_S = 2.0  # after a forced cancel, how long the killed trial's container may take to be an orphan


def evaluate_trial(
    backend: Backend,
    config: EngineConfig,
    workload: Any,
    slos: Sequence[Slo],
    seed: int,
    gpu_ids: Sequence[int],
    trial_dir: Path | None,
) -> TrialResult:
    """One trial, in a Ray worker: a benchmark at the workload's load, or a capacity search.

    A backend bug must not end the study: any exception becomes an `error` failure with its message.
    """
    try:
        if workload.load == "capacity":
            from autotune.capacity import find_capacity

            return find_capacity(backend, config, workload, slos, seed, gpu_ids, trial_dir)
        return backend.evaluate(config, workload, slos, seed, gpu_ids, trial_dir)
    except Exception as exc:  # noqa: BLE001
        return TrialResult(config=config, failure=FailureKind.ERROR, message=f"{type(exc).__name__}: {exc}")


@dataclass
class Job:
    """A trial in flight."""

    number: int
    config: EngineConfig
    slots: tuple[int, ...]
    ref: Any
    started: float
    cancel_asked: float | None = None


def start_ray(address: str | None, num_cpus: int, fake_gpus: int | None = None) -> None:
    """Start (or join) Ray once per run; a cluster already started in this process is reused."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    common: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address:
        try:
            ray.init(address=address, **common)
        except Exception as exc:  # noqa: BLE001
            raise AutotuneError(f"cannot join the Ray cluster at {address}: {exc}") from exc
        return
    ray.init(address="local", num_cpus=num_cpus, num_gpus=fake_gpus, **common)


def cluster_gpus() -> int:
    """GPUs the Ray cluster has (fake ones included)."""
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


class Executor:
    """Runs trials on Ray: a pool of GPU ids (`gpu_ids`), or `cpu_slots` simulator slots."""

    def __init__(
        self,
        backend: Backend,
        workload: Any,
        slos: Sequence[Slo],
        *,
        gpu_ids: Sequence[int] = (),
        cpu_slots: int = 1,
        trial_timeout_s: float | None = None,
    ) -> None:
        import ray

        self._ray = ray
        self.backend = backend
        self.workload = workload
        self.slos = list(slos)
        self.uses_gpus = bool(gpu_ids)
        self._pool = list(gpu_ids) if gpu_ids else list(range(max(1, cpu_slots)))
        self._free = list(self._pool)
        self.trial_timeout_s = trial_timeout_s
        self._jobs: dict[int, Job] = {}
        self._task = ray.remote(evaluate_trial)
        if self.uses_gpus and len(gpu_ids) > cluster_gpus():
            raise AutotuneError(
                f"--gpus asks for {len(gpu_ids)} GPU(s) but the Ray cluster has {cluster_gpus()}"
            )

    @property
    def capacity(self) -> int:
        """GPUs (or CPU slots) in the pool."""
        return len(self._pool)

    def needs(self, config: EngineConfig) -> int:
        """Pool slots a config takes: its TP size on GPUs, one CPU slot for the simulator."""
        return max(1, config.tensor_parallel_size) if self.uses_gpus else 1

    def fits(self, config: EngineConfig) -> bool:
        """Whether the pool could ever hold this config (TP larger than the pool never runs)."""
        return self.needs(config) <= self.capacity

    def can_start(self, config: EngineConfig | None = None) -> bool:
        """Whether a trial (of this config, or of one slot) could start now."""
        need = self.needs(config) if config is not None else 1
        return need <= len(self._free)

    def in_flight(self) -> list[tuple[int, EngineConfig]]:
        """(trial number, config) of the running trials."""
        return [(job.number, job.config) for job in self._jobs.values()]

    def submit(self, number: int, config: EngineConfig, seed: int, trial_dir: Path | None) -> tuple[int, ...]:
        """Start one trial on free slots; returns the GPU ids it got (empty for CPU slots)."""
        need = self.needs(config)
        if need > len(self._free):
            raise RuntimeError("submit() without a free slot: call can_start() first")
        slots = tuple(self._free[:need])
        del self._free[:need]
        gpu_ids = slots if self.uses_gpus else ()
        options: dict[str, Any] = {"max_retries": 0}
        if self.uses_gpus:
            options |= {"num_gpus": need, "num_cpus": 0}
        else:
            options |= {"num_cpus": 1}
        ref = self._task.options(**options).remote(
            self.backend, config, self.workload, self.slos, seed, gpu_ids, trial_dir
        )
        self._jobs[number] = Job(number=number, config=config, slots=slots, ref=ref, started=time.monotonic())
        return gpu_ids

    def wait(self, timeout: float) -> list[tuple[int, TrialResult]]:
        """Results of the trials that finished (or timed out) within `timeout` seconds."""
        done = self._expire()
        if not self._jobs:
            return done
        refs = {job.ref: job for job in self._jobs.values()}
        ready, _ = self._ray.wait(list(refs), num_returns=1, timeout=0 if done else timeout)
        if ready:
            ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            job = refs[ref]
            done.append((job.number, self._collect(job)))
        return done

    def cancel_all(self) -> list[int]:
        """Cancel every running trial (Ctrl-C); returns their numbers."""
        numbers = list(self._jobs)
        # A backend that runs servers gets a polite cancel, so its task tears the server down. An
        # in-process simulation is left to finish within the grace: a cancel racing a task's own end
        # can crash Ray's driver ("Tried to complete task that was not pending").
        if self.backend.runs_servers:
            for job in self._jobs.values():
                self._cancel(job.ref, force=False)
        deadline = time.monotonic() + CANCEL_GRACE_S
        pending = [job.ref for job in self._jobs.values()]
        while pending and time.monotonic() < deadline:
            _, pending = self._ray.wait(pending, num_returns=len(pending), timeout=0.2)
        for ref in pending:
            self._cancel(ref, force=True)
        for job in list(self._jobs.values()):
            self._release(job)
        return numbers

    def _collect(self, job: Job) -> TrialResult:
        self._release(job)
        try:
            return self._ray.get(job.ref)
        except Exception as exc:  # noqa: BLE001  (the worker died: OOM-killed, cancelled, crashed)
            if job.cancel_asked is not None:
                return self._timeout_result(job)
            return TrialResult(config=job.config, failure=FailureKind.CRASHED, message=_one_line(exc))

    def _timeout_result(self, job: Job) -> TrialResult:
        message = f"trial exceeded its deadline of {self.trial_timeout_s:g} s and was cancelled"
        result = TrialResult(config=job.config, failure=FailureKind.BENCHMARK_TIMEOUT, message=message)
        result.benchmark_s = time.monotonic() - job.started
        return result

    def _expire(self) -> list[tuple[int, TrialResult]]:
        if not self.trial_timeout_s or math.isinf(self.trial_timeout_s):
            return []
        now = time.monotonic()
        expired = []
        for job in list(self._jobs.values()):
            if now - job.started <= self.trial_timeout_s:
                continue
            if job.cancel_asked is None:
                job.cancel_asked = now
                self._cancel(job.ref, force=False)
                continue
            if now - job.cancel_asked < CANCEL_GRACE_S:
                continue
            if self._ray.wait([job.ref], timeout=0)[0]:
                continue  # it ended after the polite cancel: collected (as a timeout) by wait()
            self._cancel(job.ref, force=True)
            self._release(job)
            expired.append((job.number, self._timeout_result(job)))
        return expired

    def _cancel(self, ref: Any, force: bool) -> None:
        with contextlib.suppress(Exception):  # already finished: nothing to cancel
            self._ray.cancel(ref, force=force)
        if force:
            self._reap_containers(ref)

    def _reap_containers(self, ref: Any) -> None:
        """A force-killed worker cannot stop its container: remove the containers of dead owners.

        (A `vllm` server process needs nothing: it dies with the worker, see PR_SET_PDEATHSIG.)
        """
        from autotune.backends.docker import DockerBackend, reap_orphans

        if not isinstance(self.backend, DockerBackend):
            return
        # The container's owner must be dead before it counts as an orphan: wait for the kill to land
        # (the task's end can be reported a moment before its worker is gone, on a busy machine).
        with contextlib.suppress(Exception):
            self._ray.wait([ref], timeout=CANCEL_GRACE_S)
        deadline = time.monotonic() + REAP_WAIT_S
        with contextlib.suppress(AutotuneError):  # the engine is unreachable: nothing to reap there
            while not reap_orphans() and time.monotonic() < deadline:
                time.sleep(0.2)  # none yet: the worker may still be dying (or it had no container)

    def _release(self, job: Job) -> None:
        self._jobs.pop(job.number, None)
        self._free.extend(job.slots)
        self._free.sort(key=self._pool.index)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[-1][:400] if text else type(exc).__name__


def parse_gpus(text: str | None) -> list[int]:
    """`--gpus 0,1,2,3` (ids) or `--gpus 4` (a count) -> device ids; AutotuneError on bad input."""
    if not text:
        return []
    text = text.strip()
    try:
        if "," in text:
            ids = [int(part) for part in text.split(",") if part.strip()]
        else:
            count = int(text)
            if count < 1:
                raise ValueError
            ids = list(range(count))
    except ValueError:
        raise AutotuneError(f"bad --gpus {text!r}: expected a count (4) or device ids (0,1,2,3)") from None
    if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
        raise AutotuneError(f"bad --gpus {text!r}: device ids must be distinct and >= 0")
    return ids
