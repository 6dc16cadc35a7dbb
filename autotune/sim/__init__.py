"""The simulated vLLM V1 engine: memory model, step costs, API-server model, scheduler, noise."""

from autotune.sim.engine import SimEngine
from autotune.sim.memory import MemoryPlan, plan_memory, validate_config
from autotune.sim.noise import NoiseModel, StepNoise
from autotune.sim.replay import SimRun, simulate

__all__ = [
    "MemoryPlan",
    "NoiseModel",
    "SimEngine",
    "SimRun",
    "StepNoise",
    "plan_memory",
    "simulate",
    "validate_config",
]
