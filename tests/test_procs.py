"""Worker pools for simulations (autotune/core/procs.py): results in order, each job's end heard as it
happens, an error raised at once, background workers at the lowest CPU priority."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from autotune.core.procs import BACKGROUND_NICE, end_workers, map_in_workers, usable_cpus, worker_pool


def slow_square(x: int, wait_s: float) -> int:
    time.sleep(wait_s)
    if x < 0:
        raise ValueError(f"negative: {x}")
    return x * x


@pytest.mark.parametrize("processes", [1, 2])
def test_results_come_in_order_and_each_end_is_heard_as_it_happens(processes: int) -> None:
    heard: list[int] = []
    jobs = [(3, 2.0), (4, 0.0), (5, 0.0)]
    assert map_in_workers(slow_square, jobs, processes, heard.append) == [9, 16, 25]
    assert sorted(heard) == [0, 1, 2]
    if processes == 2:
        assert heard[0] != 0  # the long first job ended after a short one beside it


def test_an_error_in_a_worker_is_raised() -> None:
    with pytest.raises(ValueError, match="negative: -1"):
        map_in_workers(slow_square, [(1, 0.0), (-1, 0.0)], 2)


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def test_background_workers_run_at_the_lowest_cpu_priority_and_others_at_the_drivers() -> None:
    """The guide's workers must yield the CPU to a vLLM server on the same host."""
    own = niceness()
    assert map_in_workers(niceness, [(), ()], 2, background=True) == [min(19, own + BACKGROUND_NICE)] * 2
    assert map_in_workers(niceness, [(), ()], 2) == [own, own]


def test_usable_cpus_are_the_cores_the_affinity_mask_allows_not_the_machine_s() -> None:
    """Under `taskset` (or a container's cpuset) the guide must not start a worker per machine core."""
    one_core = min(os.sched_getaffinity(0))
    code = (
        f"import os; os.sched_setaffinity(0, {{{one_core}}}); "
        "from autotune.core.procs import usable_cpus; print(usable_cpus())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"
    assert usable_cpus() == len(os.sched_getaffinity(0))


def test_a_ctrl_c_that_reaches_a_worker_while_it_starts_does_not_kill_it() -> None:
    """A terminal's Ctrl-C goes to the whole process group: one that hit a worker before it could ignore
    it killed it ("Fatal Python error: init_import_site") and broke the pool, and the trials in flight
    were told as failed configs, vLLM's defaults among them."""
    pool = worker_pool(1)
    try:
        future = pool.submit(os.getpid)  # starts the worker: its interpreter takes ~100 ms to come up
        (worker,) = pool._processes.values()
        os.kill(worker.pid, signal.SIGINT)
        assert future.result(timeout=60) == worker.pid
    finally:
        end_workers(pool)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()  # the driver's own mask is as it was
