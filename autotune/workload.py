"""Workloads: a YAML spec -> a reproducible list of Requests (lengths, arrival times, shared prefixes).

CONTRACT (filled in by the workload implementation): see `Request` and `WorkloadSpec` below.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One request to send: its lengths, its arrival time and the prefix it shares with others.

    Requests with the same `prefix_id` share their first `prefix_len` prompt tokens (prefix caching);
    the rest of each prompt is unique to the request.
    """

    request_id: int
    prompt_len: int
    output_len: int
    arrival_time: float = 0.0  # seconds after the start of the run
    prefix_id: int | None = None
    prefix_len: int = 0
