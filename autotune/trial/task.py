"""One trial as a Ray task: pin the devices Ray assigned, record where it ran, bring its logs home.

The task runs wherever Ray placed it. It reads the node and the GPUs Ray granted it (the accelerator
ids of its node, already mapped through a CUDA_VISIBLE_DEVICES the node was started with) and hands
those ids to the backend, which pins the server to them. On the driver's own node the trial writes its
logs straight into runs/<study>/trials/<n>/; on any other node it writes them to a temporary folder
and returns their contents with the result, and the driver lands them in that same folder.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autotune.backends.base import Backend
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind, SetupLost
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo
from autotune.trial.placement_board import announce
from autotune.workloads.spec import WorkloadSpec

MAX_SHIPPED_BYTES = 16 << 20  # per file: the tail of a huge server log is the part that explains a failure


@dataclass(frozen=True)
class SearchPlan:
    """What the run asks of one trial's capacity search (trial/capacity.py, CapacitySearch): the rate to
    start from (the guided search's corrected prediction) and the GPU seconds per GPU it may spend (the
    trial's share of --gpu-hours). None: the search's own start, no cap."""

    hint_rate: float | None = None
    max_gpu_s: float | None = None


@dataclass
class TaskOutput:
    """What the task sends back: the result, where and when it ran, and log files written away from the
    driver."""

    result: TrialResult
    placement: Placement
    files: dict[str, bytes] = field(default_factory=dict)


def evaluate_trial(
    backend: Backend,
    config: EngineConfig,
    workload: WorkloadSpec,
    slos: Sequence[Slo],
    seed: int,
    gpu_ids: Sequence[int | str],
    trial_dir: Path | None,
    plan: SearchPlan | None = None,
) -> TrialResult:
    """One trial: a benchmark at the workload's load, or a capacity search as `plan` asks.

    A backend bug must not end the study: any exception becomes an `error` failure with its message,
    but SetupLost (the engine gone: no later trial can run either), which the driver stops the run on.
    """
    try:
        if workload.load == "capacity":
            from autotune.trial.capacity import CapacitySearch, find_capacity

            plan = plan or SearchPlan()
            search = CapacitySearch(hint_rate=plan.hint_rate, max_gpu_s=plan.max_gpu_s)
            return find_capacity(backend, config, workload, slos, seed, gpu_ids, trial_dir, search)  # type: ignore[arg-type]
        return backend.evaluate(config, workload, slos, seed, gpu_ids, trial_dir)  # type: ignore[arg-type]
    except SetupLost:
        raise
    except Exception as exc:  # noqa: BLE001
        return TrialResult(config=config, failure=FailureKind.ERROR, message=f"{type(exc).__name__}: {exc}")


def run_trial_task(
    backend: Backend,
    config: EngineConfig,
    workload: WorkloadSpec,
    slos: Sequence[Slo],
    seed: int,
    trial_dir: Path | None,
    driver_node: str | None,
    uses_gpus: bool,
    plan: SearchPlan | None = None,
) -> TaskOutput:
    """The body of a trial's Ray task (see the module docstring)."""
    placement = current_placement(uses_gpus)
    announce(placement)  # should this task never return, the driver still knows where it ran
    started = time.time()
    files: dict[str, bytes] = {}
    if trial_dir is None or placement.node_id == driver_node:
        result = evaluate_trial(
            backend, config, workload, slos, seed, placement.gpu_ids or (), trial_dir, plan
        )
    else:
        with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
            gpu_ids = placement.gpu_ids or ()
            result = evaluate_trial(backend, config, workload, slos, seed, gpu_ids, Path(tmp), plan)
            files = _read_files(Path(tmp))
    ran_at = (round(started, 3), round(time.time(), 3))  # wall clock, for utilization
    return TaskOutput(result, dataclasses.replace(placement, ran_at=ran_at), files)


def current_placement(uses_gpus: bool) -> Placement:
    """The node this Ray task runs on and the GPUs Ray assigned it (ints where the ids are numbers)."""
    import ray

    context = ray.get_runtime_context()
    gpu_ids: tuple[int | str, ...] = ()
    if uses_gpus:
        assigned = [str(g) for g in context.get_accelerator_ids().get("GPU", [])]
        # Ray hands ids as strings, in no set order; numeric ones (the usual case) become sorted ints
        numeric = all(g.isdigit() for g in assigned)
        gpu_ids = tuple(sorted(int(g) for g in assigned)) if numeric else tuple(assigned)
    return Placement(context.get_node_id(), ray.util.get_node_ip_address(), gpu_ids)


def land(output: TaskOutput, trial_dir: Path | None) -> TrialResult:
    """On the driver: write the shipped files into the trial folder, point the result at them, and
    record where and when it ran in the result."""
    result = output.result
    if trial_dir is not None and output.files:
        trial_dir.mkdir(parents=True, exist_ok=True)
        for name, data in output.files.items():
            (trial_dir / name).write_bytes(data)
        server = result.server
        if server is not None and server.log_path and Path(server.log_path).name in output.files:
            local = str(trial_dir / Path(server.log_path).name)
            result.server = dataclasses.replace(server, log_path=local)
    result.placement = output.placement
    return result


def _read_files(folder: Path) -> dict[str, bytes]:
    """The plain files of a trial folder (the tail of each beyond MAX_SHIPPED_BYTES)."""
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file():
            with path.open("rb") as f:
                size = f.seek(0, 2)
                f.seek(max(0, size - MAX_SHIPPED_BYTES))
                files[path.name] = f.read()
    return files
