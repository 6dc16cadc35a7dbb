"""Where a config sits, for the guide's residual model (tune/guided.py, tune/guide_residual.py): its
flags' places in their grid ranges, and the operating point the guide predicts for it at capacity."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.tune.guide import Prediction
from autotune.tune.space import SearchSpace


def operating_point(prediction: Prediction) -> tuple[float, float]:
    """Where the guide predicts a config runs at its capacity: log of its requests in flight (Little's
    law: request rate x mean E2E latency) and of its step time (median ITL). What the model lacks acts
    through these (a cost per request in the batch, per step), whatever flags set them."""
    m = prediction.metrics
    running = m.get("request_throughput", 0.0) * m.get("mean_e2el_ms", 0.0) / 1000
    return math.log(max(running, 1e-3)), math.log(max(m.get("median_itl_ms", 0.0), 1e-3))


def ranges(points: Sequence[tuple[float, ...]]) -> list[tuple[float, float]]:
    """Per coordinate, the lowest and highest value of `points`."""
    if not points:
        return []
    return [(min(c), max(c)) for c in zip(*points, strict=True)]


def grid_position(values: Sequence[Any], value: Any, log: bool) -> float:
    """`value`'s place in the grid `values`, 0..1: by magnitude for numbers, by index for choices."""
    if len(values) <= 1:
        return 0.0
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi, v = float(min(values)), float(max(values)), float(value)
        if log and lo > 0 and v > 0:
            lo, hi, v = math.log(lo), math.log(hi), math.log(v)
        return min(max((v - lo) / (hi - lo), 0.0), 1.0) if hi > lo else 0.0
    return values.index(value) / (len(values) - 1) if value in values else 0.5


def grid_positions(
    space: SearchSpace, grid: Mapping[str, Sequence[Any]], params: Mapping[str, Any]
) -> list[float]:
    """Each tuned flag's place in its grid range (`grid_position`), in the space's order."""
    return [grid_position(grid.get(p.name, []), params.get(p.name), p.log) for p in space.params]


def flag_weights(
    space: SearchSpace, candidates: Sequence[Prediction], logs: Mapping[str, float], floor: float
) -> dict[str, float]:
    """How much each flag moves the guide's predictions: the spread of the mean log predicted value
    (`logs`, by config key) over the flag's values, relative to the flag that moves it most, floored at
    `floor`. A flag the guide finds inert (block_size on a chat workload) then barely separates two
    configs: one measurement speaks for both. The floor leaves room for what the guide's model lacks."""
    spread = {}
    for param in space.params:
        by_value: dict[Any, list[float]] = {}
        for p in candidates:
            by_value.setdefault(repr(p.params.get(param.name)), []).append(logs[p.key])
        means = [sum(v) / len(v) for v in by_value.values()]
        spread[param.name] = max(means) - min(means) if len(means) > 1 else 0.0
    top = max(spread.values(), default=0.0)
    return {name: max(floor, s / top) if top > 0 else 1.0 for name, s in spread.items()}
