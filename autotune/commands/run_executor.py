"""Where `autotune run` runs its trials: in process, on a local Ray, or on the cluster at --ray-address."""

from __future__ import annotations

import argparse
from typing import Any

SIM_TRIAL_TIMEOUT_S = 600.0
# A real trial's own limits are the backend's (startup 600 s, benchmark 1800 s); the executor's deadline
# is the safety net above them.
REAL_TRIAL_TIMEOUT_S = 2700.0


def open_executor(args: argparse.Namespace, s: Any) -> tuple[Any, Any]:
    """(executor, the RaySession to close, None without one) for the checked inputs `s` (run._Setup): a
    simulated run on this host runs its trials in process (--parallel 1) or on worker processes (no Ray
    start, no Ray notices); one with GPUs (virtual ones too) or --ray-address runs Ray tasks on a local
    cluster or the one at --ray-address. --parallel N: at most N trials at once, on GPUs too (default: as
    many as the GPUs take; a simulated run's default is DEFAULT_PARALLEL)."""
    from autotune.commands.run_options import DEFAULT_PARALLEL
    from autotune.core.errors import AutotuneError
    from autotune.dispatch.executor import Executor
    from autotune.dispatch.local import LocalExecutor
    from autotune.dispatch.processes import ProcessExecutor
    from autotune.dispatch.ray_cluster import gpus_found, start_ray

    sim = args.backend == "sim"
    parallel = args.parallel or DEFAULT_PARALLEL
    if sim and not s.gpu_ids and not args.ray_address:
        if parallel == 1:
            return LocalExecutor(s.backend, s.workload, s.slos), None
        return ProcessExecutor(s.backend, s.workload, s.slos, in_flight=parallel), None
    uses_gpus = not sim or bool(s.gpu_ids)
    fake_gpus = None  # the simulator's GPUs are virtual: a local Ray cluster gets that many fake ones
    if s.backend.simulated and uses_gpus:
        fake_gpus = len(s.gpu_ids) or 1
    # A local cluster sees only the --gpus devices (a count N: devices 0..N-1), so Ray assigns those.
    devices = (s.gpu_ids or None) if uses_gpus else None
    session = start_ray(args.ray_address, parallel, fake_gpus, devices)
    local = session is not None and not args.ray_address  # a cluster it started: this machine's GPUs
    timeout = args.trial_timeout or (SIM_TRIAL_TIMEOUT_S if sim else REAL_TRIAL_TIMEOUT_S)
    if s.workload.load == "capacity":
        from autotune.trial.capacity import MAX_PROBES, MAX_WINDOWS

        # the saturation run and every window of every probe
        timeout *= MAX_PROBES * MAX_WINDOWS + 1 if not args.trial_timeout else 1
    try:
        executor = Executor(
            s.backend,
            s.workload,
            s.slos,
            uses_gpus=uses_gpus,
            gpu_cap=len(s.gpu_ids) or None,
            cpu_slots=parallel,
            max_trials=args.parallel if uses_gpus else None,
            trial_timeout_s=timeout,
            local_cluster=local,
        )
        if uses_gpus and executor.capacity == 0:
            raise AutotuneError(f"the {args.backend} backend needs GPUs but {gpus_found(0, local)}")
    except BaseException:
        if session is not None:
            session.close()
        raise
    return executor, session


def busy_gpus(executor: Any) -> int:
    """The GPUs the run keeps busy at most, for its estimate: the executor's capacity, or, with
    --parallel N on GPUs, N (a trial of one GPU each: a conservative count for larger ones)."""
    cap = executor.max_trials
    return executor.capacity if cap is None else min(executor.capacity, cap)
