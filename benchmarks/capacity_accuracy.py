"""Is the capacity `autotune run` reports one a deployment can rely on?

For each scenario (model, GPU, workload, SLO set) and each of four valid configs (vLLM's defaults and
three others), on the simulated engine:
- `default`: the capacity search as `autotune run` does it (autotune/trial/capacity.py);
- `reference`: the same search with 10x longer warm-ups and windows and a 1 % resolution, the
  long-run answer the default must match (target: within 5 %). One such bisection is itself a sample:
  one unlucky 10,000-request window below the threshold ends it low (the 8B chat defaults gave 13.5,
  11.3 and 13.5 req/s on three request sequences), so the reference is the median of REFERENCE_RUNS
  of them (`--reference-runs`), each of other requests, and the table shows their spread;
- `check`: a plain 4,000-request Poisson run at the default's reported rate, as a user would verify
  it with `vllm bench serve`: did the server keep up (served >= 95 % of offered) and meet every SLO?
  It is one sample too: near a threshold another run may differ, so CHECK_SEEDS runs of other
  requests are made per reported rate.
The default search is itself a sample (its windows draw requests), so it runs with `--search-seeds`
seeds per config: the table shows the first (the headline) and how many of them came within 5 % and
how many of their checks met the SLOs. The reference, the searches and the checks draw disjoint
request sequences (a check whose requests repeat a probe window's would agree with it by
construction).
Also printed: the saturation throughput (an all-at-once run's mid-run completion rate), the GPU time
one capacity search costs (simulated: startup + every run, as a real GPU would spend it) and the CPU
time the simulation took.

With `--band N`, N more 4,000-request runs per config at 0.95 x its reference, the lowest rate within
the 5 % target: where they often miss the SLOs, no search can be within 5 % and pass every check.
With `--hint-factors F ...`, each search seed also runs the bracketed search (CapacitySearch.hint_rate,
what a guided trial runs) with the hint F x the config's reference, for each F (the guide's corrected
prediction is that far off), checked the same way: its figures are printed beside the default's.
With `--long-run N`, N runs of 10,000 requests per config at 0.95, 1.00 and 1.05 x its reference: the
share of requests over each percentile SLO's limit there in the long run (benchmarks/capacity_runs.py).
Each reference bisection is also compared with the median of the others, and checked at its own rate
as a search is: how closely the yardstick reproduces itself, and whether its own rates pass.

    python benchmarks/capacity_accuracy.py [--jobs 2] [--search-seeds 4] [--scenarios NAME ...]
        [--noise 0.02] [--band 20] [--long-run 2] [--reference-runs 5] [--hint-factors 0.9 1.1]
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arguments import Parser, add_names, noise, positive, whole  # noqa: E402
from capacity_runs import (  # noqa: E402
    LONG_RUN_FACTORS,
    TARGET,
    check,
    print_band,
    print_hinted,
    print_long_run,
    print_reference_runs,
    shares,
)

from autotune.backends.sim import SimBackend  # noqa: E402
from autotune.core.config import EngineConfig  # noqa: E402
from autotune.measure.capacity_report import CapacityReport  # noqa: E402
from autotune.measure.result import TrialResult  # noqa: E402
from autotune.measure.slo import parse_slos  # noqa: E402
from autotune.sim.noise import NoiseModel  # noqa: E402
from autotune.trial.capacity import CapacitySearch, find_capacity  # noqa: E402
from autotune.workloads.files import load_workload  # noqa: E402

# 10x windows already: no second window for unsure ones;
# every rate judged on 10x the tail window (queue_free_below=0): the reference does not get cheaper
# when the default's low-load windows do
REFERENCE = CapacitySearch(
    max_probes=12, resolution=0.01, window_scale=10.0, max_windows=1, queue_free_below=0.0
)
REFERENCE_RUNS = 5  # bisections per config (--reference-runs); the reference is their median
CHECK_SEEDS = 2  # per search seed
# Seeds far apart: a search takes one seed per window (a few dozen), so these never meet.
SEARCH_SEED_STEP = 1000
REFERENCE_SEED = 10**6
CHECK_SEED = 2 * 10**6
BAND_SEED = 3 * 10**6
LONG_RUN_SEED = 4 * 10**6
REFERENCE_CHECK_SEED = 5 * 10**6


@dataclass(frozen=True)
class Case:
    """One scenario: where, what load, which SLOs, and the configs measured (params over defaults)."""

    name: str
    model: str
    gpu: str
    workload: str
    slos: str
    configs: tuple[dict, ...]
    tensor_parallel_size: int = 1
    max_model_len: int = 8192


L8, L70, Q7, M7 = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
)
SMALL = {"max_num_seqs": 64, "max_num_batched_tokens": 2048}
MID = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
NO_CHUNK = {"max_num_seqs": 512, "max_num_batched_tokens": 8192, "enable_chunked_prefill": False}

CASES = (
    Case("8b-h100-chat-ttft", L8, "H100", "chat", "ttft_p99=2s", ({}, SMALL, MID, NO_CHUNK)),
    Case("8b-h100-chat-itl", L8, "H100", "chat", "itl_p99=60ms", ({}, SMALL, MID, NO_CHUNK)),
    Case(
        "8b-h100-prefill-ttft+itl",
        L8,
        "H100",
        "prefill_heavy",
        "ttft_p99=1.5s,itl_p99=50ms",
        ({}, SMALL, MID, NO_CHUNK),
    ),
    Case(
        "7b-a100-40gb-chat-both",
        Q7,
        "A100-40GB",
        "chat",
        "ttft_p99=3s,itl_p99=60ms",
        (
            {},
            SMALL,
            MID,
            {"max_num_seqs": 128, "max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.85},
        ),
    ),
    Case(
        "70b-a100-tp2-chat-ttft",
        L70,
        "A100-80GB",
        "chat",
        "ttft_p99=5s",
        (
            {},
            {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
            {"max_num_seqs": 128, "max_num_batched_tokens": 2048},
            {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.95},
        ),
        tensor_parallel_size=2,
    ),
    Case(
        "8b-l4-decode-none",
        L8,
        "L4",
        "decode_heavy",
        "",
        (
            {},
            {"max_num_seqs": 32, "max_num_batched_tokens": 2048},
            {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
            {"max_num_seqs": 128, "max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.95},
        ),
        max_model_len=4096,
    ),
    Case(
        "7b-l40s-conv-e2el",
        M7,
        "L40S",
        "azure_conv",
        "e2el_p99=20s",
        ({}, SMALL, MID, {"max_num_seqs": 128, "max_num_batched_tokens": 4096}),
    ),
)


@dataclass(frozen=True)
class Job:
    """One config's share of the benchmark: what to run for it (the command line's counts)."""

    case: Case
    params: dict
    noise: float
    search_seeds: int
    reference_runs: int
    band: int  # 4,000-request checks at the band's edge
    long_runs: int  # 10,000-request runs at each LONG_RUN_FACTORS x the reference
    hint_factors: tuple[float, ...] = ()  # bracketed searches from these x the reference


def _measure(job: Job) -> dict:
    case, params = job.case, job.params
    config = EngineConfig(
        model=case.model,
        tensor_parallel_size=case.tensor_parallel_size,
        max_model_len=case.max_model_len,
        **params,
    )
    backend = SimBackend(case.gpu, NoiseModel(job.noise))
    workload = load_workload(case.workload)
    slos = parse_slos(case.slos) if case.slos else []
    out: dict = {"case": case.name, "config": _label(params), "searches": []}
    for k in range(job.search_seeds):
        started = time.process_time()
        default = find_capacity(backend, config, workload, slos, seed=k * SEARCH_SEED_STEP)
        cpu_s = time.process_time() - started
        if default.failure is not None and default.benchmark is None:
            return {**out, "error": f"{default.failure}: {default.message[:80]}"}
        capacity = _capacity(default)
        rate = capacity.rate
        seeds = [CHECK_SEED + k * SEARCH_SEED_STEP + j for j in range(CHECK_SEEDS)]
        checks = [check(backend, config, workload, slos, rate, seed) for seed in seeds] if rate > 0 else []
        out["searches"].append(
            {
                "rate": rate,
                "probes": len(capacity.probes),
                "gpu_s": default.gpu_seconds,
                "cpu_s": cpu_s,
                "saturation": capacity.saturation_throughput,
                "checks": checks,
            }
        )
    references = [
        _capacity(
            find_capacity(
                backend, config, workload, slos, seed=REFERENCE_SEED + j * SEARCH_SEED_STEP, search=REFERENCE
            )
        ).rate
        for j in range(job.reference_runs)
    ]
    out["references"] = references
    out["reference"] = statistics.median(references)
    out["hinted"] = {f: _hinted(job, backend, config, f * out["reference"]) for f in job.hint_factors}
    # The reference's own rates, checked as a search's are: can even its 10x windows meet both targets?
    out["reference_checks"] = [
        [
            check(backend, config, workload, slos, rate, REFERENCE_CHECK_SEED + j * SEARCH_SEED_STEP + i)[1]
            for i in range(CHECK_SEEDS)
        ]
        for j, rate in enumerate(references)
        if rate > 0
    ]
    # The lowest rate within TARGET of the reference: does a 4,000-request run there meet the SLOs?
    # When it often does not, no search can be both within TARGET and pass its checks every time.
    edge = (1 - TARGET) * out["reference"]
    out["band"] = [check(backend, config, workload, slos, edge, BAND_SEED + j)[1] for j in range(job.band)]
    out["long_run"] = {
        f: [
            shares(
                backend,
                config,
                workload,
                slos,
                f * out["reference"],
                LONG_RUN_SEED + i * SEARCH_SEED_STEP + j,
            )
            for j in range(job.long_runs)
        ]
        for i, f in enumerate(LONG_RUN_FACTORS)
    }
    return out


def _hinted(job: Job, backend: SimBackend, config: EngineConfig, hint: float) -> list[dict]:
    """The bracketed search from `hint` on each search seed (the default's seeds), with its checks."""
    workload = load_workload(job.case.workload)
    slos = parse_slos(job.case.slos) if job.case.slos else []
    out = []
    for k in range(job.search_seeds):
        found = find_capacity(
            backend, config, workload, slos, seed=k * SEARCH_SEED_STEP, search=CapacitySearch(hint_rate=hint)
        )
        capacity = _capacity(found)
        seeds = [CHECK_SEED + k * SEARCH_SEED_STEP + j for j in range(CHECK_SEEDS)]
        runs = [check(backend, config, workload, slos, capacity.rate, seed) for seed in seeds]
        row = {"rate": capacity.rate, "probes": len(capacity.probes), "gpu_s": found.gpu_seconds}
        out.append({**row, "checks": runs})
    return out


def _capacity(result: TrialResult) -> CapacityReport:
    """The capacity report of a search's result (find_capacity always makes one)."""
    assert result.capacity is not None
    return result.capacity


def _label(params: dict) -> str:
    if not params:
        return "vLLM defaults"
    short = {
        "max_num_seqs": "seqs",
        "max_num_batched_tokens": "budget",
        "enable_chunked_prefill": "chunked",
        "gpu_memory_utilization": "gmu",
    }
    return " ".join(f"{short.get(k, k)}={v}" for k, v in params.items())


def main() -> int:
    parser = Parser(__doc__)
    parser.add_argument("--jobs", type=whole(1), default=2)
    parser.add_argument("--search-seeds", type=whole(1), default=4, help="default searches per config")
    add_names(parser, "--scenarios", [c.name for c in CASES], "default: all")
    parser.add_argument("--noise", type=noise, default=0.0, help="simulator run-to-run noise (cv)")
    parser.add_argument(
        "--band", type=whole(0), default=0, help="4,000-request checks per config at 0.95 x its reference"
    )
    parser.add_argument(
        "--long-run",
        type=whole(0),
        default=0,
        help="10,000-request runs per config at each of 0.95, 1.00 and 1.05 x its reference (at least 2)",
    )
    parser.add_argument(
        "--reference-runs",
        type=whole(1),
        default=REFERENCE_RUNS,
        help="bisections per reference (their median)",
    )
    parser.add_argument(
        "--hint-factors",
        type=positive,
        nargs="*",
        default=[],
        help="bracketed searches from F x the reference",
    )
    args = parser.parse_args()
    if args.long_run == 1:
        parser.error("argument --long-run: needs at least 2 runs (their SD is printed)")
    cases = [c for c in CASES if not args.scenarios or c.name in args.scenarios]
    hints = tuple(args.hint_factors)
    jobs = [
        Job(c, p, args.noise, args.search_seeds, args.reference_runs, args.band, args.long_run, hints)
        for c in cases
        for p in c.configs
    ]
    started = time.time()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(_measure, jobs))
    n = args.search_seeds
    print(
        f"{'scenario':26} {'config':38} {'sat':>6} {'default':>7} {'ref':>7} {'ref ±':>6} {'err':>7} "
        f"{'probes':>6} {'GPU min':>7} {'CPU s':>5}  over {n} search seeds: within 5 %, errors, checks met"
    )
    headline, errors, within, checks, met, gpu_min, always, ref_spread = [], [], 0, 0, 0, [], 0, []
    for r in rows:
        if "error" in r:
            print(f"{r['case']:26} {r['config']:38} did not start: {r['error']}")
            continue
        ref = r["reference"]
        ref_spread.append((max(r["references"]) - min(r["references"])) / ref if ref else math.nan)
        errs = [(s["rate"] / ref - 1) if ref else math.nan for s in r["searches"]]
        ok = [abs(e) <= TARGET for e in errs]
        first = r["searches"][0]
        headline.append(abs(errs[0]))
        errors += [abs(e) for e in errs]
        within += sum(ok)
        gpu_min += [s["gpu_s"] / 60 for s in r["searches"]]
        runs = [m for s in r["searches"] for _, m in s["checks"]]
        checks += len(runs)
        met += sum(runs)
        always += all(ok) and all(runs)
        spread = " ".join(f"{e:+.1%}" for e in errs)
        print(
            f"{r['case']:26} {r['config']:38} {first['saturation']:6.2f} {first['rate']:7.2f} {ref:7.2f} "
            f"{ref_spread[-1]:6.1%} {errs[0]:+7.1%} {first['probes']:6d} {first['gpu_s'] / 60:7.1f} "
            f"{first['cpu_s']:5.1f}  "
            f"{sum(ok)}/{n}  [{spread}]  {sum(runs)}/{len(runs)} met"
        )
    _per_scenario(rows)
    if hints:
        print_hinted(rows)
    if args.band:
        print_band(rows, args.band)
    if args.long_run:
        print_long_run(rows)
    print_reference_runs(rows)
    configs = len(headline)
    print(
        f"\n{configs} configs x {n} searches: |default - reference| / reference median "
        f"{statistics.median(errors):.1%}, max {max(errors):.1%}; within 5 %: {within}/{len(errors)} "
        f"searches (headline seed: {sum(e <= TARGET for e in headline)}/{configs} configs); "
        f"4,000-request checks met {met}/{checks}; configs with every search within 5 % and every "
        f"check met: {always}/{configs}; GPU time per capacity search median "
        f"{statistics.median(gpu_min):.1f} min (max {max(gpu_min):.1f}); {time.time() - started:.0f} s wall"
    )
    print(
        f"references: median of {args.reference_runs} bisections each; their spread (max - min) / median: "
        f"median {statistics.median(ref_spread):.1%}, max {max(ref_spread):.1%}"
    )
    return 0


def _per_scenario(rows: list[dict]) -> None:
    """Each scenario's capacities and GPU time per trial, over its configs and search seeds (docs/evidence.md,
    "GPU time of a capacity trial")."""
    print("\nper scenario, over configs x search seeds: capacity (req/s), GPU-minutes per capacity search")
    for case in dict.fromkeys(r["case"] for r in rows if "error" not in r):
        searches = [s for r in rows if r["case"] == case and "error" not in r for s in r["searches"]]
        rates = [s["rate"] for s in searches]
        gpu = [s["gpu_s"] / 60 for s in searches]
        print(
            f"  {case:26} {min(rates):.2f}-{max(rates):.2f} req/s, GPU min {min(gpu):.0f}-{max(gpu):.0f} "
            f"(median {statistics.median(gpu):.0f})"
        )


if __name__ == "__main__":
    sys.exit(main())
