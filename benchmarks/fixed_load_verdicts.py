"""How often a fixed-load run's "kept up with the load" verdict is right, on simulated runs of known load.

A fixed-load run (`autotune run --load fixed`, `autotune bench --rate R`) has no warm-up and often few
requests; its verdict (autotune/measure/steady_state.py `_fixed_load_steadiness`) is "yes", "NO" or "not
judged". Each case's capacity is the rate a 3,000-request all-at-once overload served (its middle half);
the cases' runs are then simulated, noise-free, at fixed shares of it with 100, 300 and 1,000 requests
and several seeds, and their verdicts are counted by load class: at most 90 % of capacity (right: "yes";
wrong: "NO"), 1.1x or more (right: "NO"; wrong: "yes"; 1.2x for the decode-heavy mix, whose 1.1x a
4,000-request run still finds within its noise), and between them ("between": either is fair). The classes are
checked first: a 4,000-request run at 0.95, 1.05, 1.1 and 1.2x each capacity, judged over its last three
quarters of sends as a capacity probe's window is (`steadiness`). Two trace cases replay stretches of
Azure's traces (their own bursts and length drift; the seed picks the stretch, TRACE_STEP_S apart) at
light loads only, 0.3x and 0.5x the capacity of their rows: their bursts peak at well over their mean
rate, so only a light load has one right answer ("yes").

    python benchmarks/fixed_load_verdicts.py [--seeds 3] [--processes 2]
"""

from __future__ import annotations

import collections
import dataclasses
from concurrent.futures import ProcessPoolExecutor

from arguments import Parser, whole

from autotune.measure.steady_state import Window, _fixed_load_steadiness, steadiness
from autotune.sim.replay import simulate
from autotune.tune.space import load_space
from autotune.workloads.files import load_workload

CASES = {  # name: (search space, flags, workload)
    "8B/H100 chat": ("vllm", {}, "chat"),
    "8B/H100 decode-heavy": ("vllm", {}, "decode_heavy"),
    "8B/H100 prefill-heavy": ("vllm", {}, "prefill_heavy"),
    "8B/H100 chat, max_num_seqs 16": ("vllm", {"max_num_seqs": 16}, "chat"),
    "70B/2xA100 chat": ("tp", {"tensor_parallel_size": 2}, "chat"),
    "70B/4xA100 chat": ("tp", {"tensor_parallel_size": 4}, "chat"),
    "8B/H100 Azure conv trace": ("vllm", {}, "azure_conv"),
    "8B/H100 Azure code trace": ("vllm", {}, "azure_code"),
}
TRACE_LOADS = (0.3, 0.5)  # shares of capacity a trace case is replayed at
TRACE_STEP_S = 800.0  # seconds between the trace stretches of seeds 0, 1, 2, ...
CHECKS = (0.95, 1.05, 1.1, 1.2)  # shares of capacity a long run checks
LOADS = (0.3, 0.6, 0.8, 0.9, 0.95, 1.05, 1.1, 1.2, 1.5, 2.0)  # shares of capacity
SIZES = (100, 300, 1000)
WORDS = {True: "yes", False: "NO", None: "not judged"}


def _run(case: str, rate: float, requests: int, seed: int) -> list:
    """The records of `requests` of the case's workload at a fixed `rate`, noise-free."""
    space_name, flags, workload_name = CASES[case]
    space = load_space(space_name)
    workload = dataclasses.replace(load_workload(workload_name), load="fixed", num_requests=requests)
    if _is_trace(case):
        workload = dataclasses.replace(
            workload, trace=dataclasses.replace(workload.trace, start=TRACE_STEP_S * seed)
        )
    workload = workload.with_load(request_rate=rate, max_concurrency=None)
    return simulate(space.config(flags), space.gpu, workload.requests(seed)).records


def _is_trace(case: str) -> bool:
    """Whether the case replays a trace's own arrivals (and lengths) rather than Poisson ones."""
    return load_workload(CASES[case][2]).trace is not None


def _loads(case: str) -> tuple[float, ...]:
    """The shares of capacity the case is run at."""
    return TRACE_LOADS if _is_trace(case) else LOADS


def capacity(case: str) -> float:
    """Requests per second a 3,000-request overload served between its 25th and 75th percentile
    completion (its batch full, no ramp)."""
    records = _run(case, 1000.0, 3000, 0)
    ends = sorted(r.start_time + r.latency for r in records if r.success)
    low, high = ends[len(ends) // 4], ends[3 * len(ends) // 4]
    return (len(ends) // 2) / (high - low)


def verdict(case: str, rate: float, requests: int, seed: int) -> bool | None:
    """The fixed-load verdict on one run."""
    records = _run(case, rate, requests, seed)
    steady = _fixed_load_steadiness(records, max(r.start_time for r in records))
    return None if steady is None else steady.kept_up


def long_run(case: str, rate: float) -> str:
    """A 4,000-request run at `rate`, judged over its last three quarters of sends: kept up or not, with
    its backlog's growth and what its noise allowed."""
    records = _run(case, rate, 4000, 9)
    last = max(r.start_time for r in records)
    steady = steadiness(records, Window(last / 4, last))
    word = "kept up" if steady.kept_up else "NOT kept up"
    return f"{word} ({steady.backlog_growth:+.1%}, {steady.allowed_growth:.1%} allowed)"


def load_class(case: str, share: float) -> str:
    """Which answer is right at `share` of the case's capacity."""
    if _is_trace(case):
        return "<= 0.5x, trace"
    if share <= 0.9:
        return "<= 0.9x"
    overload = 1.2 if "decode" in case else 1.1
    return ">= 1.1x" if share >= overload else "between"


def main() -> None:
    """Simulate the grid and print the verdicts' counts per load class and run size."""
    parser = Parser(__doc__)
    parser.add_argument("--seeds", type=whole(), default=3, help="seeds per case, load and size")
    parser.add_argument("--processes", type=whole(), default=2, help="worker processes")
    args = parser.parse_args()
    grid = [
        (c, share, n, seed)
        for c in CASES
        for share in _loads(c)
        for n in SIZES
        for seed in range(1, args.seeds + 1)
    ]
    with ProcessPoolExecutor(args.processes) as pool:
        capacities = dict(zip(CASES, pool.map(capacity, CASES), strict=True))
        cases, shares, sizes, seeds = zip(*grid, strict=True)
        rates = [capacities[case] * share for case, share in zip(cases, shares, strict=True)]
        verdicts = list(pool.map(verdict, cases, rates, sizes, seeds))
        checked = [(case, share) for case in CASES for share in CHECKS if not _is_trace(case)]
        checks = list(pool.map(long_run, [c for c, _ in checked], [capacities[c] * f for c, f in checked]))
    for case, value in capacities.items():
        runs = [f"{f:g}x {run}" for (c, f), run in zip(checked, checks, strict=True) if c == case]
        long_runs = f"; 4,000 requests at {'; '.join(runs)}" if runs else ""
        print(f"{case}: capacity {value:.3f} req/s{long_runs}")
    counts: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    for (case, share, n, _), kept in zip(grid, verdicts, strict=True):
        counts[(load_class(case, share), n)][WORDS[kept]] += 1
    print(f"\n| load | requests | {' | '.join(WORDS.values())} |\n|---|---|---|---|---|")
    for (kind, n), tally in sorted(counts.items(), key=lambda item: (item[0][0] != "<= 0.9x", item[0])):
        print(f"| {kind} | {n} | {' | '.join(str(tally[w]) for w in WORDS.values())} |")


if __name__ == "__main__":
    main()
