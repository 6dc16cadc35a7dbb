"""A trial result's typed parts in the study: its `info` user attr, written at tell, read back once.

The study is the storage boundary. `info_attr` turns a TrialResult's server report, load report,
capacity report and placement into the JSON a trial stores, with the keys (and their order) every study
has had, so old studies resume and their reports read the same; `parse_info` reads them back into the
same records for the report, plots, cost and recommendation. A capacity search's verdict on keeping up
(`kept_up`) replaces its window's in the stored JSON, so a stored capacity trial's window reads the
search's verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.measure.capacity_report import BurstSummary, CapacityReport, ProbeSummary
from autotune.measure.evidence import from_info
from autotune.measure.load_report import LoadReport, Saturation, SteadyState
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.server_report import EngineFacts, ServerReport
from autotune.measure.steady_state import MAX_BACKLOG_GROWTH

INFO_ATTR = "info"
PLACEMENT_ATTRS = ("node_ip", "node_id", "gpu_ids")  # also top-level trial attrs (and trials.csv columns)
# The engine's figures and a probe's are stored under their records' field names, in field order.
_ENGINE_KEYS = tuple(f.name for f in dataclasses.fields(EngineFacts))
# ... except these, stored only when set: most probes have none, and a study's stored probes (best.json
# shows them) keep the keys they had before these fields existed
_PROBE_OPTIONAL = ("unconfirmed",)
_PROBE_KEYS = tuple(f.name for f in dataclasses.fields(ProbeSummary) if f.name not in _PROBE_OPTIONAL)


def info_attr(result: TrialResult) -> dict[str, Any]:
    """The `info` attr of a result: what its server reported, how its load went, whether its failure was
    an earlier measurement's, the capacity search, and where it ran, in that order."""
    out: dict[str, Any] = {}
    if result.server is not None:
        out.update(_server_attr(result.server))
    if result.load is not None:
        out.update(_load_attr(result.load))
    if result.failed_in_earlier_measurement:
        out["failed_in_earlier_measurement"] = True
    if result.capacity is not None:
        out.update(_capacity_attr(result.capacity))  # its `kept_up` replaces the window's, in place
    if result.placement is not None:
        out.update(placement_attr(result.placement))
    return out


def placement_attr(placement: Placement) -> dict[str, Any]:
    """Where and when a trial ran, as stored (`PLACEMENT_ATTRS` are also set on the trial itself)."""
    out: dict[str, Any] = {}
    if placement.ran_at is not None:
        out["ran_at"] = list(placement.ran_at)
    out |= {"node_ip": placement.node_ip, "node_id": placement.node_id}
    if placement.gpu_ids is not None:
        out["gpu_ids"] = list(placement.gpu_ids)
    return out


def placement_attrs(placement: Placement) -> dict[str, Any]:
    """The `PLACEMENT_ATTRS` a trial carries itself (what trials.csv shows)."""
    return {k: v for k, v in placement_attr(placement).items() if k in PLACEMENT_ATTRS}


def _server_attr(server: ServerReport) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if server.image is not None:
        out["image"] = server.image
    if server.command is not None:
        out["command"] = list(server.command)
    if server.log_path is not None:
        out["server_log"] = server.log_path
    if server.resolved is not None:
        out["resolved"] = dict(server.resolved)
    if server.engine is not None:
        figures = {name: getattr(server.engine, name) for name in _ENGINE_KEYS}
        # num_gpu_blocks is kept when null (a measured server that did not say); the others when known
        out |= {k: v for k, v in figures.items() if v is not None or k == "num_gpu_blocks"}
    return out


def _load_attr(load: LoadReport) -> dict[str, Any]:
    if load.burst:
        sat = load.saturation
        return {"saturation": {"throughput": sat.throughput, "lifetime_s": sat.lifetime_s} if sat else None}
    out: dict[str, Any] = {}
    if load.steady is not None:
        s = load.steady
        out |= {
            "offered_rate": s.offered_rate,
            "served_rate": s.served_rate,
            "backlog_growth": s.backlog_growth,
            "backlog_allowed": s.backlog_allowed,
            "backlog_filling": s.backlog_filling,
            "kept_up": s.kept_up,
        }
    if load.slo_evidence is not None:
        out["slo_evidence"] = {c.name: c.to_info() for c in load.slo_evidence}
    return out


def _capacity_attr(c: CapacityReport) -> dict[str, Any]:
    measured = {
        "measured_request_throughput": c.measured_request_throughput,
        "measured_output_throughput": c.measured_output_throughput,
        "measured_total_token_throughput": c.measured_total_token_throughput,
    }
    out: dict[str, Any] = {name: value for name, value in measured.items() if value is not None}
    out |= {
        "capacity_rate": c.rate,
        "kept_up": c.kept_up,
        "capacity_bracket": list(c.bracket) if c.bracket is not None else None,
        "capacity_resolution": c.resolution,
        "capacity_bound_measured": c.bound_measured,
        "saturation_throughput": c.saturation_throughput,
        "capacity_goodput": c.goodput,
        "capacity_probes": [_probe_attr(p) for p in c.probes],
    }
    if c.stopped_by is not None:
        out["capacity_stopped_by"] = c.stopped_by
    if c.window_s is not None:
        out["capacity_window_s"] = list(c.window_s)
    if c.limited_by is not None:
        out["capacity_limited_by"] = list(c.limited_by)
    if c.bursts:
        out["saturation_bursts"] = [dataclasses.asdict(b) for b in c.bursts]
    return out


def _probe_attr(p: ProbeSummary) -> dict[str, Any]:
    out = {name: getattr(p, name) for name in _PROBE_KEYS}
    out |= {name: _list(getattr(p, name)) for name in ("pooled_with", "short_of")}
    return out | {name: list(getattr(p, name)) for name in _PROBE_OPTIONAL if getattr(p, name)}


def _list(values: tuple[Any, ...] | None) -> list[Any] | None:
    return list(values) if values is not None else None


# --- reading back --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredInfo:
    """A told trial's typed parts, parsed from its attrs (parts a study did not store are None)."""

    server: ServerReport | None = None
    load: LoadReport | None = None
    capacity: CapacityReport | None = None
    placement: Placement | None = None
    failed_in_earlier_measurement: bool = False

    @property
    def kept_up(self) -> bool | None:
        """The stored verdict on keeping up: the capacity search's, else the window's (None: not judged)."""
        if self.capacity is not None:
            return self.capacity.kept_up
        return self.load.kept_up if self.load is not None else None


def parse_info(attrs: Mapping[str, Any]) -> StoredInfo:
    """The typed parts of a trial's user attrs (its `info`, and its placement attrs)."""
    info = attrs.get(INFO_ATTR)
    info = info if isinstance(info, Mapping) else {}
    return StoredInfo(
        server=_server(info),
        load=_load(info),
        capacity=_capacity(info),
        placement=_placement(attrs, info),
        failed_in_earlier_measurement=bool(info.get("failed_in_earlier_measurement")),
    )


def _server(info: Mapping[str, Any]) -> ServerReport | None:
    if not any(k in info for k in ("image", "command", "server_log", "resolved", *_ENGINE_KEYS)):
        return None
    engine = None
    if any(k in info for k in _ENGINE_KEYS):
        engine = EngineFacts(**{k: info.get(k) for k in _ENGINE_KEYS})
    command = info.get("command")
    return ServerReport(
        image=info.get("image"),
        command=tuple(command) if isinstance(command, list) else None,
        log_path=info.get("server_log"),
        resolved=info.get("resolved"),
        engine=engine,
    )


def _load(info: Mapping[str, Any]) -> LoadReport | None:
    if "saturation" in info:
        sat = info["saturation"]
        figures = Saturation(sat["throughput"], sat["lifetime_s"]) if isinstance(sat, Mapping) else None
        return LoadReport(burst=True, saturation=figures)
    steady = None
    if "offered_rate" in info and "served_rate" in info:
        steady = SteadyState(
            offered_rate=info["offered_rate"],
            served_rate=info["served_rate"],
            backlog_growth=info.get("backlog_growth", 0.0),
            backlog_allowed=info.get("backlog_allowed", MAX_BACKLOG_GROWTH),
            backlog_filling=info.get("backlog_filling", 0.0),
            kept_up=bool(info.get("kept_up", True)),
        )
    evidence = info.get("slo_evidence")
    criteria = tuple(from_info(evidence)) if isinstance(evidence, Mapping) else None
    if steady is None and criteria is None:
        return None
    return LoadReport(steady=steady, slo_evidence=criteria)


def _capacity(info: Mapping[str, Any]) -> CapacityReport | None:
    if "capacity_rate" not in info:
        return None
    probes = info.get("capacity_probes") or []
    return CapacityReport(
        rate=info["capacity_rate"],
        kept_up=info.get("kept_up"),
        bracket=_pair(info.get("capacity_bracket")),
        resolution=info.get("capacity_resolution"),
        bound_measured=bool(info.get("capacity_bound_measured")),
        saturation_throughput=info.get("saturation_throughput"),
        goodput=info.get("capacity_goodput"),
        probes=tuple(_probe(p) for p in probes if isinstance(p, Mapping)),
        measured_request_throughput=info.get("measured_request_throughput"),
        measured_output_throughput=info.get("measured_output_throughput"),
        measured_total_token_throughput=info.get("measured_total_token_throughput"),
        stopped_by=info.get("capacity_stopped_by"),
        window_s=_pair(info.get("capacity_window_s")),
        limited_by=_tuple(info.get("capacity_limited_by")),
        bursts=bursts(info),
    )


def bursts(info: Mapping[str, Any]) -> tuple[BurstSummary, ...]:
    """A trial's saturation bursts from its `info` attr (none: not stored, as in studies before them)."""
    stored = info.get("saturation_bursts") or []
    return tuple(
        BurstSummary(int(b["requests"]), int(b["seed"]), {k: float(v) for k, v in b["metrics"].items()})
        for b in stored
        if isinstance(b, Mapping)
    )


def _probe(p: Mapping[str, Any]) -> ProbeSummary:
    fields = {k: p.get(k) for k in _PROBE_KEYS}
    fields["rate"] = float(p.get("rate") or 0.0)
    fields["meets_slos"] = bool(p.get("meets_slos"))
    fields["pooled_with"] = _tuple(p.get("pooled_with"))
    fields["short_of"] = _tuple(p.get("short_of"))
    fields["unconfirmed"] = _tuple(p.get("unconfirmed"))  # None: not stored (none, or an older study)
    return ProbeSummary(**fields)


def _tuple(value: Any) -> tuple[Any, ...] | None:
    """A stored list as a tuple (None: not stored)."""
    return tuple(value) if isinstance(value, list) else None


def _placement(attrs: Mapping[str, Any], info: Mapping[str, Any]) -> Placement | None:
    """Where it ran: the trial's own placement attrs (what trials.csv shows), when it ran: its info."""
    if not any(k in attrs for k in PLACEMENT_ATTRS):
        return None
    gpu_ids = attrs.get("gpu_ids")
    return Placement(
        node_id=attrs.get("node_id") or "",
        node_ip=attrs.get("node_ip") or "",
        gpu_ids=tuple(gpu_ids) if isinstance(gpu_ids, list) else None,
        ran_at=_pair(info.get("ran_at")),
    )


def _pair(value: Any) -> tuple[Any, Any] | None:
    """A stored two-element list as a tuple (None: not stored)."""
    return (value[0], value[1]) if isinstance(value, list) and len(value) == 2 else None
