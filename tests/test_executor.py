"""The Ray executor: concurrency, GPU placement by Ray per TP size, deadlines, crashes (real local Ray);
the in-process executor of small simulated runs; joining an unreachable cluster."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray.cloudpickle
import ray.exceptions

from autotune.backends.server import free_port
from autotune.commands.run_executor import busy_gpus, open_executor
from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError, FailureKind
from autotune.dispatch.executor import Executor
from autotune.dispatch.gpus import parse_gpus
from autotune.dispatch.local import LocalExecutor
from autotune.dispatch.processes import ProcessExecutor
from autotune.dispatch.protocol import free_slots
from autotune.dispatch.ray_cluster import check_reachable
from autotune.measure.result import TrialResult
from autotune.tune.objectives import load_objectives
from autotune.workloads.files import load_workload

# Ray workers cannot import this test module: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("ray_cluster")


@dataclass
class SleptResult(TrialResult):
    """A result that also says when the trial ran, on which GPUs, in which process, and whether it met
    the others (`SleepBackend.meet`)."""

    start: float = 0.0
    end: float = 0.0
    seen_gpu_ids: list[int] = field(default_factory=list)
    pid: int = 0
    met: bool | None = None


@dataclass(frozen=True)
class SleepBackend:
    """Sleeps, then reports when it ran, on which GPUs and in which process."""

    seconds: float = 0.5
    boom: bool = False
    runs_servers: bool = True  # as a server backend: Ctrl-C cancels its tasks politely
    meet: str = ""  # a folder: wait (up to 60 s) until `meet_count` tasks have arrived there
    meet_count: int = 2

    def evaluate(
        self,
        config: EngineConfig,
        workload: Any,
        slos: Sequence[Any] = (),
        seed: int = 0,
        gpu_ids: Sequence[int] = (),
        trial_dir: Path | None = None,
    ) -> SleptResult:
        if self.boom:
            raise RuntimeError("backend bug")
        start = time.time()
        met = self._meet() if self.meet else None
        time.sleep(self.seconds)
        return SleptResult(
            config=config,
            benchmark_s=self.seconds,
            start=start,
            end=time.time(),
            seen_gpu_ids=list(gpu_ids),
            pid=os.getpid(),
            met=met,
        )

    def _meet(self) -> bool:
        """True once `meet_count` tasks were here at the same time: proof they ran at once, whatever
        the load (a sleep-overlap check is at the mercy of how fast workers start on a busy host)."""
        folder = Path(self.meet)
        (folder / str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(list(folder.iterdir())) >= self.meet_count:
                return True
            time.sleep(0.05)
        return False


MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OBJECTIVES = load_objectives("default")
FIXED_LOAD = dataclasses.replace(load_workload("chat"), load="fixed")  # the sleeping backend ignores it


def drain(executor: Executor, expected: int, limit_s: float = 60.0) -> dict[int, TrialResult]:
    results: dict[int, TrialResult] = {}
    deadline = time.monotonic() + limit_s
    while len(results) < expected and time.monotonic() < deadline:
        results.update(executor.wait(0.2))
    assert len(results) == expected, results
    return results


def test_cpu_slots_run_trials_concurrently(tmp_path: Path) -> None:
    executor = Executor(SleepBackend(0.1, meet=str(tmp_path)), FIXED_LOAD, [], cpu_slots=2)
    config = EngineConfig(model="m")
    executor.submit(0, config, 0, None)
    assert executor.can_start()
    executor.submit(1, config, 0, None)
    assert not executor.can_start()  # never more in flight than slots
    results = drain(executor, 2, limit_s=120)
    a, b = (results[n] for n in (0, 1))
    assert a.met and b.met  # the two trials were running at the same time
    assert a.pid != b.pid
    assert executor.can_start()


def test_ray_places_trials_by_tensor_parallel_size_and_the_backend_gets_its_devices(tmp_path: Path) -> None:
    executor = Executor(SleepBackend(0.3), FIXED_LOAD, [], uses_gpus=True)
    assert executor.capacity == 2  # counted from the cluster's resources
    tp2 = EngineConfig(model="m", tensor_parallel_size=2)
    assert executor.fits(tp2) and not executor.fits(tp2.replace(tensor_parallel_size=4))
    assert executor.misfit(tp2.replace(tensor_parallel_size=4)) == (
        "tensor_parallel_size 4 needs 4 GPUs; the pool has 2"
    )
    executor.submit(0, tp2, 0, None)
    assert not executor.can_start(EngineConfig(model="m"))  # both GPUs taken
    result = drain(executor, 1)[0]
    assert list(result.placement.gpu_ids) == result.seen_gpu_ids == [0, 1]  # recorded = what it pinned
    assert result.placement.node_id == ray.get_runtime_context().get_node_id() and result.placement.node_ip

    executor = Executor(SleepBackend(0.1, meet=str(tmp_path)), FIXED_LOAD, [], uses_gpus=True)
    one = EngineConfig(model="m")
    executor.submit(1, one, 0, None)
    executor.submit(2, one, 0, None)
    results = drain(executor, 2, limit_s=120)
    a, b = (results[n] for n in (1, 2))
    assert a.met and b.met  # they ran at once...
    assert sorted([a.seen_gpu_ids[0], b.seen_gpu_ids[0]]) == [0, 1]  # ...on a device each


def test_gpus_cap_the_trials_in_flight() -> None:
    executor = Executor(SleepBackend(0.3), FIXED_LOAD, [], uses_gpus=True, gpu_cap=1)
    assert executor.capacity == 1
    assert executor.misfit(EngineConfig(model="m", tensor_parallel_size=2)) == (
        "tensor_parallel_size 2 needs 2 GPUs; the pool has 1"
    )
    # pipeline and data parallelism take GPUs too (one vllm serve with DP 2 runs two engines)
    assert executor.misfit(EngineConfig(model="m").replace(pipeline_parallel_size=2)) == (
        "tensor_parallel_size 1 x pipeline_parallel_size 2 needs 2 GPUs; the pool has 1"
    )
    assert executor.needs(EngineConfig(model="m", tensor_parallel_size=2).replace(data_parallel_size=2)) == 4
    executor.submit(0, EngineConfig(model="m"), 0, None)
    assert not executor.can_start()
    assert len(drain(executor, 1)[0].placement.gpu_ids) == 1


@dataclass(frozen=True)
class ServerSleep(SleepBackend):
    """A real backend's stand-in (`open_executor` runs it on the cluster's GPUs): it sleeps."""

    simulated: bool = False


def gpu_run_executor(parallel: int | None) -> Executor:
    """The executor `autotune run --backend vllm [--parallel N]` opens on the session's Ray."""
    args = argparse.Namespace(backend="vllm", parallel=parallel, ray_address=None, trial_timeout=None)
    setup = SimpleNamespace(backend=ServerSleep(0.3), workload=FIXED_LOAD, slos=[], gpu_ids=[])
    executor, session = open_executor(args, setup)
    assert session is None  # the session's Ray, reused
    return executor


def test_parallel_caps_the_trials_in_flight_on_gpus_too() -> None:
    """--parallel 1 on GPUs: one trial at a time though two GPUs are free; without it, as GPUs allow."""
    one = EngineConfig(model="m")
    executor = gpu_run_executor(parallel=1)
    assert executor.capacity == 2 and busy_gpus(executor) == 1
    assert executor.describe().endswith("placed by Ray, at most 1 trial at a time")
    executor.submit(0, one, 0, None)
    assert not executor.can_start() and not executor.can_start(one) and free_slots(executor, one) == 0
    drain(executor, 1)
    assert executor.can_start(one) and free_slots(executor, one) == 1

    # --parallel 8 on 2 GPUs: the GPUs bind first, so the first line does not promise 8 at a time.
    assert "at most" not in gpu_run_executor(parallel=8).describe()
    executor = gpu_run_executor(parallel=None)
    assert busy_gpus(executor) == 2 and "at most" not in executor.describe()
    executor.submit(1, one, 0, None)
    assert executor.can_start(one) and free_slots(executor, one) == 1
    drain(executor, 1)


def test_deadline_cancels_and_reports_a_timeout() -> None:
    executor = Executor(SleepBackend(60.0), FIXED_LOAD, [], cpu_slots=1, trial_timeout_s=0.5)
    executor.submit(7, EngineConfig(model="m"), 0, None)
    start = time.monotonic()
    result = drain(executor, 1, limit_s=30)[7]
    assert result.failure == FailureKind.BENCHMARK_TIMEOUT and "deadline" in result.message
    assert time.monotonic() - start < 15
    assert executor.can_start()  # the slot came back


def test_backend_exception_is_a_failed_trial() -> None:
    executor = Executor(SleepBackend(boom=True), FIXED_LOAD, [], cpu_slots=1)
    executor.submit(0, EngineConfig(model="m"), 0, None)
    result = drain(executor, 1)[0]
    assert result.failure == FailureKind.ERROR and "backend bug" in result.message


def test_more_gpus_than_the_cluster_is_an_error() -> None:
    with pytest.raises(AutotuneError, match="asks for 4 GPU"):
        Executor(SleepBackend(), FIXED_LOAD, [], uses_gpus=True, gpu_cap=4)


def test_parse_gpus() -> None:
    assert parse_gpus("3") == [0, 1, 2] and parse_gpus("2,5") == [2, 5] and parse_gpus(None) == []
    assert parse_gpus("0") == [0]  # device 0, as CUDA_VISIBLE_DEVICES=0 (no GPUs at all runs nothing)
    for bad in ("x", "1,1", "-1,2"):
        with pytest.raises(AutotuneError, match="bad --gpus"):
            parse_gpus(bad)


def test_local_executor_runs_a_trial_in_process() -> None:
    executor = LocalExecutor(SleepBackend(0.0), FIXED_LOAD, [])
    executor.submit(3, EngineConfig(model="m"), 0, None)
    assert not executor.can_start() and executor.in_flight() == [(3, EngineConfig(model="m"))]
    ((number, result),) = executor.wait(0.5)
    assert number == 3 and result.pid == os.getpid()  # this process: no Ray worker
    assert executor.can_start() and executor.wait(0.1) == []


@dataclass(frozen=True)
class SizedSleep(SleepBackend):
    """Sleeps max_num_seqs / 100 s (after meeting the others): a larger config finishes later."""

    def evaluate(self, config: EngineConfig, *args: Any, **kwargs: Any) -> SleptResult:
        sized = SleepBackend((config.max_num_seqs or 0) / 100, meet=self.meet, meet_count=self.meet_count)
        return sized.evaluate(config, *args, **kwargs)


def test_worker_processes_run_trials_at_once_and_hand_them_back_in_submission_order(tmp_path: Path) -> None:
    executor = ProcessExecutor(SizedSleep(meet=str(tmp_path)), FIXED_LOAD, [], in_flight=2, processes=2)
    try:
        executor.submit(5, EngineConfig(model="m", max_num_seqs=150), 0, None)  # finishes last
        executor.submit(6, EngineConfig(model="m", max_num_seqs=1), 0, None)
        assert not executor.can_start() and [n for n, _ in executor.in_flight()] == [5, 6]
        order: list[tuple[int, TrialResult]] = []
        deadline = time.monotonic() + 120
        while len(order) < 2 and time.monotonic() < deadline:
            order += executor.wait(0.2)
        assert [n for n, _ in order] == [5, 6]  # submission order, though #6 ended first
        first, second = (result for _, result in order)
        assert isinstance(first, SleptResult) and isinstance(second, SleptResult)
        assert first.met and second.met and second.end < first.end
        assert first.pid != second.pid and os.getpid() not in (first.pid, second.pid)
        assert executor.can_start()
    finally:
        executor.close()


def _kill_a_worker(executor: ProcessExecutor) -> None:
    """SIGKILL one worker process of the executor's pool once its trials run (as the OOM killer would)."""
    deadline = time.monotonic() + 60
    while executor._pool is None or not executor._pool._processes:
        assert time.monotonic() < deadline, "no worker started"
        time.sleep(0.05)
    time.sleep(0.5)  # the trials have started
    os.kill(next(iter(executor._pool._processes)), signal.SIGKILL)


def _results(executor: ProcessExecutor, count: int) -> list[tuple[int, TrialResult]]:
    done: list[tuple[int, TrialResult]] = []
    deadline = time.monotonic() + 120
    while len(done) < count and time.monotonic() < deadline:
        done += executor.wait(0.2)
    return done


def test_a_worker_killed_mid_trial_runs_the_trials_it_broke_again_and_twice_fails_them() -> None:
    """A dead worker breaks the pool under every trial in flight: both were told as failed configs
    ("error"), vLLM's defaults among them, though the configs did nothing wrong."""
    executor = ProcessExecutor(SizedSleep(), FIXED_LOAD, [], in_flight=2, processes=2)
    try:
        executor.submit(1, EngineConfig(model="m", max_num_seqs=200), 0, None)
        executor.submit(2, EngineConfig(model="m", max_num_seqs=250), 0, None)
        _kill_a_worker(executor)
        done = _results(executor, 2)
        assert [n for n, _ in done] == [1, 2]
        assert all(isinstance(r, SleptResult) and r.failure is None for _, r in done), done
        executor.submit(3, EngineConfig(model="m", max_num_seqs=200), 0, None)
        _kill_a_worker(executor)
        assert executor.wait(5.0) == []  # run again on new workers ...
        _kill_a_worker(executor)
        ((number, result),) = _results(executor, 1)  # ... and a second death fails it
        assert number == 3 and result.failure == FailureKind.ERROR
        assert result.message.startswith("the worker process running the trial died twice")
    finally:
        executor.close()


def test_cancelling_worker_processes_ends_a_running_trial_at_once(tmp_path: Path) -> None:
    executor = ProcessExecutor(SizedSleep(), FIXED_LOAD, [], in_flight=2, processes=1)
    executor.submit(1, EngineConfig(model="m", max_num_seqs=6000), 0, None)  # a minute of "simulation"
    assert executor.wait(1.0) == []
    start = time.monotonic()
    assert executor.cancel_all() == [1]
    assert time.monotonic() - start < 10 and executor.in_flight() == [] and executor.can_start()


def test_an_unreachable_cluster_fails_in_seconds() -> None:
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(AutotuneError, match=f"nothing answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(AutotuneError, match="nothing answers"):
        check_reachable(f"ray://127.0.0.1:{port}")
    assert time.monotonic() - start < 5


def test_a_small_simulated_run_does_not_start_ray(tmp_path: Path) -> None:
    """A simulated run on this host (default --parallel 2) runs its trials on worker processes: no Ray
    start, none of Ray's notices."""
    script = (
        "import sys; from autotune.cli import main; "
        f"code = main(['run', '--space', 'small', '--n-trials', '3', '--slo', 'ttft_p99=2s', '--quiet', "
        f"'--runs-dir', {str(tmp_path)!r}, '--study', 'small']); "
        "print('ray imported' if 'ray' in sys.modules else 'no ray'); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "no ray"
    where = "2 trials at a time on 2 worker process(es), told in the order they started (no Ray)"
    assert where in done.stderr
    assert "Ray" not in done.stderr.replace("(no Ray)", ""), done.stderr  # no token-auth notice either
    assert (tmp_path / "small" / "trials.csv").stat().st_size > 0


def test_a_local_cluster_runs_trials_at_the_drivers_priority() -> None:
    """Ray runs its workers at nice 15; a trial's load generator and the server it launches ran there,
    behind every other process on the host (docs/gpus.md: they keep normal priority)."""
    script = (
        "import os, ray; from autotune.dispatch.ray_cluster import start_ray; "
        "session = start_ray(None, 1); "
        "print(os.nice(0), ray.get(ray.remote(lambda: os.nice(0)).remote())); session.close()"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    driver, worker = done.stdout.split()[-2:]
    assert worker == driver


@pytest.mark.parametrize(
    ("visible", "ids", "seen"),
    [
        (None, [0, 1], "0,1"),
        ("2,3", [0, 1], "2,3"),  # it was 0,1: the devices the user had left out
        ("2,3", [1], "3"),
        ("GPU-aa, GPU-bb ,GPU-cc", [2, 0], "GPU-cc,GPU-aa"),
    ],
)
def test_gpus_count_among_the_users_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, ids: list[int], seen: str
) -> None:
    from autotune.dispatch.ray_cluster import _visible_devices

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with _visible_devices(ids):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == seen  # what Ray's raylet and workers inherit
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == visible  # then as before


def test_gpus_past_the_users_visible_devices_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.core.errors import AutotuneError
    from autotune.dispatch.ray_cluster import _visible_devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    said = r"--gpus names device 2, but CUDA_VISIBLE_DEVICES=2,3 leaves 2"
    with pytest.raises(AutotuneError, match=said), _visible_devices([0, 1, 2]):
        pass
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
