"""Measuring a server: the load generator, vllm bench serve's metrics, SLOs and the evidence that
a window meets them, steady state, early abort, and the TrialResult record."""

from autotune.measure.loadgen import run_load
from autotune.measure.metrics import BenchmarkResult, RequestRecord, compute_metrics
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo, parse_slos
from autotune.measure.steady_state import Window, measure_window, plan_window

__all__ = [
    "BenchmarkResult",
    "RequestRecord",
    "Slo",
    "TrialResult",
    "Window",
    "compute_metrics",
    "measure_window",
    "parse_slos",
    "plan_window",
    "run_load",
]
