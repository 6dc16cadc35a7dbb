"""Measuring a server: the load generator, vllm bench serve's metrics, SLOs and the evidence that
a window meets them, steady state, early abort, and the TrialResult record with its typed parts
(server report, load report, capacity report, placement)."""

from autotune.measure.capacity_report import CapacityReport, ProbeSummary
from autotune.measure.load_report import LoadReport, Saturation, SteadyState
from autotune.measure.loadgen import run_load
from autotune.measure.metrics import BenchmarkResult, RequestRecord, compute_metrics
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.server_report import EngineFacts, ServerReport
from autotune.measure.slo import Slo, parse_slos
from autotune.measure.steady_state import Window, measure_window, plan_window

__all__ = [
    "BenchmarkResult",
    "CapacityReport",
    "EngineFacts",
    "LoadReport",
    "Placement",
    "ProbeSummary",
    "RequestRecord",
    "Saturation",
    "ServerReport",
    "Slo",
    "SteadyState",
    "TrialResult",
    "Window",
    "compute_metrics",
    "measure_window",
    "parse_slos",
    "plan_window",
    "run_load",
]
