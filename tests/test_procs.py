"""Worker pools for simulations (autotune/core/procs.py): results in order, each job's end heard as it
happens, an error raised at once."""

from __future__ import annotations

import time

import pytest

from autotune.core.procs import map_in_workers


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
