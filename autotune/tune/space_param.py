"""One tuned flag of a search space (an entry of its `params:`): its spec read and checked as vLLM
would take it (type, range, a step's lattice, each value), and the values it takes: Optuna's suggestion,
a grid, the nearest one to a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.core.config import (
    ENGINE_FLAGS,
    OTHER_VLLM_FLAGS,
    POSITIVE_INT_FLAGS,
    flag_problem,
    removed_flag_note,
)
from autotune.core.errors import AutotuneError
from autotune.core.values import shown
from autotune.tune import space_steps as lattice

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


def read_param(name: str, spec: Any, source: str) -> Param:
    check_flag(name, source)
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
            check_value(name, choice, f"search space {source}")
        return Param(name=name, type="categorical", choices=tuple(choices))
    param = _range_param(name, kind, spec, where)
    values: Sequence[float] = (param.low, param.high)
    if name == "block_size":  # each value (9..15 lie between 8 and 16): the first bad one (<= 257) stops it
        values = range(int(param.low), int(param.high) + 1, int(param.step or 1))
    for value in values:
        check_value(name, int(value) if kind == "int" else value, f"search space {source}")
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


def check_value(name: str, value: Any, where: str) -> None:
    problem = flag_problem(name, value)
    if problem:
        raise AutotuneError(f"{where}: {problem}")


def check_flag(name: Any, source: str) -> None:
    if not isinstance(name, str):
        raise AutotuneError(f"search space {source}: {name!r} is not a flag name (vLLM flags are snake_case)")
    if name not in KNOWN_FLAGS:
        hint = " (vLLM flags are snake_case)" if "-" in name else removed_flag_note(name)
        raise AutotuneError(
            f"search space {source}: unknown parameter {name!r}: not a vLLM flag autotune knows{hint}"
        )
