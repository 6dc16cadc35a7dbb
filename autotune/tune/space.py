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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.catalog.models import qualified_name
from autotune.core.config import (
    ENGINE_FLAGS,
    OTHER_FLAG_DEFAULTS,
    OTHER_VLLM_FLAGS,
    POSITIVE_INT_FLAGS,
    EngineConfig,
    flag_problem,
    long_prefill_problem,
    partial_prefill_problem,
)
from autotune.core.errors import AutotuneError
from autotune.core.inputs import not_a_directory, read_yaml
from autotune.core.values import shown
from autotune.tune import space_steps as lattice

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_GPU = "H100"
TYPES = ("int", "float", "categorical", "bool")
ENGINE_FIELDS = frozenset({"model", *ENGINE_FLAGS})
KNOWN_FLAGS = ENGINE_FIELDS | OTHER_VLLM_FLAGS
GRID_POINTS = 5  # values per continuous parameter when a grid is asked for
# A stepped range with more values than this gets GRID_POINTS of them (a step of 1 up to 2**31 would be
# 16 GiB of grid, built for every run since the sampler is chosen after it).
MAX_GRID_STEPS = 1000


@dataclass(frozen=True)
class Param:
    """One tuned flag: int/float (low, high, log, step), categorical (choices) or bool."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """Ask an Optuna trial for a value of this parameter."""
        if self.type == "int":
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        if self.type == "float":
            return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)
        return trial.suggest_categorical(self.name, list(self.choices))

    def grid_values(self, max_steps: int | None = None) -> list[Any]:
        """Discrete values for a grid: choices, every step, powers of two (log ints) or a few points.

        `max_steps` thins a stepped range with more values to that many, evenly spaced over its steps
        (both ends kept): gpu_memory_utilization 0.80..0.96 by 0.01 gives 0.80, 0.84, ..., 0.96 at 5.
        """
        if self.type in ("categorical", "bool"):
            return list(self.choices)
        low, high = float(self.low), float(self.high)
        if self.step and (high - low) / self.step < MAX_GRID_STEPS:
            values = list(np.arange(low, high + self.step / 2, self.step))
            if max_steps is not None and len(values) > max_steps:
                picks = np.linspace(0, len(values) - 1, max_steps).round().astype(int)
                values = [values[i] for i in sorted(set(picks))]
        elif self.step:  # every step would be millions of values: a few on the step lattice
            steps = np.linspace(0, math.floor((high - low) / self.step), GRID_POINTS)
            values = list(low + np.round(steps) * self.step)
        elif self.log and self.type == "int":
            values = [2**k for k in range(math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1)]
            values = sorted({int(low), *values, int(high)})
        elif self.log:
            values = list(np.geomspace(low, high, GRID_POINTS))
        else:
            values = list(np.linspace(low, high, GRID_POINTS))
        if self.type == "int":
            return sorted({int(round(v)) for v in values})
        return [round(float(v), 6) for v in values]

    def nearest(self, value: Any) -> Any:
        """`value` if the parameter can take it, else the closest value it can (first choice if unordered)."""
        if self.contains(value):
            return value
        if self.type in ("categorical", "bool"):
            numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in self.choices)
            if numeric and isinstance(value, (int, float)):
                return min(self.choices, key=lambda c: abs(c - value))
            return self.choices[0]
        if self.step:  # Optuna refuses a value off the lattice: the nearest step (a tie goes up)
            return lattice.nearest_on_lattice(value, self.low, self.high, self.step, self.type)
        clipped = min(max(value, self.low), self.high)
        return int(clipped) if self.type == "int" else float(clipped)

    def contains(self, value: Any) -> bool:
        """Whether `value` is one this parameter can take (used to place vLLM's defaults): a stepped
        range's values are low plus whole steps."""
        if self.type in ("categorical", "bool"):
            return value in self.choices
        if value is None or not self.low <= value <= self.high:
            return False
        return not self.step or lattice.on_lattice(value, self.low, self.step, self.type)


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
        _check_flag(name, source)
        _check_value(name, value, f"search space {source}: fixed")
    params = tuple(_param(name, spec, source) for name, spec in raw_params.items())
    both = set(fixed) & {p.name for p in params}
    if both:
        raise AutotuneError(f"search space {source}: {', '.join(sorted(both))} is both fixed and tuned")
    model = qualified_name(str(model))
    return SearchSpace(params=params, fixed=fixed, model=model, gpu=str(gpu), source=source)


def _param(name: str, spec: Any, source: str) -> Param:
    _check_flag(name, source)
    where = f"search space {source}: {name}"
    if name == "model":
        raise AutotuneError(f"{where}: the model is fixed per study (fixed: model or --model)")
    if not isinstance(spec, dict) or "type" not in spec:
        raise AutotuneError(f"{where}: expected a mapping with a type ({', '.join(TYPES)})")
    kind = spec["type"]
    allowed = {"int": {"low", "high", "log", "step"}, "float": {"low", "high", "log", "step"}}
    allowed |= {"categorical": {"choices"}, "bool": set()}
    if kind not in TYPES:
        raise AutotuneError(f"{where}: unknown type {kind!r} (use {', '.join(TYPES)})")
    extra = set(spec) - allowed[kind] - {"type"}
    if extra:
        raise AutotuneError(f"{where}: unknown key(s) {', '.join(sorted(extra))} for type {kind}")
    if kind == "bool":
        return Param(name=name, type="bool", choices=(False, True))
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices or len(set(map(repr, choices))) != len(choices):
            raise AutotuneError(f"{where}: choices must be a non-empty list of distinct values")
        for choice in choices:
            _check_value(name, choice, f"search space {source}")
        return Param(name=name, type="categorical", choices=tuple(choices))
    param = _range_param(name, kind, spec, where)
    values: Sequence[float] = (param.low, param.high)
    if name == "block_size":  # each value (9..15 lie between 8 and 16): the first bad one (<= 257) stops it
        values = range(int(param.low), int(param.high) + 1, int(param.step or 1))
    for value in values:
        _check_value(name, int(value) if kind == "int" else value, f"search space {source}")
    return param


def _range_param(name: str, kind: str, spec: Mapping[str, Any], where: str) -> Param:
    low, high, step = spec.get("low"), spec.get("high"), spec.get("step")
    log = _yaml_bool(spec, "log", where)
    numbers = (int,) if kind == "int" else (int, float)
    if kind == "float" and name in POSITIVE_INT_FLAGS:
        raise AutotuneError(f"{where}: vLLM takes a whole number for this flag: use type: int")
    for label, value in (("low", low), ("high", high), ("step", step)):
        if value is None and label == "step":
            continue
        if not isinstance(value, numbers) or isinstance(value, bool) or not math.isfinite(value):
            raise AutotuneError(
                f"{where}: {label} must be {'an integer' if kind == 'int' else 'a finite number'}"
            )
    if low > high:
        raise AutotuneError(f"{where}: low ({low}) is greater than high ({high})")
    if step is not None and step <= 0:
        raise AutotuneError(f"{where}: step must be a positive {'integer' if kind == 'int' else 'number'}")
    if step is not None and step > high - low and high > low:
        raise AutotuneError(f"{where}: step ({step}) is larger than the range {low}..{high}")
    if log and low <= 0:
        raise AutotuneError(f"{where}: a log range needs low > 0")
    if log and step not in (None, 1):
        raise AutotuneError(f"{where}: log and step cannot be combined")
    if step is not None:
        high = _lattice_high(name, kind, low, high, step, where)
    return Param(name=name, type=kind, low=low, high=high, log=log, step=None if step == 1 and log else step)


def _lattice_high(name: str, kind: str, low: float, high: float, step: float, where: str) -> float:
    """`high` when it is low plus a whole number of steps (a float as the lattice's value, so Optuna sees
    no rounding), else AutotuneError naming the nearest highs vLLM takes."""
    around = lattice.highs_around(low, high, step, kind)
    if around is None:
        return lattice.nearest_on_lattice(high, low, high, step, kind)
    valid = " or ".join(str(v) for v in around if flag_problem(name, v) is None)
    use = f": use {valid}" if valid else ""
    raise AutotuneError(f"{where}: high {high} is not low + a multiple of step {step}{use}")


def _yaml_bool(spec: Mapping[str, Any], key: str, where: str) -> bool:
    """`spec[key]` as a YAML boolean (false when absent): a quoted 'false' or a 2 is refused, since
    truthiness would read either as true."""
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise AutotuneError(f"{where}: {key} must be true or false (a YAML boolean), got {shown(value)}")
    return value


def _check_value(name: str, value: Any, where: str) -> None:
    problem = flag_problem(name, value)
    if problem:
        raise AutotuneError(f"{where}: {problem}")


def _check_flag(name: Any, source: str) -> None:
    if not isinstance(name, str):
        raise AutotuneError(f"search space {source}: {name!r} is not a flag name (vLLM flags are snake_case)")
    if name not in KNOWN_FLAGS:
        hint = " (vLLM flags are snake_case)" if "-" in name else ""
        raise AutotuneError(
            f"search space {source}: unknown parameter {name!r}: not a vLLM flag autotune knows{hint}"
        )


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
