"""Processes on this host: is an owner (a driver, a worker) still alive? Worker pools for simulations."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def pid_alive(text: str) -> bool:
    """Whether the process `text` names runs. A zombie does not: a worker Ray killed stays one until
    its parent reaps it, which on a busy machine can be after the executor looks."""
    try:
        pid = int(text)
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if not Path("/proc/self/stat").exists():
        return True  # no /proc (not Linux): os.kill said it exists
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False  # reaped since
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask: a container or `taskset` may allow fewer
    than the machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


# The niceness of background workers (the guide's predictions): where cores are short, a vLLM server's
# API and engine-core processes on the same host get the CPU first (docs/gpus.md).
BACKGROUND_NICE = 19


STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


class WorkerPool(ProcessPoolExecutor):
    """A ProcessPoolExecutor whose workers are started with the stop signals blocked (a submit starts
    them): a Ctrl-C that reaches a worker while its interpreter starts, before it can ignore it, would
    kill it and break the pool ("Fatal Python error: init_import_site"). A child inherits the mask
    across exec; the worker unblocks them once ignored, and the driver gets its own at once."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """As ProcessPoolExecutor.submit, any worker it starts holding the stop signals."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return super().submit(fn, *args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def worker_pool(processes: int, background: bool = False) -> ProcessPoolExecutor:
    """Worker processes for CPU-bound work (simulations). Spawned, not forked: the driver has threads
    (a study's lease) whose locks a fork would copy. They ignore Ctrl-C, SIGTERM and SIGHUP, which a
    terminal, `timeout` or a service manager sends the whole process group, from their start
    (WorkerPool): the driver takes them and ends its workers (`end_workers`), so a trial they cut is
    interrupted, not a failed config; a driver killed outright (SIGKILL, the OOM killer) cannot, so each
    worker exits by itself once its parent is gone. `background` workers run at the lowest CPU priority."""
    return WorkerPool(
        max(1, processes),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(os.getpid(), BACKGROUND_NICE if background else 0),
    )


def end_workers(pool: ProcessPoolExecutor) -> None:
    """Stop `pool` now: pending work is dropped and running work killed (its own shutdown would wait
    for the running tasks to finish; the workers ignore SIGTERM, and simulations hold nothing to clean)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.kill()
    for process in workers:
        process.join(timeout=5)


def map_in_workers(
    fn: Callable[..., T],
    jobs: Sequence[tuple[Any, ...]],
    processes: int | None = None,
    done: Callable[[int], None] | None = None,
    background: bool = False,
) -> list[T]:
    """`fn(*job)` for every job, in order: in this process when one process (or one job) is asked
    for, else on a `worker_pool` of `processes` (default: `usable_cpus()`; `background`: at the
    lowest CPU priority), which an error or a Ctrl-C ends at once (`end_workers`). `done(i)` hears of
    job i's end as it happens (for progress), in whatever order the jobs end."""
    processes = processes or usable_cpus()
    if processes <= 1 or len(jobs) <= 1:
        results = []
        for i, job in enumerate(jobs):
            results.append(fn(*job))
            if done is not None:
                done(i)
        return results
    pool = worker_pool(min(processes, len(jobs)), background)
    try:
        futures = [pool.submit(fn, *job) for job in jobs]
        index = {f: i for i, f in enumerate(futures)}
        for future in as_completed(futures):
            future.result()  # an error ends the pool now, not after the jobs before it
            if done is not None:
                done(index[future])
        results = [f.result() for f in futures]
    except BaseException:
        end_workers(pool)
        raise
    pool.shutdown()
    return results


PARENT_CHECK_S = 1.0  # how often a worker looks whether its driver still runs


def _init_worker(parent: int, nice: int) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held since its start: now ignored
    if nice:
        os.nice(nice)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="parent-watch").start()


def _exit_with(parent: int) -> None:
    """Exit this worker once `parent` is gone (it is re-parented: the pool's pipes alone do not wake
    an idle worker whose driver was killed)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)
