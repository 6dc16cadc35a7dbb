"""Points no calibration can replay: a config vLLM refuses at startup, or a request it refuses (longer
than max_model_len). Their errors would be nan or -100 % whatever the constants, so the fit leaves them
out and the report names each with its reason (when none is left: "nothing to fit")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.calibrate.points import point_config, point_requests
from autotune.catalog.gpus import get_gpu
from autotune.catalog.models import get_model
from autotune.core.errors import EngineStartupError
from autotune.sim.context import context_problem
from autotune.sim.memory import validate_config


def why_unreplayable(point: dict[str, Any]) -> str | None:
    """Why vLLM would refuse `point`'s config or one of its requests, whatever the constants (None: it
    would not). A step replays its batch alone, and a measured `starts` compares exactly such a refusal."""
    if point["kind"] == "step" or set(point["measured"]) == {"starts"}:
        return None
    gpu, model = get_gpu(point["gpu"]), get_model(point["model"])
    config = point_config(point).with_vllm_defaults(gpu.memory_gib, gpu.name, model.max_position_embeddings)
    try:
        validate_config(config, model)
    except EngineStartupError as exc:
        return f"vLLM refuses its flags: {exc}"
    if point["kind"] != "serve":
        return None
    assert config.max_model_len is not None  # resolved by with_vllm_defaults
    for request in point_requests(point):
        problem = context_problem(config.max_model_len, request.prompt_len, request.output_len)
        if problem is not None:
            return f"vLLM refuses its request {request.request_id}: {problem}"
    return None


def unreplayable(points: Sequence[dict[str, Any]]) -> dict[Any, str]:
    """The ids of the points no calibration can replay, each with its reason."""
    found = {point["id"]: why_unreplayable(point) for point in points}
    return {pid: why for pid, why in found.items() if why is not None}
