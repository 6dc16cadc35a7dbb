"""One trial as a Ray task: pin the devices Ray assigned, record where it ran, bring its logs home.

The task runs wherever Ray placed it. It reads the node and the GPUs Ray granted it (the accelerator
ids of its node, already mapped through a CUDA_VISIBLE_DEVICES the node was started with) and hands
those ids to the backend, which pins the server to them. On the driver's own node the trial writes its
logs straight into runs/<study>/trials/<n>/; on any other node it writes them to a temporary folder
and returns their contents with the result, and the driver lands them in that same folder.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend
from autotune.core.config import EngineConfig
from autotune.core.errors import FailureKind
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo

MAX_SHIPPED_BYTES = 16 << 20  # per file: the tail of a huge server log is the part that explains a failure
PLACEMENT_ATTRS = ("node_ip", "node_id", "gpu_ids")  # trial user attrs (and trials.csv columns)


@dataclass(frozen=True)
class Placement:
    """Where a trial ran: Ray's node id, the node's IP, the devices it was pinned to (empty: CPU slot)."""

    node_id: str
    node_ip: str
    gpu_ids: tuple[int | str, ...] = ()

    def attrs(self) -> dict[str, Any]:
        """The trial user attrs that record it."""
        return {"node_ip": self.node_ip, "node_id": self.node_id, "gpu_ids": list(self.gpu_ids)}


@dataclass
class TaskOutput:
    """What the task sends back: the result, where it ran, and log files written away from the driver."""

    result: TrialResult
    placement: Placement
    files: dict[str, bytes] = field(default_factory=dict)


def evaluate_trial(
    backend: Backend,
    config: EngineConfig,
    workload: Any,
    slos: Sequence[Slo],
    seed: int,
    gpu_ids: Sequence[int | str],
    trial_dir: Path | None,
) -> TrialResult:
    """One trial: a benchmark at the workload's load, or a capacity search.

    A backend bug must not end the study: any exception becomes an `error` failure with its message.
    """
    try:
        if workload.load == "capacity":
            from autotune.trial.capacity import find_capacity

            return find_capacity(backend, config, workload, slos, seed, gpu_ids, trial_dir)  # type: ignore[arg-type]
        return backend.evaluate(config, workload, slos, seed, gpu_ids, trial_dir)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001
        return TrialResult(config=config, failure=FailureKind.ERROR, message=f"{type(exc).__name__}: {exc}")


def run_trial_task(
    backend: Backend,
    config: EngineConfig,
    workload: Any,
    slos: Sequence[Slo],
    seed: int,
    trial_dir: Path | None,
    driver_node: str | None,
    uses_gpus: bool,
) -> TaskOutput:
    """The body of a trial's Ray task (see the module docstring)."""
    placement = current_placement(uses_gpus)
    started = time.time()
    files: dict[str, bytes] = {}
    if trial_dir is None or placement.node_id == driver_node:
        result = evaluate_trial(backend, config, workload, slos, seed, placement.gpu_ids, trial_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
            result = evaluate_trial(backend, config, workload, slos, seed, placement.gpu_ids, Path(tmp))
            files = _read_files(Path(tmp))
    result.info["ran_at"] = [round(started, 3), round(time.time(), 3)]  # wall clock, for utilization
    return TaskOutput(result, placement, files)


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
    record the placement in the result's info."""
    result = output.result
    if trial_dir is not None and output.files:
        trial_dir.mkdir(parents=True, exist_ok=True)
        for name, data in output.files.items():
            (trial_dir / name).write_bytes(data)
        log = result.info.get("server_log")
        if isinstance(log, str) and Path(log).name in output.files:
            result.info["server_log"] = str(trial_dir / Path(log).name)
    result.info.update(output.placement.attrs())
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
