"""The simulated vLLM V1 engine: memory model, step costs, API-server model, scheduler, noise, and the
calibration that holds the fitted constants of them all."""

from autotune.sim.calibration import (
    DEFAULT_CALIBRATION,
    Calibration,
    calibration_fields,
    calibration_yaml,
    load_calibration,
)
from autotune.sim.engine import SimEngine
from autotune.sim.memory import MemoryPlan, plan_memory, validate_config
from autotune.sim.noise import NoiseModel, StepNoise
from autotune.sim.replay import SimRun, simulate

__all__ = [
    "DEFAULT_CALIBRATION",
    "Calibration",
    "MemoryPlan",
    "NoiseModel",
    "SimEngine",
    "SimRun",
    "StepNoise",
    "calibration_fields",
    "calibration_yaml",
    "load_calibration",
    "plan_memory",
    "simulate",
    "validate_config",
]
