"""Evidence: how sure a measured window is that its SLOs hold, so that a rate passes only when they do.

A capacity probe judges a rate from one finite window; a user who then runs the reported rate (another
sample of requests, e.g. 4,000 of them with `vllm bench serve`) sees other values. Judged on point
estimates, the highest rate that passed is a coin flip at the threshold, and a bisection picks the
luckiest one. So each SLO is judged with its standard error:

- a percentile SLO (p99 TTFT <= 2 s) holds when the share of samples over the limit is at most
  1 - p / 100 (1 % for p99): the criterion's margin is that share minus the allowed one. A share, unlike
  the percentile itself, has a standard error that batch means give without assumptions: the window's
  requests are cut into BATCHES consecutive groups (in arrival order, so a queue's memory stays within a
  group) and the groups' shares scatter around the whole window's (a ratio estimate: ITL samples per
  request vary). This also catches rare-event SLOs: a p99 ITL that jumps when more than 1 % of the steps
  carry a long prefill is a share just under or over 1 %, and its error says which it is.
- a mean SLO: (mean - limit) / limit, with the batch means' error.

A share's error is never below what independent samples at the threshold allow (the score test), and
for TTFT never below what its episodes allow: requests delayed by one queue build-up or one long
prefill are one event, not many, so a window that held no episode over the limit is worth fewer
samples, by the index of dispersion of the near-tail count (over half the limit) across the groups.
(A 70B config's 1,000-request windows passed a rate with p99 TTFT 3.8 s against a 5 s limit, where
seven of eight 4,000-request runs gave 5.5-7.3 s: over-limit TTFTs came 4-18 to an episode.)

`judge` turns the criteria into "pass" (every one holds by Z errors), "fail" (one misses by Z errors) or
"unsure"; the capacity search measures an unsure rate again and `pool`s the windows (trial/capacity.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.measure.metrics import RequestRecord
from autotune.measure.slo import Slo

Z = 1.645  # one-sided 95 %: a rate passes when each SLO holds with this confidence
BATCHES = 10
CLUSTERED = ("ttft",)  # the metrics whose tail comes in episodes (TPOT/E2EL tails: each request's lengths)
NEAR_TAIL = 0.5  # episodes are counted over this fraction of the limit: a window often holds none over it
MIN_NEAR_TAIL = 5  # fewer near-tail requests than this tell nothing of how they cluster
PASS, FAIL, UNSURE = "pass", "fail", "unsure"


@dataclass(frozen=True)
class Criterion:
    """One SLO on one window: its margin (> 0 misses, in the criterion's own units), standard error,
    and the number of samples behind them (requests; token gaps for ITL)."""

    name: str
    margin: float
    error: float
    samples: int = 0

    def verdict(self, z: float = Z, fail_z: float | None = None) -> str:
        """PASS when the margin is below zero by z errors, FAIL when above by `fail_z` (default z),
        else UNSURE."""
        if self.margin + z * self.error <= 0:
            return PASS
        if self.margin - (z if fail_z is None else fail_z) * self.error > 0:
            return FAIL
        return UNSURE

    def to_info(self) -> list[float]:
        """[margin, error, samples], as a trial stores it."""
        return [round(self.margin, 5), round(self.error, 5), self.samples]

    def stored(self) -> Criterion:
        """This criterion as a trial stores it (and the capacity search judges it): `to_info`'s rounding."""
        return from_info({self.name: self.to_info()})[0]


def judge(criteria: Sequence[Criterion], z: float = Z, fail_z: float | None = None) -> str:
    """FAIL if any criterion fails (by `fail_z` errors, default z), PASS if every one passes by z,
    else UNSURE."""
    verdicts = [c.verdict(z, fail_z) for c in criteria]
    if FAIL in verdicts:
        return FAIL
    return PASS if all(v == PASS for v in verdicts) else UNSURE


@functools.lru_cache(maxsize=16)
def sequential_z(looks: int, z: float = Z) -> float:
    """The bar each of up to `looks` equal, pooled windows must clear so that passing at any of them is
    as rare at the threshold as passing one window by `z` errors (Pocock's boundary).

    Measuring an unsure rate again until it passes is a sequential test: at z = 1.645 on each of three
    looks a rate exactly at its threshold passes 10 % of the time, not 5 % (an L40S config's search
    passed three rates on their third window; the highest sat 4.6 % over the long-run reference and half
    of the 4,000-request runs there missed the SLO). The pooled statistic after k looks is a random
    walk over sqrt(k); its density is carried look by look on a grid, absorbed above the bar.
    """
    alpha = 0.5 * math.erfc(z / math.sqrt(2))
    step = 0.01
    reach = 8.0 * math.sqrt(looks)  # the walk's range, with room to spare
    grid = np.arange(-reach, reach + step, step)
    kernel = np.exp(-0.5 * grid**2) * step / math.sqrt(2 * math.pi)

    def crossed(bar: float) -> float:
        density = kernel / step  # the first look's sum: N(0, 1)
        for k in range(1, looks + 1):
            density = np.where(grid <= bar * math.sqrt(k), density, 0.0)
            if k < looks:
                density = np.convolve(density, kernel, mode="same")
        return 1.0 - float(density.sum() * step)

    low, high = z, z + 3.0
    for _ in range(30):  # the crossing probability falls as the bar rises
        mid = (low + high) / 2
        low, high = (mid, high) if crossed(mid) > alpha else (low, mid)
    return high


def slo_criteria(records: Sequence[RequestRecord], slos: Sequence[Slo]) -> list[Criterion]:
    """One criterion per SLO over the successful `records` (in any order: they are sorted by send time)."""
    ok = sorted((r for r in records if r.success), key=lambda r: r.start_time)
    groups = [list(g) for g in np.array_split(np.arange(len(ok)), max(1, min(BATCHES, len(ok))))]
    out = []
    for slo in slos:
        per_group = [_samples(ok, g, slo.metric) for g in groups]
        out.append(_criterion(slo, per_group))
    return out


def from_info(info: Mapping[str, Sequence[float]]) -> list[Criterion]:
    """The criteria a trial stored (see `Criterion.to_info`)."""
    return [Criterion(name, float(m), float(e), int(n)) for name, (m, e, n) in info.items()]


def pool(windows: Sequence[Sequence[Criterion]]) -> list[Criterion]:
    """The criteria of independent windows at one load as those of one window with all their samples:
    margins weighted by sample count, errors combined as independent ones (each window's floor
    combines into the floor of the pooled count)."""
    by_name: dict[str, list[Criterion]] = {}
    for criteria in windows:
        for c in criteria:
            by_name.setdefault(c.name, []).append(c)
    pooled = []
    for name, parts in by_name.items():
        n = sum(c.samples for c in parts)
        if n == 0:
            pooled.append(Criterion(name, 0.0, math.inf, 0))
            continue
        margin = sum(c.samples * c.margin for c in parts) / n
        error = math.sqrt(sum((c.samples * c.error) ** 2 for c in parts)) / n
        pooled.append(Criterion(name, margin, error, n))
    return pooled


def episode_size(c: Criterion, allowed: float) -> float:
    """How many samples one tail event was worth in a window: its share's error squared over what
    independent samples at that share (at least the allowed one) give; at least 1, and 1 for a window
    with fewer than MIN_NEAR_TAIL samples over the limit (one or two events give no spread to read)."""
    share = c.margin + allowed
    if c.samples == 0 or not math.isfinite(c.error) or share * c.samples < MIN_NEAR_TAIL:
        return 1.0
    spread = max(share, allowed) * (1 - max(share, allowed))
    return max(1.0, c.error**2 * c.samples / spread) if spread > 0 else 1.0


def floored(c: Criterion, allowed: float, clusters: float) -> Criterion:
    """`c` never surer than samples worth `clusters` each allow at the threshold (see `_criterion`)."""
    if c.samples == 0:
        return c
    floor = math.sqrt(allowed * (1 - allowed) * clusters / c.samples)
    return Criterion(c.name, c.margin, max(c.error, floor), c.samples)


def _samples(records: Sequence[RequestRecord], indexes: Sequence[int], metric: str) -> np.ndarray:
    """The values of `metric` (seconds) that vLLM's benchmark pools for these requests."""
    if metric == "itl":
        parts = [np.asarray(records[i].itl, dtype=float) for i in indexes]
        return np.concatenate(parts) if parts else np.zeros(0)
    if metric == "tpot":
        return np.array([records[i].tpot for i in indexes if records[i].output_len > 1], dtype=float)
    if metric == "ttft":
        return np.array([records[i].ttft for i in indexes], dtype=float)
    return np.array([records[i].latency for i in indexes], dtype=float)


def _criterion(slo: Slo, groups: Sequence[np.ndarray]) -> Criterion:
    limit = slo.limit_ms / 1000.0
    sizes = np.array([len(g) for g in groups], dtype=float)
    if sizes.sum() == 0:
        return Criterion(slo.name, 0.0, math.inf, 0)  # nothing measured: no evidence either way
    allowed = slo.allowed_share
    if allowed is None:  # a mean
        totals = np.array([g.sum() for g in groups])
        value, error = _ratio(totals, sizes)
        return Criterion(slo.name, (value - limit) / limit, error / limit, int(sizes.sum()))
    over = np.array([np.count_nonzero(g > limit) for g in groups], dtype=float)
    share, error = _ratio(over, sizes)
    # Never surer than independent samples at the threshold allow (the score test's error): a window
    # with no sample over the limit has a batch-means error of 0, yet 400 requests cannot tell a 0.5 %
    # share from a 1 % one.
    clusters = _clustering(groups, limit * NEAR_TAIL) if slo.metric in CLUSTERED else 1.0
    return floored(Criterion(slo.name, share - allowed, error, int(sizes.sum())), allowed, clusters)


def _clustering(groups: Sequence[np.ndarray], level: float) -> float:
    """How many requests one tail event is worth: the index of dispersion (variance / mean) of the
    count over `level` across the window's groups, at least 1 (independent samples)."""
    counts = np.array([np.count_nonzero(g > level) for g in groups], dtype=float)
    if len(counts) < 2 or counts.sum() < MIN_NEAR_TAIL:
        return 1.0
    return max(1.0, float(counts.var(ddof=1) / counts.mean()))


def _ratio(totals: np.ndarray, sizes: np.ndarray) -> tuple[float, float]:
    """Σ totals / Σ sizes and its batch-means standard error (ratio estimator; inf with one group)."""
    keep = sizes > 0
    totals, sizes = totals[keep], sizes[keep]
    value = float(totals.sum() / sizes.sum())
    n = len(sizes)
    if n < 2:
        return value, math.inf
    spread = float(np.sum((totals - value * sizes) ** 2) / (n * (n - 1)))
    return value, math.sqrt(spread) / float(sizes.mean())
