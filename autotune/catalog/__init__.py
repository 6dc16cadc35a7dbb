"""The GPUs and models autotune knows: shapes and specs that the simulator and real-GPU code share."""

from autotune.catalog.gpus import GpuSpec, get_gpu, known_gpus, known_gpus_text
from autotune.catalog.models import (
    ModelSpec,
    get_model,
    known_max_model_len,
    known_models,
    known_models_text,
    load_model,
)

__all__ = [
    "GpuSpec",
    "ModelSpec",
    "get_gpu",
    "get_model",
    "known_gpus",
    "known_gpus_text",
    "known_max_model_len",
    "known_models",
    "known_models_text",
    "load_model",
]
