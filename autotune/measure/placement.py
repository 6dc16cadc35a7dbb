"""Where a trial ran: the node Ray placed it on, the devices it was pinned to, and when it ran."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Ray's node id, the node's IP, the devices the trial was pinned to (empty: a CPU slot; None: not
    known, its task died), and its wall-clock interval (None: not known)."""

    node_id: str
    node_ip: str
    gpu_ids: tuple[int | str, ...] | None = ()
    ran_at: tuple[float, float] | None = None  # time.time() at its start and end, for utilization
