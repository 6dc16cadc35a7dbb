"""Dispatch trials as Ray tasks, placed by Ray on the cluster's GPUs (a replica's per task), with deadlines.

The driver owns the study; the executor only runs configs. Each trial is a Ray task asking for
`num_gpus` = its config's GPUs (TP x PP x DP, core/config.py `gpus_per_replica`): Ray puts it on one node
with that many free GPUs and the task pins the devices Ray assigned (autotune/trial/task.py), so no two
trials share a device, on one machine or many. The driver only counts: at most as many GPUs in flight
as the live nodes have (`--gpus N` caps that), and a config larger than the largest node is refused
before launch. The simulator needs no GPU: its trials take one CPU slot each (`--parallel N`), or fake
GPUs when `--gpus N` is given so TP placement is exercised; a run of one simulated trial at a time needs
no Ray at all (autotune/dispatch/local.py).

Faults: a trial past its deadline is cancelled (forced) and becomes a benchmark_timeout failure; a task
that dies becomes a crash, and one whose node died names the node and takes the node's GPUs out of the
count. A trial cut short so (or past its deadline, or by Ctrl-C) is charged the time it held its GPUs
and keeps the node and devices its task told at its start (trial/placement_board.py). When the cluster's
head stops answering, or no GPU is left, `wait` raises ClusterLost: the run
stops, and what finished is in the study. So does a trial that raised SetupLost (its Docker engine gone):
`wait` raises it once the trials that finished beside it are returned.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend
from autotune.core.config import EngineConfig, gpus_per_replica, parallel_text
from autotune.core.errors import AutotuneError, FailureKind, SetupLost
from autotune.core.values import counted
from autotune.dispatch.head_watch import HEAD_GONE, NO_GPU_LEFT, HeadWatch
from autotune.dispatch.ray_cluster import ClusterLost, Inventory, LostNode, gpus_found, lost_node
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.trial import placement_board
from autotune.trial.task import SearchPlan, land, run_trial_task
from autotune.workloads.spec import WorkloadSpec

__all__ = ["ClusterLost", "Executor"]

CANCEL_GRACE_S = 5.0  # a polite cancel first (backends tear their server down), then a forced one
REAP_WAIT_S = 2.0  # after a forced cancel, how long the killed trial's container may take to be an orphan
# How long a crash whose error names no node waits for Ray to mark one of its possible nodes dead
# (Ray's default detection: 5 missed health checks 3 s apart).
NAME_LOST_NODE_S = 20.0


@dataclass
class Job:
    """A trial in flight."""

    number: int
    config: EngineConfig
    slots: int
    ref: Any
    started: float
    trial_dir: Path | None
    nodes: frozenset[str] = frozenset()  # the live nodes with GPUs when it was submitted: it runs on one
    cancel_asked: float | None = None


class Executor:
    """Runs trials on Ray: on the cluster's GPUs (`uses_gpus`, at most `gpu_cap` at once), or on
    `cpu_slots` simulator slots; never more than `max_trials` trials at once (None: no such cap).
    `local_cluster`: the run started that cluster on this machine (its refusals name the machine)."""

    def __init__(
        self,
        backend: Backend,
        workload: WorkloadSpec,
        slos: Sequence[Slo],
        *,
        uses_gpus: bool = False,
        gpu_cap: int | None = None,
        cpu_slots: int = 1,
        max_trials: int | None = None,
        trial_timeout_s: float | None = None,
        local_cluster: bool = False,
    ) -> None:
        import ray

        self._ray = ray
        self.backend = backend
        self.workload = workload
        self.slos = list(slos)
        self.uses_gpus = uses_gpus
        self.trial_timeout_s = trial_timeout_s
        self._cap = gpu_cap if uses_gpus else max(1, cpu_slots)
        self.max_trials = max_trials  # trials in flight at most (--parallel on GPUs), None: as GPUs allow
        self._used = 0
        self._jobs: dict[int, Job] = {}
        self._task = ray.remote(run_trial_task)
        self._inventory = Inventory()
        self._driver_node = _driver_node()
        self._head = HeadWatch()
        self._node_lost: set[int] = set()  # trials of this wait() whose node died
        self._setup_lost: SetupLost | None = None  # what a trial found gone (its engine): the run stops
        if uses_gpus:
            self._inventory.refresh()
            if gpu_cap is not None and gpu_cap > self._inventory.total:
                found = gpus_found(self._inventory.total, local_cluster)
                raise AutotuneError(f"--gpus asks for {gpu_cap} GPU(s) but {found}")

    @property
    def capacity(self) -> int:
        """GPUs (or CPU slots) that may be in use at once: the live nodes' GPUs, capped by --gpus."""
        if not self.uses_gpus:
            return int(self._cap or 1)
        total = self._inventory.total
        return min(total, self._cap) if self._cap is not None else total

    def describe(self) -> str:
        """Where trials run, for the run's first line. A --parallel cap is named only where it binds:
        trials take at least one GPU each, so the GPUs cap them already."""
        capped = self.max_trials is not None and self.max_trials < self.capacity
        at_most = f", at most {counted(self.max_trials, 'trial')} at a time" if capped else ""
        if not self.uses_gpus:
            return f"{self.capacity} CPU slot(s) on Ray{at_most}"
        return f"{self.capacity} GPU(s) on {len(self._inventory.nodes)} Ray node(s), placed by Ray{at_most}"

    def needs(self, config: EngineConfig) -> int:
        """Slots a config takes: its GPUs (TP x PP x DP) on GPUs, one CPU slot for the simulator."""
        return gpus_per_replica(config.params()) if self.uses_gpus else 1

    def misfit(self, config: EngineConfig) -> str | None:
        """Why this config can never run here (more GPUs than the pool, or than every single node), or
        None."""
        need = self.needs(config)
        sizes = parallel_text(config.params())
        if need > self.capacity:
            return f"{sizes} needs {need} GPUs; the pool has {self.capacity}"
        if self.uses_gpus and need > self._inventory.largest:
            return (
                f"{sizes} needs {need} GPUs on one node; the largest node of the Ray cluster has "
                f"{self._inventory.largest}"
            )
        return None

    def fits(self, config: EngineConfig) -> bool:
        """Whether this config could ever run here."""
        return self.misfit(config) is None

    def can_start(self, config: EngineConfig | None = None) -> bool:
        """Whether a trial (of this config, or of one slot) could start now (none once a trial found its
        setup gone: the next `wait` stops the run)."""
        if self.max_trials is not None and len(self._jobs) >= self.max_trials:
            return False
        need = self.needs(config) if config is not None else 1
        return self._setup_lost is None and need <= self.capacity - self._used

    def in_flight(self) -> list[tuple[int, EngineConfig]]:
        """(trial number, config) of the running trials."""
        return [(job.number, job.config) for job in self._jobs.values()]

    def submit(
        self,
        number: int,
        config: EngineConfig,
        seed: int,
        trial_dir: Path | None,
        plan: SearchPlan | None = None,
    ) -> None:
        """Start one trial as a Ray task; Ray places it (the devices are known when it reports back).
        `plan`: what its capacity search starts from and may spend (trial/task.py)."""
        need = self.needs(config)
        if not self.can_start(config):
            raise RuntimeError("submit() without a free slot: call can_start() first")
        trial_dir = Path(trial_dir).resolve() if trial_dir is not None else None  # a path on the driver
        options: dict[str, Any] = {"max_retries": 0}
        options |= {"num_gpus": need, "num_cpus": 0} if self.uses_gpus else {"num_cpus": 1}
        ref = self._task.options(**options).remote(
            self.backend,
            config,
            self.workload,
            self.slos,
            seed,
            trial_dir,
            self._driver_node,
            self.uses_gpus,
            plan,
        )
        self._used += need
        nodes = frozenset(self._inventory.nodes)
        self._jobs[number] = Job(number, config, need, ref, time.monotonic(), trial_dir, nodes)

    def wait(self, timeout: float) -> list[tuple[int, TrialResult]]:
        """Results of the trials that finished (or timed out) within `timeout` seconds.

        Raises ClusterLost when the cluster's head stopped answering, or no GPU is left for a trial;
        the SetupLost a trial raised, at the call after the one that returned the trials beside it.
        """
        if self._head.lost:
            raise ClusterLost(self._head.lost)
        if self._setup_lost is not None:
            raise self._setup_lost
        self._watch()
        done = self._expire()
        if not self._jobs:
            if self._no_gpu_left():
                raise ClusterLost(self._head.lose(NO_GPU_LEFT))
            return done
        refs = {job.ref: job for job in self._jobs.values()}
        ready, _ = self._ray.wait(list(refs), num_returns=1, timeout=0 if done else timeout)
        if ready:
            ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=0)
        self._node_lost.clear()
        for ref in ready:
            job = refs[ref]
            result = self._collect(job)
            if result is not None:  # None: the trial found its setup gone, its config did nothing wrong
                done.append((job.number, result))
        if self._node_lost and (self._no_gpu_left() or not self._head.answers()):
            # Not one node but the whole cluster went: those trials were interrupted, their configs did
            # nothing wrong. Left untold, the run's stop marks them FAIL; the others are told now.
            self._head.lose(NO_GPU_LEFT if self._no_gpu_left() else HEAD_GONE)
            done = [(number, result) for number, result in done if number not in self._node_lost]
        return done

    def placements(self) -> dict[int, Placement]:
        """Where the running trials were placed, as their tasks told it (those not started yet left out;
        nothing once the cluster is gone)."""
        if not self._head.store_answers():
            return {}
        found = {n: placement_board.announced(job.ref) for n, job in self._jobs.items()}
        return {n: placement for n, placement in found.items() if placement is not None}

    def cancel_all(self) -> list[int]:
        """Cancel every running trial (Ctrl-C, or the cluster lost); returns their numbers."""
        numbers = list(self._jobs)
        if self._head.lost:  # nothing to ask a cluster that is gone
            self._jobs.clear()
            self._used = 0
            return numbers
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

    def _watch(self) -> None:
        """Now and then: is the head still there (else ClusterLost), and which nodes are live."""
        if self._head.due() and self._head.check() and self.uses_gpus:
            self._inventory.refresh()  # only of a head that answers: a dead one would hang the call

    def _no_gpu_left(self) -> bool:
        return self.uses_gpus and self.capacity == 0

    def _collect(self, job: Job) -> TrialResult | None:
        """A finished trial's result; None when it raised SetupLost (kept for `wait` to raise)."""
        try:
            output = self._ray.get(job.ref)
        except Exception as exc:  # noqa: BLE001  (the worker died: OOM-killed, cancelled, crashed)
            cause = getattr(exc, "cause", exc)  # a task's own exception, as Ray wraps it
            if isinstance(cause, SetupLost):
                self._setup_lost = self._setup_lost or type(cause)(str(cause))
                self._release(job)
                return None
            if job.cancel_asked is not None:
                result = self._timeout_result(job)
            else:
                result = self._crash_result(job, exc)
        else:
            result = land(output, job.trial_dir)
        self._release(job)  # after the results above: releasing forgets the placement its task told
        return result

    def _crash_result(self, job: Job, exc: BaseException) -> TrialResult:
        """A task that died, charged the time it held its GPUs, where it ran; when its node died, the
        node is named and its GPUs leave the count."""
        node = lost_node(exc)
        if node is None:
            result = TrialResult(config=job.config, failure=FailureKind.CRASHED, message=_one_line(exc))
            return self._cut_short(job, result)
        if not node.node_id:
            node = self._name_lost_node(job) or node
        self._node_lost.add(job.number)
        message = f"{node.describe()} was lost mid-trial (its Ray node died); the run goes on without it"
        result = TrialResult(config=job.config, failure=FailureKind.CRASHED, message=message)
        if node.node_id:  # else the inventory drops it once Ray marks it dead
            self._inventory.drop(node.node_id)
            result.placement = Placement(node.node_id, node.ip, gpu_ids=None)  # unless its task told more
        return self._cut_short(job, result)

    def _cut_short(self, job: Job, result: TrialResult, charged: bool | None = None) -> TrialResult:
        """A trial that ended without a result (crashed, lost, past its deadline): the time it held its
        GPUs is spent (a server per trial holds them from its start: --gpu-hours and the summary count
        it; `charged` None: only then), and its placement is the one its task told, when it had started
        and the cluster's store answers."""
        if charged or (charged is None and self.backend.runs_servers):  # a simulation held no real GPU
            result.benchmark_s = time.monotonic() - job.started
        told = placement_board.announced(job.ref) if self._head.store_answers() else None
        result.placement = told or result.placement
        return result

    def _name_lost_node(self, job: Job) -> LostNode | None:
        """The node a crash came from when Ray's error did not say (LocalRayletDiedError): the one node,
        of those the trial could have run on, that is lost, once Ray's health checks mark it (while the
        head answers; None when none or several)."""
        deadline = time.monotonic() + NAME_LOST_NODE_S
        while job.nodes and self._head.answers():
            dead = self._inventory.dead_among(job.nodes)
            if len(dead) == 1:
                return dead[0]
            if dead or time.monotonic() >= deadline:
                return None
            time.sleep(0.5)
        return None

    def _timeout_result(self, job: Job) -> TrialResult:
        message = f"trial exceeded its deadline of {self.trial_timeout_s:g} s and was cancelled"
        result = TrialResult(config=job.config, failure=FailureKind.BENCHMARK_TIMEOUT, message=message)
        return self._cut_short(job, result, charged=True)  # on every backend, as it always was

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
            expired.append((job.number, self._timeout_result(job)))
            self._release(job)
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
        from autotune.backends.docker import DockerBackend
        from autotune.backends.docker_engine import reap_orphans

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
        if self._jobs.pop(job.number, None) is not None:
            self._used -= job.slots
            if self._head.store_answers():
                placement_board.forget(job.ref)


def _driver_node() -> str | None:
    """This process's Ray node id: trials on it write logs straight to the driver's disk. None for a
    Ray Client driver (`ray://`), which is on no node of the cluster: every trial ships its logs."""
    import ray
    import ray.util.client

    with contextlib.suppress(Exception):
        if not ray.util.client.ray.is_connected():
            return str(ray.get_runtime_context().get_node_id())
    return None


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[-1][:400] if text else type(exc).__name__
