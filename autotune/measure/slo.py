"""Latency SLOs: "ttft_p99=2s,itl_p99=50ms" -> [Slo], and each SLO's margin on a result.

A margin is (value - limit) / limit: <= 0 means the SLO holds, which is exactly Optuna's
constraint convention (`trial.set_constraint`), so margins are told to the study as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.core.errors import AutotuneError
from autotune.core.values import shown
from autotune.measure.metrics import GOODPUT_METRICS, LATENCY_METRICS, BenchmarkResult

STATS = ("mean", "median", "p50", "p90", "p95", "p99")
_UNITS_MS = {"ms": 1.0, "s": 1000.0}
_SLO_RE = re.compile(
    r"^(?P<metric>[a-z0-9]+)_(?P<stat>[a-z0-9]+)=(?P<num>-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)(?P<unit>ms|s)$"
)
# vllm bench serve reports both median and p50, the same statistic: an SLO on each would be one SLO twice.
SAME_STAT = {"p50": "median"}
# A limit below a microsecond or above a day cannot be a latency target (nor written back the same way).
MIN_LIMIT_MS = 0.001
MAX_LIMIT_MS = 86_400_000.0


@dataclass(frozen=True)
class Slo:
    """An upper bound on one latency statistic, e.g. p99 TTFT <= 2000 ms."""

    metric: str  # ttft | tpot | itl | e2el
    stat: str  # mean | median | p50 | p90 | p95 | p99
    limit_ms: float

    @property
    def key(self) -> str:
        """The vllm bench serve result key this SLO bounds, e.g. "p99_ttft_ms"."""
        return f"{self.stat}_{self.metric}_ms"

    @property
    def allowed_share(self) -> float | None:
        """The share of samples a percentile SLO lets exceed its limit (0.01 for p99, 0.5 for a
        median); None for a mean."""
        if self.stat == "mean":
            return None
        return 0.5 if self.stat == "median" else 1.0 - float(self.stat[1:]) / 100.0

    @property
    def name(self) -> str:
        """The SLO as the user writes it, e.g. "ttft_p99"."""
        return f"{self.metric}_{self.stat}"

    def margin(self, result: BenchmarkResult) -> float:
        """(value - limit) / limit: <= 0 when the SLO holds."""
        return (result.get(self.key) - self.limit_ms) / self.limit_ms

    def __str__(self) -> str:
        # 15 digits: parse_slo(str(slo)) is the same limit (a study's settings are these strings).
        limit = f"{self.limit_ms / 1000:.15g}s" if self.limit_ms >= 1000 else f"{self.limit_ms:.15g}ms"
        return f"{self.name}={limit}"


def parse_slos(texts: str | Iterable[str]) -> list[Slo]:
    """Parse one or more SLO strings ("ttft_p99=2s,itl_p99=50ms"); raise AutotuneError on bad input.

    An empty SLO and one SLO given twice (median and p50 of one metric included) are errors: which limit
    was meant cannot be guessed.
    """
    if isinstance(texts, str):
        texts = [texts]
    slos: dict[tuple[str, str], tuple[str, Slo]] = {}  # (metric, statistic) -> (as typed, Slo)
    for text in texts:
        for part in text.split(","):
            part = part.strip().replace(" ", "")
            if not part:
                raise AutotuneError(f"empty SLO in {text!r}: expected e.g. ttft_p99=2s,itl_p99=50ms")
            slo = parse_slo(part)
            bound = (slo.metric, SAME_STAT.get(slo.stat, slo.stat))
            if bound in slos:
                raise AutotuneError(_given_twice(*slos[bound], part, slo))
            slos[bound] = (part, slo)
    return [slo for _, slo in slos.values()]


def _given_twice(first_text: str, first: Slo, text: str, slo: Slo) -> str:
    """The error for two SLOs on one statistic, as the user typed them (2s and 2000ms are one limit)."""
    same = "" if first.stat == slo.stat else "; median and p50 are one statistic"
    return f"SLO {first.name} given twice ({first_text} and {text}{same}): keep one"


def parse_slo(text: str) -> Slo:
    """Parse one SLO such as "ttft_p99=2s" (units: s or ms)."""
    match = _SLO_RE.match(text.lower())
    if not match:
        raise AutotuneError(
            f"bad SLO {shown(text, 60)}: expected METRIC_STAT=VALUE with a unit, e.g. ttft_p99=2s or "
            "itl_p99=50ms"
        )
    metric, stat = match["metric"], match["stat"]
    if metric not in LATENCY_METRICS:
        raise AutotuneError(f"bad SLO {shown(text, 60)}: metric must be one of {', '.join(LATENCY_METRICS)}")
    if stat not in STATS:
        raise AutotuneError(f"bad SLO {shown(text, 60)}: statistic must be one of {', '.join(STATS)}")
    limit = float(match["num"]) * _UNITS_MS[match["unit"]]
    if limit <= 0:
        raise AutotuneError(
            f"bad SLO {shown(text, 60)}: the limit must be positive (an upper bound on latency)"
        )
    if not MIN_LIMIT_MS <= limit <= MAX_LIMIT_MS:
        raise AutotuneError(f"bad SLO {shown(text, 60)}: the limit must be between 1 microsecond and 1 day")
    return Slo(metric=metric, stat=stat, limit_ms=limit)


def goodput_bounds(slos: Iterable[Slo]) -> dict[str, float] | None:
    """Per-request bounds in ms for `vllm bench serve --goodput` from the SLOs on ttft/tpot/e2el (the
    tightest per metric), or None when no SLO is one of them."""
    bounds: dict[str, float] = {}
    for slo in slos:
        if slo.metric in GOODPUT_METRICS:
            bounds[slo.metric] = min(slo.limit_ms, bounds.get(slo.metric, slo.limit_ms))
    return bounds or None
