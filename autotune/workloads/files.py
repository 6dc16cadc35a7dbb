"""A workload YAML file (or a bundled one by name) -> WorkloadSpec, every key checked with one clear error.

The schema is documented at the top of workloads/chat.yaml.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.core.bundled import bundled_dir
from autotune.core.errors import AutotuneError
from autotune.core.inputs import not_a_directory, read_yaml
from autotune.core.values import MAX_TOKENS, bounded_int, finite_number, positive_int, rate, seed, token_count
from autotune.workloads.lengths import DISTS, LengthDist
from autotune.workloads.spec import MAX_REQUESTS, WorkloadSpec
from autotune.workloads.traces import TRACES, TraceSource


def load_workload(path_or_name: str | Path) -> WorkloadSpec:
    """Load a workload YAML file, or a bundled one by bare name ("chat" -> workloads/chat.yaml)."""
    path = _resolve(path_or_name)
    data = read_yaml(path, "workload")
    if not isinstance(data, dict):
        raise AutotuneError(f"workload {path} must be a YAML mapping of keys to values")
    try:
        spec = spec_from_dict(data, default_name=path.stem, base_dir=path.parent)
        spec.requests()  # read the trace / JSONL now, so a bad file fails here and not mid-study
    except AutotuneError as exc:
        raise AutotuneError(f"{path}: {exc}") from None
    return spec


def _resolve(path_or_name: str | Path) -> Path:
    path = Path(path_or_name)
    if path.is_file():
        return path
    shipped = bundled_dir("workloads")
    bundled = shipped / f"{path_or_name}.yaml"
    if path.parent == Path(".") and not path.suffix and bundled.is_file():
        return bundled
    not_a_directory(path, "workload")
    names = ", ".join(sorted(p.stem for p in shipped.glob("*.yaml")))
    raise AutotuneError(
        f"workload {str(path_or_name)!r} not found (a YAML file, or one of: {names or 'none'})"
    )


_TOP_KEYS = {
    "name", "description", "num_requests", "seed", "load", "request_rate", "burstiness", "max_concurrency",
    "prompt_len", "output_len", "trace", "jsonl", "shared_prefix",
}  # fmt: skip
# The keys each length distribution reads: any other would be ignored, and its lengths not what was asked
_DIST_KEYS = {
    "fixed": ("mean", "min", "max"),
    "uniform": ("mean", "range_ratio", "min", "max"),
    "normal": ("mean", "std", "min", "max"),
    "lognormal": ("mean", "median", "sigma", "min", "max"),
}
_LENGTH_KEYS = {"dist"}.union(*_DIST_KEYS.values())
# The key that gives each distribution its spread: left out, it would default to 0 and every length be
# the mean, a fixed workload under another name
_SPREAD_KEY = {"uniform": "range_ratio", "normal": "std", "lognormal": "sigma"}
_TRACE_KEYS = {"name", "arrivals", "time_scale", "start", "max_len"}
_PREFIX_KEYS = {"num_prefixes", "prefix_len"}


def spec_from_dict(
    data: Mapping[str, Any], default_name: str = "workload", base_dir: Path | None = None
) -> WorkloadSpec:
    """Build a WorkloadSpec from the YAML schema; relative file paths resolve against `base_dir`."""
    _check_keys(data, _TOP_KEYS, "workload")
    base = base_dir or Path.cwd()
    max_conc = data.get("max_concurrency")
    prefix = data.get("shared_prefix") or {}
    if not isinstance(prefix, dict):
        raise AutotuneError("shared_prefix must be a mapping with num_prefixes and prefix_len")
    _check_keys(prefix, _PREFIX_KEYS, "shared_prefix")
    jsonl = data.get("jsonl")
    request_rate = rate(data.get("request_rate", math.inf), "request_rate")
    trace = _trace(data["trace"], base) if "trace" in data else None
    _check_trace_rate(trace, request_rate)
    return WorkloadSpec(
        name=str(data.get("name") or default_name),
        description=str(data.get("description") or ""),
        num_requests=_bounded(positive_int(_required(data, "num_requests"), "num_requests"), "num_requests"),
        seed=seed(data.get("seed", 0), "seed"),
        load=str(data.get("load", "fixed")),
        request_rate=request_rate,
        burstiness=finite_number(data.get("burstiness", 1.0), "burstiness", 1e-3, 1e3),
        max_concurrency=None if max_conc is None else positive_int(max_conc, "max_concurrency"),
        prompt_len=_length(data["prompt_len"], "prompt_len") if "prompt_len" in data else None,
        output_len=_length(data["output_len"], "output_len") if "output_len" in data else None,
        trace=trace,
        jsonl=None if jsonl is None else base / str(jsonl),
        num_prefixes=bounded_int(prefix.get("num_prefixes", 0), "num_prefixes", 0, MAX_REQUESTS),
        prefix_len=bounded_int(prefix.get("prefix_len", 0), "prefix_len", 0, MAX_TOKENS),
    )


def _length(value: Any, what: str) -> LengthDist:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return LengthDist("fixed", mean=token_count(value, what))
    if not isinstance(value, dict):
        raise AutotuneError(f"{what} must be a token count or a mapping with dist: {'|'.join(DISTS)}")
    _check_keys(value, _LENGTH_KEYS, what)
    if "dist" not in value:
        raise AutotuneError(f"{what} needs dist: one of {', '.join(DISTS)}")
    _check_dist_keys(value, what)
    median = value.get("median")
    try:
        return LengthDist(
            dist=str(value["dist"]),
            mean=finite_number(value.get("mean", 0.0), f"{what}.mean"),
            median=None if median is None else finite_number(median, f"{what}.median"),
            range_ratio=finite_number(value.get("range_ratio", 0.0), f"{what}.range_ratio"),
            std=finite_number(value.get("std", 0.0), f"{what}.std"),
            sigma=finite_number(value.get("sigma", 0.0), f"{what}.sigma"),
            min=token_count(value.get("min", 1), f"{what}.min"),
            max=None if value.get("max") is None else token_count(value["max"], f"{what}.max"),
        )
    except AutotuneError as exc:
        raise AutotuneError(f"{what}: {exc}") from None


def _check_dist_keys(value: Mapping[str, Any], what: str) -> None:
    """Refuse a length key its dist does not read (lognormal std, normal sigma), a spread left out
    (every length would be the mean) and a lognormal mean given with its median (which wins): each
    would leave lengths other than the file says."""
    dist = str(value["dist"])
    keys = _DIST_KEYS.get(dist)
    if keys is None:
        return  # an unknown dist: LengthDist names the known ones
    stray = [str(key) for key in value if key != "dist" and key not in keys]
    if stray:
        verb = "does" if len(stray) == 1 else "do"
        raise AutotuneError(
            f"{what}: {', '.join(stray)} {verb} not apply to {dist} (its keys: {', '.join(keys)})"
        )
    spread = _SPREAD_KEY.get(dist)
    if spread is not None and spread not in value:
        raise AutotuneError(
            f"{what}: {dist} needs {spread} (its spread; without it every length is the mean: "
            f"use dist: fixed for that)"
        )
    if "mean" in value and "median" in value:
        raise AutotuneError(f"{what}: give a lognormal its mean or its median, not both")


def _trace(value: Any, base: Path) -> TraceSource:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or "name" not in value:
        raise AutotuneError(f"trace must be {' or '.join(TRACES)}, a CSV path, or a mapping with name:")
    _check_keys(value, _TRACE_KEYS, "trace")
    name = str(value["name"])
    max_len = value.get("max_len")
    return TraceSource(
        name=name if name in TRACES else str(base / name),
        arrivals=str(value.get("arrivals", "trace")),
        time_scale=finite_number(value.get("time_scale", 1.0), "trace.time_scale", 1e-3, 1e3),
        start=finite_number(value.get("start", 0.0), "trace.start"),
        max_len=None if max_len is None else positive_int(max_len, "trace.max_len"),
    )


def _check_trace_rate(trace: TraceSource | None, request_rate: float) -> None:
    """Refuse a replay's time_scale with a finite request_rate: the rate sets the replay's mean rate
    whatever the scale, so the file's time_scale would have no effect (`bench --rate` overrides both)."""
    if trace is None or trace.arrivals != "trace" or trace.time_scale == 1 or math.isinf(request_rate):
        return
    raise AutotuneError(
        f"trace.time_scale {trace.time_scale:g} with request_rate {request_rate:g}: the rate rescales the "
        "replayed times to its mean rate, so time_scale would have no effect; give one of them"
    )


def _required(data: Mapping[str, Any], key: str) -> Any:
    if data.get(key) is None:
        raise AutotuneError(f"missing required key {key}")
    return data[key]


def _check_keys(data: Mapping[str, Any], known: set[str], what: str) -> None:
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise AutotuneError(
            f"unknown key(s) in {what}: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )


def _bounded(count: int, what: str) -> int:
    """A count every trial replays in full: more than MAX_REQUESTS would not fit in memory."""
    if count > MAX_REQUESTS:
        raise AutotuneError(f"{what} must be <= {MAX_REQUESTS:,}, got {count:,}")
    return count
