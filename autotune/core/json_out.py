"""JSON every reader takes: RFC 8259 has no Infinity or NaN, which Python's json writes by default (jq
reads Infinity as 1.797e308, JSON.parse refuses it). A non-finite number is written as `vllm bench serve`
writes an infinite request rate: the string "inf" ("-inf", "nan"), which Python's float() reads back."""

from __future__ import annotations

import json
import math
from typing import Any


def json_text(data: Any, **options: Any) -> str:
    """`json.dumps(data, **options)` with every non-finite float written as its string ("inf")."""
    return json.dumps(_finite(data), allow_nan=False, **options)


def _finite(value: Any) -> Any:
    """`value` with its non-finite floats, at any depth of dicts, lists and tuples, as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
