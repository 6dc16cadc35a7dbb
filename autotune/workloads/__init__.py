"""Workloads: a spec (YAML or bundled name) -> a reproducible list of requests."""

from autotune.workloads.files import load_workload
from autotune.workloads.spec import Request, WorkloadSpec, check_fits

__all__ = ["Request", "WorkloadSpec", "check_fits", "load_workload"]
