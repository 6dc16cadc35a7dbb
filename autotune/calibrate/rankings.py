"""Ranking checks of a points file, and the sources it leaves out of the fit.

A ranking check (`rankings:` in a points file) compares two points on the same model and GPU that
differ in the flags a tuner searches (TP, the token budget, max_num_seqs): the simulated gain of the
numerator over the denominator against the measured one. What a tuner needs of the simulator is that
gain's sign and size, more than either point's absolute value.

A source marked `fitted: false` (with its `why`) stays in the report but out of the fit: its
measurements contradict independent evidence about the hardware they name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.calibrate.points import Error
from autotune.core.inputs import read_yaml

RANKING_BOUND = 0.10  # |simulated gain / measured gain - 1| a ranking check must stay within


@dataclass(frozen=True)
class Ranking:
    """One ranking check: the measured and simulated gain of one point over another."""

    check: str
    split: str
    flags: str
    simulated: float  # simulated numerator / simulated denominator
    measured: float

    @property
    def error(self) -> float:
        """simulated gain / measured gain - 1."""
        return self.simulated / self.measured - 1.0

    @property
    def sign_agrees(self) -> bool:
        """Both gains on the same side of 1 (a config the tuner should prefer stays preferred)."""
        return (self.simulated - 1.0) * (self.measured - 1.0) > 0

    @property
    def passes(self) -> bool:
        """The sign agrees and the size is within RANKING_BOUND."""
        return self.sign_agrees and abs(self.error) <= RANKING_BOUND


def _data(path: str | Path) -> dict[str, Any]:
    data = read_yaml(Path(path), "points file")
    return data if isinstance(data, dict) else {}


def load_rankings(path: str | Path) -> list[dict[str, Any]]:
    """The ranking checks of a points file (none when it has no `rankings:`)."""
    return list(_data(path).get("rankings") or [])


def unfitted_points(path: str | Path) -> set[str]:
    """Ids of the points whose source is marked `fitted: false` (reported, left out of the fit)."""
    data = _data(path)
    sources = data.get("sources") or {}
    skip = {name for name, src in sources.items() if isinstance(src, dict) and src.get("fitted") is False}
    return {p["id"] for p in data.get("points") or [] if p.get("source") in skip}


def rankings(checks: Iterable[dict[str, Any]], errors: Iterable[Error]) -> list[Ranking]:
    """Each check's simulated and measured gain, from the evaluated points' errors."""
    by_key = {(e.point, e.metric): e for e in errors}
    out = []
    for check in checks:
        num = by_key[(check["numerator"], check["metric"])]
        den = by_key[(check["denominator"], check["metric"])]
        split = "validation" if "validation" in (num.split, den.split) else "train"
        gains = num.simulated / den.simulated, num.measured / den.measured
        out.append(Ranking(check["id"], split, check.get("flags", ""), *gains))
    return out
