"""Numbers read from user files (workload YAML, JSONL rows): each bad value is one AutotuneError line."""

from __future__ import annotations

import math
from typing import Any

from autotune.core.errors import AutotuneError


def number(value: Any, what: str) -> float:
    """A float; "inf" and YAML's .inf are accepted for unbounded rates."""
    if isinstance(value, bool) or value is None:
        raise AutotuneError(f"{what} must be a number, got {value!r}")
    try:
        checked = float(value)
    except (TypeError, ValueError):
        raise AutotuneError(f"{what} must be a number, got {value!r}") from None
    if math.isnan(checked):
        raise AutotuneError(f"{what} must be a number, got nan")
    return checked


def whole_number(value: Any, what: str) -> int:
    """An integer (3 and 3.0 are; 3.5, inf and true are not)."""
    checked = number(value, what)
    if not math.isfinite(checked) or checked != int(checked):
        raise AutotuneError(f"{what} must be a whole number, got {value!r}")
    return int(checked)


def positive_int(value: Any, what: str) -> int:
    """A whole number >= 1."""
    checked = whole_number(value, what)
    if checked < 1:
        raise AutotuneError(f"{what} must be >= 1, got {value!r}")
    return checked
