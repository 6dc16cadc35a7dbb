"""The guide's fast estimate of a config on the simulated engine: its capacity under the SLOs, its
throughput and latencies there, and its knee.

A trial's capacity search (autotune/trial/capacity.py) measures each rate on windows of 1,000+ requests
after warm-ups of a queue relaxation time, measures a rate again when its window is too close to call,
and pools windows: 1-8 CPU seconds a config. The guide asks less, a ranking of the whole space before
the first GPU trial, and follows the search's rules on fewer requests:

1. Saturation, measured as the search measures it (a burst of four running batches, as many as the KV
   cache holds, `saturation_burst`), and with it the search's top rate: 1.1 x the saturation
   throughput, and with a TTFT or E2EL SLO the queue ceiling (`queue_ceiling`).
2. Capacity: Poisson windows of 500 measured requests after 250 warm-up ones, at rates on a fixed
   ladder (24 rungs per doubling, 2.9 % apart), each judged as the search judges a window: the server
   kept up, and every SLO holds with 95 % confidence (measure/evidence.py); a window too close to call
   fails (the search would measure it again). The first probe is the rung at 90 % of saturation;
   while probes fail the rate steps down as the search's does (`step_down`: 0.7x, or by an ITL/TPOT
   miss's margin; 0.9x from a window too close to call), then bisection over the rungs. Capacity is
   the highest passing rung (0 when none down to MIN_RATE passes, or when, after two failed windows,
   requests served one at a time miss an SLO already: their latencies are every rate's floor).
3. Knee: where latency takes off: the rate at which p99 TTFT reaches KNEE_FACTOR x its value at light
   load (a window at 25 % of saturation), on a line through log p99 TTFT of the probes around it.

Every window at a rung replays the same requests (one seed), so configs compare on the same load.

Runs are shared between configs that differ only in what sizes the KV pool (gpu_memory_utilization,
block_size, prefix caching), on a workload without shared prefixes: they schedule the same steps as long
as the pool never runs short. A run is reused by such a config when it provably would not have run
short there (`_Run.fits`): it had no preemption and no prefix-cache hit, no waiting request was held
back for blocks (SimEngine.waited_for_blocks), and the most tokens it held, in the other config's
blocks (each running request rounds up by one block at most), fit that config's pool: then every
allocation it made succeeds there too, in the same steps. The ladder is
what makes this pay: the configs of a class probe the same rungs. Saturation bursts fill the KV cache
(no config shares one), so they are run with 16-token blocks whatever the config's (`scan`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.catalog.gpus import GpuSpec
from autotune.catalog.models import get_model
from autotune.core.config import EngineConfig
from autotune.core.errors import EngineStartupError
from autotune.measure.evidence import FAIL, PASS, UNSURE, Z, judge
from autotune.measure.load_report import Saturation
from autotune.measure.metrics import BenchmarkResult, compute_metrics
from autotune.measure.slo import Slo
from autotune.measure.steady_state import measure_window, plan_window, saturation
from autotune.sim.memory import MemoryPlan, plan_memory
from autotune.sim.replay import SimRun, simulate
from autotune.trial.capacity import (
    MIN_RATE,
    QUEUE_METRICS,
    SATURATION_MARGIN,
    START_FRACTION,
    STEP_DOWN,
    UNSURE_STEP,
    CapacitySearch,
    queue_ceiling,
    step_down,
)
from autotune.trial.saturation import kv_batch, saturation_burst

SATURATION_BLOCK = 16  # the KV block size saturation is measured with (Estimator.scan)
KNEE_FACTOR = 2.0
# How far the lone requests' median may lie over an SLO's limit before no rate is tried: 64 requests'
# median against a window's statistic over others (the sample's spread), with room to spare.
LONE_MARGIN = 0.25
LONE_AFTER = 2  # failed probes before that floor is looked at (most configs pass sooner, and pay nothing)


@dataclass(frozen=True)
class GuideSettings:
    """How the guide estimates a config (part of its cache key)."""

    rungs_per_doubling: int = 24  # the rate ladder: 2 ** (1 / 24) = 2.9 % between rungs
    warmup_requests: int = 250
    window_requests: int = 500
    light_fraction: float = 0.25  # the light-load window of the knee
    light_requests: int = 100
    lone_requests: int = 64  # served one at a time: the floor of every rate's latencies (`_out_of_reach`)
    seed: int = 0


@dataclass(frozen=True)
class Scan:
    """Where a config's scan runs: its saturation (all requests at once) and the highest rate it
    probes, the capacity search's top: SATURATION_MARGIN x the saturation throughput, and with a TTFT
    or E2EL SLO the queue ceiling (the highest rate whose queue relaxes within a probe,
    trial/capacity.py queue_ceiling)."""

    saturation: Saturation  # req/s and request lifetime (zero throughput: it served nothing)
    top: float  # req/s


@dataclass(frozen=True)
class Estimate:
    """What the guide predicts for a config that starts."""

    capacity_rate: float  # the highest rung meeting the SLOs (0: none)
    knee_rate: float | None  # where p99 TTFT reaches KNEE_FACTOR x its light-load value (None: unseen)
    metrics: dict[str, float] = field(default_factory=dict)  # at capacity, throughputs sustained ones


POOL_FLAGS = ("block_size", "gpu_memory_utilization", "enable_prefix_caching")


def behaviour_key(config: EngineConfig, shares_prefixes: bool) -> str:
    """What schedules a resolved config's steps, apart from its KV pool: configs with one key share
    runs (`_Run.fits`). On a workload with shared prefixes the cache's block granularity and contents
    change the steps, so there every flag counts."""
    params = {k: v for k, v in config.params().items() if shares_prefixes or k not in POOL_FLAGS}
    return repr(sorted({"model": config.model, **params, **config.extra}.items()))


@dataclass(frozen=True)
class Pool:
    """What sizes a config's KV pool, and the bounds a shared run must fit in (see `_Run.fits`)."""

    behaviour: str  # behaviour_key: only configs with the same one can share a run
    block_size: int
    num_blocks: int
    caching: bool
    max_num_seqs: int

    @classmethod
    def of(cls, config: EngineConfig, memory: MemoryPlan, shares_prefixes: bool) -> Pool:
        """The pool of a resolved config that starts, on a workload that shares prefixes or not."""
        assert config.max_num_seqs is not None
        return cls(
            behaviour_key(config, shares_prefixes),
            config.block_size,
            memory.num_gpu_blocks,
            config.enable_prefix_caching,
            config.max_num_seqs,
        )


@dataclass
class _Run:
    """A simulated run kept for the configs of its class, with what decides whether it is theirs."""

    pool: Pool
    held_tokens: int  # the most KV it held: blocks in use at the fullest, in tokens
    clean: bool  # never short of blocks, no preemption, no prefix-cache hit
    outcome: Any

    def fits(self, pool: Pool) -> bool:
        """Whether `pool` would have run it the same: its own pool, or a run that was never short and
        whose tokens, rounded up a block per running request, fit there."""
        if pool == self.pool:
            return True
        if pool.behaviour != self.pool.behaviour:
            return False
        need = self.held_tokens / pool.block_size + pool.max_num_seqs
        return self.clean and need <= pool.num_blocks


class Estimator:
    """Estimates configs on one workload and SLOs, sharing runs between the configs of a class (those
    that differ only in their KV pool, see `Pool`)."""

    def __init__(
        self,
        gpu: GpuSpec,
        workload: Any,
        slos: Sequence[Slo],
        settings: GuideSettings = GuideSettings(),  # noqa: B008 (frozen)
        calibration: object | None = None,
    ) -> None:
        self.gpu = gpu
        self.workload = workload.with_rate_arrivals()
        self.slos = list(slos)
        self.settings = settings
        self.calibration = calibration
        self._runs: dict[Hashable, list[_Run]] = {}
        self._sizing: dict[int, float] = {}  # max_num_seqs -> tokens per request of its sizing burst

    @property
    def simulated(self) -> int:
        """Runs simulated so far (a run that configs of a class share counts once)."""
        return sum(len(runs) for runs in self._runs.values())

    def scan(self, config: EngineConfig, pool: Pool) -> Scan:
        """The config's saturation, measured as the capacity search measures it (a burst of four
        running batches, see trial/saturation.py saturation_runs), and the highest rate to probe.

        It is measured with SATURATION_BLOCK-token KV blocks whatever the config's: the block size
        moves a request's KV footprint by less than a block (1-3 % of a chat request), and configs that
        differ only in it then share this run, the guide's costliest (a burst fills the KV cache, so
        no other config can share it, see `_Run.fits`).
        """
        config, pool = self._with_block(config, pool, SATURATION_BLOCK)
        assert config.max_num_seqs is not None
        seqs = config.max_num_seqs
        batch = kv_batch(seqs, pool.num_blocks * pool.block_size, self._tokens_per_request(seqs))
        burst = saturation_burst(seqs, batch)
        return self._run(pool, ("burst", burst), lambda: self._burst(config, burst))

    def _tokens_per_request(self, seqs: int) -> float:
        """Mean prompt + output tokens of the capacity search's sizing burst (saturation_runs)."""
        if seqs not in self._sizing:
            sizing = self.workload.burst(saturation_burst(seqs)).requests(self.settings.seed)
            self._sizing[seqs] = sum(r.prompt_len + r.output_len for r in sizing) / len(sizing)
        return self._sizing[seqs]

    def _with_block(self, config: EngineConfig, pool: Pool, block_size: int) -> tuple[EngineConfig, Pool]:
        """`config` with `block_size`-token KV blocks and its pool (itself when it has them, or when
        it would not start with them)."""
        if config.block_size == block_size:
            return config, pool
        other = config.replace(block_size=block_size)
        try:
            memory = plan_memory(other, get_model(other.model), self.gpu)
        except EngineStartupError:
            return config, pool
        return other, Pool.of(other, memory, self.workload.shares_prefixes)

    def estimate(self, config: EngineConfig, pool: Pool, scan: Scan) -> Estimate:
        """The estimate of one config that starts (its resolved config and pool) over its `scan`."""
        if scan.saturation.throughput <= 0:
            return Estimate(0.0, None)
        windows = self._capacity(config, pool, scan)
        knee = self._knee(config, pool, scan, windows)
        passed = [rung for rung, w in windows.items() if w.passed]
        if not passed:
            return Estimate(0.0, knee)
        best = max(passed)
        return Estimate(self._rate(best), knee, windows[best].metrics)

    def _out_of_reach(self, config: EngineConfig, pool: Pool) -> bool:
        """Whether some SLO is missed even by requests served one at a time (no queue, no batch beside
        them): a request's latencies at any rate are at least its lone ones, so no rate meets it, and the
        scan need not step down to MIN_RATE (a dozen windows). Judged by the lone requests' median (their
        mean for a mean SLO), which the SLO's statistic (a median or above) at any rate exceeds."""

        def run() -> tuple[BenchmarkResult, SimRun]:
            load = self.workload.with_load(num_requests=self.settings.lone_requests)
            sim = self._simulate(config, load.requests(self.settings.seed), max_concurrency=1)
            return compute_metrics(sim.records, sim.duration), sim

        lone = self._run(pool, ("lone", self.settings.lone_requests), run)
        floors = [Slo(s.metric, "mean" if s.stat == "mean" else "median", s.limit_ms) for s in self.slos]
        return any(floor.margin(lone) > LONE_MARGIN for floor in floors)

    # -- the scan -------------------------------------------------------------------------------------
    def _capacity(self, config: EngineConfig, pool: Pool, scan: Scan) -> dict[int, _Window]:
        """The probed rungs' windows: a step-down while they fail, then bisection (module docstring)."""
        s = self.settings
        top = self._rung(scan.top)
        low_rung = self._rung(MIN_RATE) + 1
        probed: dict[int, _Window] = {}

        def probe(rung: int) -> bool:
            probed[rung] = self._window(config, pool, rung, s.warmup_requests, s.window_requests)
            return probed[rung].passed

        rung = min(self._rung(START_FRACTION * scan.saturation.throughput), top)
        lo, hi = None, top + 1  # highest passing rung, lowest failing one above it
        while lo is None and rung >= low_rung:
            if probe(rung):
                lo = rung
            elif len(probed) == LONE_AFTER and self._out_of_reach(config, pool):
                return probed  # no rate meets the SLOs: not worth a dozen more windows
            else:  # down as the search steps (trial/capacity.py _next_rate), a rung at least
                hi = rung
                rung -= max(1, round(-s.rungs_per_doubling * math.log2(probed[rung].step)))
        if lo is None:
            return probed
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if probe(mid) else (lo, mid)
        return probed

    def _knee(
        self, config: EngineConfig, pool: Pool, scan: Scan, windows: dict[int, _Window]
    ) -> float | None:
        """The rate at which p99 TTFT reaches KNEE_FACTOR x its light-load value (see module docstring)."""
        s = self.settings
        light_rung = self._rung(s.light_fraction * scan.saturation.throughput)
        light = self._window(config, pool, light_rung, s.light_requests // 10, s.light_requests)
        points = sorted({light_rung: light, **windows}.items())
        base = light.metrics.get("p99_ttft_ms", 0.0)
        level = KNEE_FACTOR * base
        for (r0, w0), (r1, w1) in zip(points, points[1:], strict=False):
            t0, t1 = w0.metrics.get("p99_ttft_ms", 0.0), w1.metrics.get("p99_ttft_ms", 0.0)
            if t0 < level <= t1 and t0 > 0:
                x0, x1 = self._rate(r0), self._rate(r1)
                share = math.log(level / t0) / math.log(t1 / t0)
                return x0 + share * (x1 - x0)
        return None

    def _window(self, config: EngineConfig, pool: Pool, rung: int, warmup: int, measured: int) -> _Window:
        """`warmup` + `measured` requests at the rung's rate, judged on the measured ones."""

        def run() -> tuple[_Window, SimRun]:
            rate = self._rate(rung)
            load = self.workload.with_load(request_rate=rate, num_requests=warmup + measured)
            requests = load.requests(self.settings.seed)
            sim = self._simulate(config, requests)
            start = requests[warmup].arrival_time if warmup else 0.0
            return _Window.judge(sim, start, rate, self.slos), sim

        return self._run(pool, ("window", rung, warmup, measured), run)

    def _burst(self, config: EngineConfig, num_requests: int) -> tuple[Scan, SimRun]:
        """The saturation of a burst of `num_requests`, and the top rate of the scan (see `Scan`)."""
        requests = self.workload.burst(num_requests).requests(self.settings.seed)
        sim = self._simulate(config, requests)
        measured = saturation(sim.records) or Saturation(0.0, 0.0)
        top = SATURATION_MARGIN * measured.throughput
        if measured.throughput > 0 and any(slo.metric in QUEUE_METRICS for slo in self.slos):
            ceiling = queue_ceiling(measured.throughput, plan_window(measured.lifetime_s), CapacitySearch())
            top = min(top, ceiling)
        return Scan(measured, top), sim

    # -- shared runs ----------------------------------------------------------------------------------
    def _run(self, pool: Pool, load: Hashable, make: Callable[[], tuple[Any, SimRun]]) -> Any:
        """The outcome of `load` on a config with `pool`: a run of its class that provably is its own
        too, else a new one (`make`: simulate it, and what to keep of it)."""
        runs = self._runs.setdefault(load, [])
        for run in runs:
            if run.fits(pool):
                return run.outcome
        outcome, sim = make()
        clean = (
            sim.stats.num_preemptions == 0 and sim.stats.prefix_cache_hits == 0 and not sim.waited_for_blocks
        )
        held = (pool.num_blocks - sim.min_free_blocks) * pool.block_size
        runs.append(_Run(pool, held, clean, outcome))
        return outcome

    def _simulate(
        self, config: EngineConfig, requests: Sequence[Any], max_concurrency: int | None = None
    ) -> SimRun:
        # The calibration reaches the simulator once it takes one (sim/calibration.py).
        extra = {} if self.calibration is None else {"calibration": self.calibration}
        return simulate(config, self.gpu, requests, max_concurrency, **extra)

    def _rung(self, rate: float) -> int:
        """The highest rung at or below `rate`."""
        return math.floor(self.settings.rungs_per_doubling * math.log2(max(rate, 1e-9)) + 1e-9)

    def _rate(self, rung: int) -> float:
        return float(2.0 ** (rung / self.settings.rungs_per_doubling))


@dataclass(frozen=True)
class _Window:
    """A probe window's verdict and metrics (vllm bench serve keys; throughputs as sustained ones)."""

    verdict: str  # PASS, FAIL or UNSURE (measure/evidence.py)
    step: float  # how far a scan steps down from it when nothing passed yet (as the search steps)
    metrics: dict[str, float]

    @property
    def passed(self) -> bool:
        """PASS: the rate is sustained with every SLO met (a window too close to call does not pass)."""
        return self.verdict == PASS

    @classmethod
    def judge(cls, sim: SimRun, start: float, rate: float, slos: Sequence[Slo]) -> _Window:
        """Kept up (steady_state), and every SLO held with the capacity search's confidence (Z standard
        errors, measure/evidence.py) over the requests sent from `start` on: a window too close to
        call fails, where the search would measure it again. A request the server refused fails it."""
        bench, report = measure_window(sim.records, sim.duration, start, slos, kind="open")
        if report is None or report.slo_evidence is None:  # too short to tell
            return cls(FAIL, STEP_DOWN, _sustained(bench, rate))
        refused = not all(r.success for r in sim.records)
        verdict = FAIL if refused or report.kept_up is False else judge(report.slo_evidence, Z)
        step = UNSURE_STEP if verdict == UNSURE else step_down(None if refused else bench, slos)
        return cls(verdict, step, _sustained(bench, rate))


def _sustained(bench: BenchmarkResult, rate: float) -> dict[str, float]:
    """The window's metrics, its throughputs those of `rate` (what the config sustains there, as the
    capacity search reports them)."""
    out = {k: float(v) for k, v in bench.to_dict().items() if isinstance(v, (int, float))}
    if bench.completed:
        out["request_throughput"] = rate
        out["output_throughput"] = rate * bench.total_output_tokens / bench.completed
        tokens = bench.total_input_tokens + bench.total_output_tokens
        out["total_token_throughput"] = rate * tokens / bench.completed
    return {k: round(v, 4) for k, v in out.items() if math.isfinite(v)}
