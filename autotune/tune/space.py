"""Search spaces: a YAML file -> the vLLM flags to tune, the fixed ones, and vLLM's validity rules.

A space file (see search_spaces/vllm.yaml):

    fixed:                      # flags every trial uses (plus `gpu`, which is not a vLLM flag)
      model: meta-llama/Llama-3.1-8B-Instruct
      gpu: H100
      max_model_len: 8192
    params:                     # vLLM's snake_case flag names
      max_num_seqs: {type: int, low: 32, high: 1024, log: true}
      enable_chunked_prefill: {type: bool}
      block_size: {type: categorical, choices: [16, 32]}
      gpu_memory_utilization: {type: float, low: 0.8, high: 0.96, step: 0.01}

The validity rules are vLLM's own startup checks that need no GPU (vllm/config/scheduler.py): they are
checked before anything is launched, and an invalid suggestion is told to the study as a violation.
Each tuned flag (a `params:` entry, its checks and its values) is a Param: tune/space_param.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.catalog.models import qualified_name
from autotune.core.bundled import bundled_dir
from autotune.core.config import (
    OTHER_FLAG_DEFAULTS,
    EngineConfig,
    long_prefill_problem,
    partial_prefill_problem,
)
from autotune.core.errors import AutotuneError
from autotune.core.inputs import not_a_directory, read_yaml
from autotune.tune.space_param import Param, check_flag, check_value, read_param

SPACES_DIR = bundled_dir("search_spaces")
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_GPU = "H100"


@dataclass(frozen=True)
class SearchSpace:
    """The tuned parameters, the fixed flags, the model and the GPU of a study."""

    params: tuple[Param, ...]
    fixed: Mapping[str, Any]
    model: str = DEFAULT_MODEL
    gpu: str = DEFAULT_GPU
    source: str = ""

    @property
    def names(self) -> list[str]:
        """The tuned parameter names, in file order."""
        return [p.name for p in self.params]

    def with_overrides(self, model: str | None = None, gpu: str | None = None) -> SearchSpace:
        """The same space for another model or GPU (the CLI's --model / --gpu)."""
        return SearchSpace(
            params=self.params,
            fixed=self.fixed,
            model=qualified_name(model) if model else self.model,
            gpu=gpu or self.gpu,
            source=self.source,
        )

    def fix(self, name: str, value: Any) -> SearchSpace:
        """The same space with parameter `name` no longer tuned but fixed at `value`."""
        params = tuple(p for p in self.params if p.name != name)
        return dataclasses.replace(self, params=params, fixed={**self.fixed, name: value})

    def suggest(self, trial: Any) -> dict[str, Any]:
        """Sample every parameter on an Optuna trial (a fixed order keeps multivariate TPE's space stable)."""
        return {p.name: p.suggest(trial) for p in self.params}

    def config(self, params: Mapping[str, Any]) -> EngineConfig:
        """The EngineConfig of a trial: fixed flags, then the sampled parameters."""
        values = {**self.fixed, **params}
        return EngineConfig(model=self.model).replace(**plain_params(values))

    def baseline_params(self, gpu_memory_gib: float, max_position_embeddings: int | None) -> dict[str, Any]:
        """vLLM's default value of every tuned parameter for this GPU and model (the baseline trial).

        A default the space does not allow (tensor_parallel_size 1 in a TP 2/4 space for a 70B model)
        takes the nearest allowed value: the baseline is "vLLM's defaults within this space".
        """
        defaults = self._vllm_defaults(gpu_memory_gib, max_position_embeddings)
        return {p.name: p.nearest(defaults[p.name]) for p in self.params if p.name in defaults}

    def moved_defaults(self, gpu_memory_gib: float, max_position_embeddings: int | None) -> dict[str, Any]:
        """vLLM's own default of each tuned parameter the space does not allow, by name: the baseline
        takes the nearest allowed value instead, and its label must say so (tune/front.py)."""
        defaults = self._vllm_defaults(gpu_memory_gib, max_position_embeddings)
        base = self.baseline_params(gpu_memory_gib, max_position_embeddings)
        return {name: defaults[name] for name, value in base.items() if value != defaults[name]}

    def _vllm_defaults(self, gpu_memory_gib: float, max_position_embeddings: int | None) -> dict[str, Any]:
        """vLLM's default of every flag for this GPU and model, the space's fixed flags set."""
        base = self.config({})
        resolved = base.with_vllm_defaults(gpu_memory_gib, self.gpu, max_position_embeddings or 0)
        return {**OTHER_FLAG_DEFAULTS, **resolved.params()}

    def largest(self, name: str) -> Any:
        """The largest value flag `name` takes in this space (fixed or tuned), or None when unset."""
        if name in self.fixed:
            return self.fixed[name]
        param = next((p for p in self.params if p.name == name), None)
        if param is None:
            return None
        return max(param.choices) if param.choices else param.high

    def flag_values(self) -> dict[str, list[Any]]:
        """Each flag's values in this space: a fixed one's value, a tuned one's choices (a range: its
        ends)."""
        values: dict[str, list[Any]] = {name: [value] for name, value in self.fixed.items()}
        for p in self.params:
            values[p.name] = list(p.choices) if p.choices else [p.low, p.high]
        return values

    def digest(self) -> str:
        """A short hash of the flags tuned (with their ranges, steps and scales) and fixed: a resumed
        study must search the same space. A hash, not the values: a fixed flag may be a secret."""
        parts = {p.name: [p.type, p.low, p.high, p.log, p.step, list(p.choices)] for p in self.params}
        text = json.dumps({"params": parts, "fixed": dict(self.fixed)}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def grid(self, max_steps: int | None = None) -> dict[str, list[Any]]:
        """A discrete version of the space for Optuna's GridSampler (`max_steps`: see grid_values)."""
        return {p.name: p.grid_values(max_steps) for p in self.params}


def violations(config: EngineConfig, max_position_embeddings: int | None = None) -> list[str]:
    """vLLM's startup checks that need no GPU, with vLLM's own messages (empty list: valid).

    `max_position_embeddings` gives the default max_model_len when the config sets none; unknown
    (a real model outside the catalog) skips the check that needs it.
    """
    problems = []
    budget, seqs = config.max_num_batched_tokens, config.max_num_seqs
    if budget is not None and seqs is not None and budget < seqs:
        problems.append(
            f"max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs ({seqs})."
        )
    max_len = config.max_model_len or max_position_embeddings
    if not config.enable_chunked_prefill and budget is not None and max_len and budget < max_len:
        problems.append(
            f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_len}). This effectively "
            "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer "
            "sequences. Please increase max_num_batched_tokens or decrease max_model_len."
        )
    problems += [p for p in (long_prefill_problem(config, max_len), partial_prefill_problem(config)) if p]
    utilization = config.gpu_memory_utilization
    if not 0 < utilization <= 1:
        problems.append(f"gpu_memory_utilization must be in (0, 1], got {utilization}.")
    return problems


def load_space(path_or_name: str | Path) -> SearchSpace:
    """Read a search-space YAML file (or a bare name from search_spaces/); AutotuneError on bad input."""
    path = _resolve(path_or_name)
    data = read_yaml(path, "search space")
    if not isinstance(data, dict):
        raise AutotuneError(f"search space {path}: expected a mapping with 'params' (and 'fixed')")
    return space_from_dict(data, source=str(path))


def space_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> SearchSpace:
    """Build a SearchSpace from parsed YAML."""
    unknown_keys = set(data) - {"params", "fixed", "description"}
    if unknown_keys:
        raise AutotuneError(f"search space {source}: unknown section(s) {', '.join(sorted(unknown_keys))}")
    raw_params = data.get("params") or {}
    fixed = data.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise AutotuneError(f"search space {source}: 'fixed' must map vLLM flags to values")
    fixed = dict(fixed)
    if not isinstance(raw_params, dict) or not raw_params:
        raise AutotuneError(f"search space {source}: 'params' must map at least one vLLM flag to its range")
    model = fixed.pop("model", DEFAULT_MODEL)
    gpu = fixed.pop("gpu", DEFAULT_GPU)
    for name, value in fixed.items():
        check_flag(name, source)
        check_value(name, value, f"search space {source}: fixed")
    params = tuple(read_param(name, spec, source) for name, spec in raw_params.items())
    both = set(fixed) & {p.name for p in params}
    if both:
        raise AutotuneError(f"search space {source}: {', '.join(sorted(both))} is both fixed and tuned")
    model = qualified_name(str(model))
    return SearchSpace(params=params, fixed=fixed, model=model, gpu=str(gpu), source=source)


def _resolve(path_or_name: str | Path) -> Path:
    path = Path(path_or_name)
    if path.is_file():
        return path
    if path.suffix == "" and path.parent == Path("."):
        bundled = SPACES_DIR / f"{path.name}.yaml"
        if bundled.is_file():
            return bundled
    not_a_directory(path, "search space")
    raise AutotuneError(f"search space file not found: {path_or_name}")


def plain_params(values: Mapping[str, Any]) -> dict[str, Any]:
    """numpy/Optuna scalars -> Python ones, floats rounded so equal configs compare equal."""
    out = {}
    for name, value in values.items():
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, float):
            value = round(value, 6)
        out[name] = value
    return out
