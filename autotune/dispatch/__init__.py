"""Where trials run: Ray tasks on the cluster's GPUs, or in the driver's process."""

from autotune.dispatch.executor import Executor
from autotune.dispatch.gpus import parse_gpus
from autotune.dispatch.local import LocalExecutor
from autotune.dispatch.protocol import TrialExecutor
from autotune.dispatch.ray_cluster import start_ray

__all__ = ["Executor", "LocalExecutor", "TrialExecutor", "parse_gpus", "start_ray"]
