"""A stepped range's lattice (low, low + step, ..., high): whether a value is on it, its nearest value,
and the highs a range may end at. Optuna cuts a range whose high is off its lattice to the last step
below, with a raw warning, and then refuses a baseline value past the cut: a space says so at load.
"""

from __future__ import annotations

import math

# A float is on the lattice within this fraction of a step: 0.85 + 10 * 0.01 is 0.9500000000000001.
TOLERANCE = 1e-6
DIGITS = 10  # lattice floats are rounded to this many decimals (0.8 + 3 * 0.04 reads 0.92)


def lattice_value(low: float, step: float, index: int, kind: str) -> int | float:
    """The lattice's `index`-th value (0 is low), as an int or a rounded float per `kind`."""
    value = low + index * step
    return int(round(value)) if kind == "int" else round(value, DIGITS)


def steps_from_low(value: float, low: float, step: float) -> float:
    """How many steps `value` is above low (a fraction when it is off the lattice)."""
    return (value - low) / step


def on_lattice(value: float, low: float, step: float, kind: str) -> bool:
    """Whether `value` is low plus a whole number of steps (exactly for ints, within TOLERANCE for floats)."""
    if kind == "int" and isinstance(value, int):
        return (value - int(low)) % int(step) == 0
    index = steps_from_low(value, low, step)
    return abs(index - round(index)) <= TOLERANCE


def nearest_on_lattice(value: float, low: float, high: float, step: float, kind: str) -> int | float:
    """The lattice value closest to `value` clipped to low..high; halfway goes up (0.9 in 0.80..0.96 by
    0.04 gives 0.92), since a float's rounding would otherwise pick either side."""
    index = steps_from_low(min(max(value, low), high), low, step)
    last = round(steps_from_low(high, low, step))
    return lattice_value(low, step, min(math.floor(index + 0.5 + TOLERANCE), last), kind)


def highs_around(low: float, high: float, step: float, kind: str) -> tuple[int | float, int | float] | None:
    """None when `high` is on the lattice, else the lattice values just below and just above it."""
    if on_lattice(high, low, step, kind):
        return None
    below = math.floor(steps_from_low(high, low, step))
    return lattice_value(low, step, below, kind), lattice_value(low, step, below + 1, kind)
