"""A workload's digest: what a resumed study checks its trials' requests are drawn from (as
SearchSpace.digest does for the flags). The guide's cache keys by the workload's content likewise."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from autotune.workloads.spec import WorkloadSpec

# The study records the name and the load as settings of their own (--load overrides the file's), a
# description changes no request, and measure_from is a capacity probe's, never a file's.
_NOT_CONTENT = ("name", "description", "load", "measure_from")


def workload_digest(workload: WorkloadSpec) -> str:
    """A short hash of what the workload sends: its request count, seed, lengths, arrivals and shared
    prefixes, and the content (not the path) of a trace or JSONL file it reads."""
    content: dict[str, Any] = dataclasses.asdict(workload)
    for key in _NOT_CONTENT:
        content.pop(key)
    if workload.jsonl is not None:
        content["jsonl"] = _file_digest(workload.jsonl)
    if workload.trace is not None:
        content["trace"]["name"] = _file_digest(workload.trace.path)
    text = json.dumps(content, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _file_digest(path: Path) -> str:
    """The file's content hash; its path when it cannot be read (load_workload read it already)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return str(path)
