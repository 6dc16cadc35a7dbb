"""Which of a config's pass-through `vllm serve` flags the simulated engine models.

The engine models EngineConfig's own fields, `enforce_eager` (no CUDA graphs: every step's kernels
launched one by one, no graph memory, nothing captured at startup) and `long_prefill_token_threshold`
(no prefill chunk longer than it: V1's scheduler caps every request's new tokens so, running and
waiting alike, and several requests may then be mid-prefill at once). Concurrent partial prefills
(`max_num_partial_prefills`, `max_long_partial_prefills` other than 1) fail to start, as on vLLM's V1
engine (core/config.py, partial_prefill_problem). Of the other flags a search space
may set (core/config.py, OTHER_VLLM_FLAGS) some change nothing the simulator measures (a seed, a served
name, a load format), and the rest change speed or memory in ways it does not model: at any value but
their neutral one the simulator would serve the config as if they were unset, so such a config is
refused (`unmodelled`) rather than simulated wrongly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.core.config import LONG_PREFILL, EngineConfig

# The flags the engine does not model, each with the values it serves exactly (vLLM's default, or one
# that changes nothing the simulator computes). None stands for "not set".
NEUTRAL: Mapping[str, tuple[Any, ...]] = {
    "pipeline_parallel_size": (None, 1),
    "data_parallel_size": (None, 1),
    "quantization": (None,),
    "dtype": (None, "auto", "bfloat16", "float16", "half"),  # 16-bit: the bf16 models run alike
    "async_scheduling": (None, False),
    "disable_custom_all_reduce": (None, False),
    "cuda_graph_sizes": (None,),
}


def enforce_eager(config: EngineConfig) -> bool:
    """Whether the config turns CUDA graphs off (`--enforce-eager`)."""
    return bool(config.extra.get("enforce_eager", False))


def long_prefill_cap(config: EngineConfig) -> int:
    """The most tokens one request's prefill chunk may take in a step of the resolved `config`: the
    threshold where it is above 0 (vLLM's `0 < threshold < num_new_tokens`), else max_model_len (no
    request is longer)."""
    assert config.max_model_len is not None
    threshold = int(config.extra.get(LONG_PREFILL) or 0)
    return threshold if threshold > 0 else config.max_model_len


def unmodelled(params: Mapping[str, Any]) -> list[str]:
    """The flags of `params` (a config's flags) set to a value the simulated engine does not model, as
    "name=value" (empty: it simulates the config as vLLM would serve it)."""
    return [
        f"{name}={params[name]}"
        for name, neutral in NEUTRAL.items()
        if name in params and params[name] not in neutral
    ]


def refusal(values: Mapping[str, Iterable[Any]], what: str) -> str | None:
    """The line that refuses to simulate `what` (e.g. "search space vllm.yaml") when a flag of `values`
    (each flag's possible values) may take a value the simulated engine does not model; None: none can."""
    found = [hit for name, seen in values.items() for v in seen for hit in unmodelled({name: v})]
    if not found:
        return None
    return (
        f"{what}: the simulated engine does not model {', '.join(dict.fromkeys(found))} (it would serve "
        "the config as if the flag were unset): measure it on a GPU (--backend vllm or docker), or leave "
        "it out"
    )
