"""How a run went against the load it was offered: what `measure_window` says beyond the metrics.

An open-loop run judged over a window reports its steadiness (did the server keep up with the arrivals)
and each SLO's evidence (autotune/measure/evidence.py); an all-at-once burst reports the saturation it
showed. A closed loop (a concurrency cap: no offered rate) or an open run too short to judge has no
report. The figures are rounded as a trial stores them, and the capacity search judges them as stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.measure.evidence import Criterion

DIGITS = 4  # rates and backlog shares, as a trial stores them


@dataclass(frozen=True)
class SteadyState:
    """A measured window's steadiness (autotune/measure/steady_state.py), rounded to DIGITS."""

    offered_rate: float  # requests sent in the window per second
    served_rate: float  # requests finished (successfully) in the window per second
    backlog_growth: float  # growth of the requests in the server beyond filling, per request sent
    backlog_allowed: float  # the growth allowed (MAX_BACKLOG_GROWTH, or the count's own noise)
    backlog_filling: float  # what a server that keeps up still adds as it fills, same unit
    kept_up: bool  # judged before rounding

    def served_share(self) -> float:
        """The share of its arrivals the window served, counting what a filling server still adds."""
        if not self.offered_rate:
            return 1.0
        return self.served_rate / self.offered_rate + self.backlog_filling


@dataclass(frozen=True)
class Saturation:
    """An all-at-once run's saturation figures (autotune/measure/steady_state.py `saturation`)."""

    throughput: float  # requests completed per second while the batch was full
    lifetime_s: float  # mean decode time (E2EL - TTFT): how long a request holds its batch slot


@dataclass(frozen=True)
class LoadReport:
    """What a run says about its load: an open loop's steadiness and SLO evidence, or a burst's
    saturation (None when a burst completed too few requests to tell)."""

    steady: SteadyState | None = None
    slo_evidence: tuple[Criterion, ...] | None = None  # per SLO, rounded as stored; None for a burst
    burst: bool = False
    saturation: Saturation | None = None

    @property
    def kept_up(self) -> bool | None:
        """The window's verdict on keeping up (None: not judged, e.g. a burst)."""
        return self.steady.kept_up if self.steady is not None else None
