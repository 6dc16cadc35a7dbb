"""The Ray executor's faults (real local Ray): a dead node or worker named and charged the GPU time it
held, with where it ran; a trial that finds its Docker engine gone stops the run."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import ray.cloudpickle
import ray.exceptions
from optuna.trial import TrialState
from test_executor import FIXED_LOAD, MODEL, OBJECTIVES, SleepBackend, drain

from autotune.backends.docker_engine import EngineLost
from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.dispatch.executor import Executor
from autotune.dispatch.ray_cluster import lost_node
from autotune.measure.result import TrialResult
from autotune.tune.run_records import TunerOptions
from autotune.tune.space import space_from_dict
from autotune.tune.study import StudySettings
from autotune.tune.study_open import sqlite_url, start_study
from autotune.tune.tuner import Tuner
from autotune.workloads.files import load_workload

# Ray workers cannot import this test module: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_a_dead_node_is_recognised_whichever_error_ray_reports() -> None:
    """A node killed under a task reaches the driver as NodeDiedError (naming it) or, when the task's
    raylet went first, as LocalRayletDiedError (naming none): both are a lost node, a crash is not."""
    named = lost_node(
        ray.exceptions.NodeDiedError("Node IP: 10.0.0.5, node ID: 92e3c9a8ff00 ... died unexpectedly")
    )
    assert named is not None and named.describe() == "node 10.0.0.5 (Ray node 92e3c9a8)"
    unnamed = lost_node(ray.exceptions.LocalRayletDiedError())
    assert unnamed is not None and unnamed.describe() == "its node"
    assert lost_node(ray.exceptions.WorkerCrashedError()) is None


def test_a_crash_whose_error_names_no_node_is_told_with_the_lost_node_it_ran_on() -> None:
    """LocalRayletDiedError names no node: the trial gets the one node it could have run on that is
    lost (here dropped, as when another trial's NodeDiedError named it), not "its node"."""
    executor = Executor(SleepBackend(60.0), FIXED_LOAD, [], uses_gpus=True)
    executor.submit(0, EngineConfig(model="m"), 0, None)
    job = executor._jobs[0]
    (node_id,) = job.nodes  # the session's one node with (fake) GPUs
    assert executor._inventory.dead_among(job.nodes) == []  # live: nothing to name yet
    executor._inventory.drop(node_id)
    result = executor._crash_result(job, ray.exceptions.LocalRayletDiedError())
    assert result.placement is not None and result.placement.node_id == node_id
    assert f"(Ray node {node_id[:8]}) was lost mid-trial" in result.message
    executor.cancel_all()


def test_a_killed_worker_or_a_timeout_keeps_its_gpu_time_and_where_it_ran(tmp_path: Path) -> None:
    """A trial whose worker was SIGKILLed (the OOM killer) or that passed its deadline returns nothing:
    it is charged the time it held its GPUs and keeps the node and devices its task told at its start."""
    executor = Executor(SleepBackend(60.0, meet=str(tmp_path), meet_count=1), FIXED_LOAD, [], uses_gpus=True)
    executor.submit(0, EngineConfig(model="m", tensor_parallel_size=2), 0, None)
    submitted = time.monotonic()  # after submit, which starts the trial's clock: held is a lower bound
    deadline = time.monotonic() + 60
    while not list(tmp_path.iterdir()) and time.monotonic() < deadline:  # the task is in its trial
        time.sleep(0.05)
    (worker,) = (int(p.name) for p in tmp_path.iterdir())
    assert executor.placements()[0].gpu_ids == (0, 1)  # what an interrupt now would keep
    os.kill(worker, signal.SIGKILL)
    held = time.monotonic() - submitted
    crashed = drain(executor, 1)[0]
    assert crashed.failure == FailureKind.CRASHED and crashed.gpu_seconds >= held  # per GPU
    assert crashed.placement is not None and crashed.placement.gpu_ids == (0, 1)
    assert crashed.placement.node_id == ray.get_runtime_context().get_node_id()

    executor = Executor(SleepBackend(60.0), FIXED_LOAD, [], uses_gpus=True, trial_timeout_s=1.5)
    executor.submit(1, EngineConfig(model="m"), 0, None)
    late = drain(executor, 1, limit_s=30)[1]
    assert late.failure == FailureKind.BENCHMARK_TIMEOUT and late.gpu_seconds >= 1.5
    assert late.placement is not None and len(late.placement.gpu_ids or ()) == 1


class LosesItsEngine(SimBackend):
    """The simulator, until `after` trials ran (counted in `folder`): then each trial finds its Docker
    engine gone, as DockerBackend raises it."""

    def __init__(self, folder: Path, after: int) -> None:
        super().__init__("H100")
        self.folder, self.after = folder, after

    def evaluate(self, config: EngineConfig, workload: Any, *args: Any, **kwargs: Any) -> TrialResult:
        if len(list(self.folder.iterdir())) >= self.after:
            raise EngineLost("the Docker engine stopped answering mid-trial: gone")
        (self.folder / str(time.monotonic_ns())).touch()
        return super().evaluate(config, workload, *args, **kwargs)


def test_a_trial_that_finds_its_engine_gone_is_not_a_result_and_the_next_wait_raises(
    tmp_path: Path,
) -> None:
    executor = Executor(LosesItsEngine(tmp_path, after=0), FIXED_LOAD, [], cpu_slots=2)
    executor.submit(0, EngineConfig(model="m"), 0, None)
    deadline = time.monotonic() + 30
    while executor.in_flight() and time.monotonic() < deadline:
        assert executor.wait(0.2) == []  # not the config's failure: no result to tell
    assert not executor.in_flight() and not executor.can_start()  # nothing more starts
    with pytest.raises(EngineLost, match="^the Docker engine stopped answering mid-trial: gone$"):
        executor.wait(0.2)


def test_an_engine_lost_mid_run_stops_the_run_in_one_line_its_finished_trials_kept(tmp_path: Path) -> None:
    from autotune.commands.run_end import run_tuner

    (tmp_path / "runs").mkdir()
    space = space_from_dict(
        {
            "fixed": {"model": MODEL, "gpu": "H100", "max_model_len": 8192},
            "params": {"max_num_seqs": {"type": "int", "low": 8, "high": 1024}},
        }
    )
    settings = StudySettings(
        objectives=OBJECTIVES.names,
        directions=OBJECTIVES.directions,
        slos=[],
        model=MODEL,
        gpu="H100",
        workload="chat",
        backend="docker",
    )
    sampler = optuna.samplers.RandomSampler(seed=0)
    study = start_study("lost", sqlite_url(tmp_path), settings, sampler, False, {"max_num_seqs": 256})
    workload = dataclasses.replace(load_workload("chat"), num_requests=20, load="fixed")
    executor = Executor(LosesItsEngine(tmp_path / "runs", after=2), workload, [], cpu_slots=1)
    tuner = Tuner(study, space, OBJECTIVES, [], executor, TunerOptions(n_trials=6, run_dir=tmp_path))
    with pytest.raises(EngineLost) as lost:
        run_tuner(tuner, study, tmp_path, sqlite_url(tmp_path))
    assert str(lost.value).startswith(
        "the Docker engine stopped answering mid-trial: gone; 2 finished trials"
    )
    assert str(lost.value).endswith("the same command with --resume continues")
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL]  # the third: unmeasured


def test_a_store_that_never_answers_holds_the_driver_two_seconds_at_most() -> None:
    """A head that dies between the driver's probe and its read of a trial's placement never answers:
    Ray retried for a minute, and a run whose cluster was stopped took 59 s to stop, not seconds."""
    from autotune.trial import placement_board

    start = time.monotonic()
    assert placement_board._bounded(lambda: time.sleep(60)) is None
    assert time.monotonic() - start < placement_board.STORE_TIMEOUT_S + 2
    assert placement_board._bounded(lambda: "told") == "told"
