"""The plain Poisson runs benchmarks/capacity_accuracy.py makes beside its searches, and what they show.

- `check`: a 4,000-request run at a rate, as a user would verify a reported capacity.
- the band (`--band N`): N checks at 0.95 x the reference, the lowest rate within the 5 % target.
- the long run (`--long-run N`): N runs of 10,000 requests at 0.95, 1.00 and 1.05 x the reference:
  each percentile SLO's share of requests over its limit there.
- the references' reproducibility: each reference bisection against the median of the others, and
  checks at each one's rate, as at a search's.
"""

from __future__ import annotations

import statistics
from typing import Any

from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig
from autotune.measure.result import TrialResult
from autotune.measure.slo import Slo

CHECK_REQUESTS = 4000
CHECK_SERVED = 0.95
TARGET = 0.05  # |default - reference| / reference
LONG_RUN_REQUESTS = 10_000  # the reference's window
LONG_RUN_WARMUP = 1000
LONG_RUN_FACTORS = (0.95, 1.0, 1.05)  # x the reference


def poisson_run(
    backend: SimBackend,
    config: EngineConfig,
    workload: Any,
    slos: list[Slo],
    rate: float,
    seed: int,
    requests: int,
    warmup: int = 0,
) -> TrialResult:
    """One Poisson run of `requests` measured ones at `rate` (after `warmup` unmeasured), on its own
    server: capacity is a Poisson rate (a trace replay's rows at Poisson arrivals)."""
    load = workload.with_rate_arrivals().with_load(
        request_rate=rate, num_requests=warmup + requests, measure_from=warmup / rate
    )
    with backend.session(config) as session:
        return session.measure(load, slos, seed)


def check(
    backend: SimBackend, config: EngineConfig, workload: Any, slos: list[Slo], rate: float, seed: int
) -> tuple[float, bool]:
    """A 4,000-request Poisson run at `rate`, as a user would verify it: (served share, SLOs met)."""
    run = poisson_run(backend, config, workload, slos, rate, seed, CHECK_REQUESTS)
    steady = run.load.steady if run.load is not None else None
    served = steady.served_rate / max(steady.offered_rate, 1e-9) if steady is not None else 0.0
    # As a user would verify it: served >= 95 % of the offered rate, every SLO met.
    met = run.ok and served >= CHECK_SERVED and all(s.margin(run.benchmark) <= 0 for s in slos)
    return served, met


def shares(
    backend: SimBackend, config: EngineConfig, workload: Any, slos: list[Slo], rate: float, seed: int
) -> dict[str, float]:
    """Each percentile SLO's share of samples over its limit in a LONG_RUN_REQUESTS run at `rate`,
    measured after LONG_RUN_WARMUP requests."""
    run = poisson_run(backend, config, workload, slos, rate, seed, LONG_RUN_REQUESTS, LONG_RUN_WARMUP)
    allowed = {s.name: s.allowed_share for s in slos}
    evidence = (run.load.slo_evidence if run.load is not None else None) or ()
    return {c.name: c.margin + allowed[c.name] for c in evidence if allowed[c.name]}


def print_band(rows: list[dict], n: int) -> None:
    """How often a 4,000-request run at the lowest rate within TARGET of the reference meets the SLOs:
    where they often miss, the two targets leave a search no rate that meets both reliably."""
    edge = f"{1 - TARGET:.2f} x reference (the lowest rate within {TARGET * 100:.0f} %)"
    print(f"\nat {edge}: 4,000-request runs met the SLOs")
    thin = []
    for r in rows:
        if "error" in r:
            continue
        met = sum(r["band"])
        print(f"  {r['case']:26} {r['config']:38} {met:3d}/{n}")
        if met < 0.95 * n:
            thin.append(f"{r['case']} {r['config']}")
    print(f"configs where fewer than 95 % met: {len(thin)}" + (f" ({'; '.join(thin)})" if thin else ""))


def print_long_run(rows: list[dict]) -> None:
    """Each percentile SLO's long-run share over its limit at LONG_RUN_FACTORS x the reference (mean
    over the runs, at least 2; at the reference also their SD). A bisection reports the highest rate one
    window passed, so where windows scatter it can land above the rate its own rule holds at in the long run
    (p99: a share of at most 1 % minus its margin); the rates around it show how fast the share grows
    there, which is how finely a search can place the threshold."""
    factors = " / ".join(f"{f:.2f}" for f in LONG_RUN_FACTORS)
    print(
        f"\nlong run: each percentile SLO's share of requests over its limit at {factors} x the reference "
        "(mean over 10,000-request runs; SD at the reference)"
    )
    for r in rows:
        runs = r.get("long_run") or {}
        if "error" in r or not runs or not runs[1.0] or not runs[1.0][0]:
            continue
        parts = []
        for name in runs[1.0][0]:
            values = {f: [run[name] for run in runs[f]] for f in LONG_RUN_FACTORS}
            curve = " / ".join(f"{statistics.mean(v):.2%}" for v in values.values())
            parts.append(f"{name} {curve} (SD {statistics.stdev(values[1.0]):.2%})")
        print(f"  {r['case']:26} {r['config']:38} " + "; ".join(parts))


def print_reference_runs(rows: list[dict]) -> None:
    """How closely the reference reproduces itself (each of its bisections, of other requests, against
    the median of the others), and whether its own rates pass the checks a search's must: a search
    cannot be held closer to the reference than the reference to itself."""
    print(
        "\nreference bisections: each against the median of the others (within 5 %), "
        "and 4,000-request checks at each one's rate"
    )
    within, total, met, checks = 0, 0, 0, 0
    for r in rows:
        refs = r.get("references") or []
        if "error" in r or not refs:
            continue
        errs = (
            [x / statistics.median(refs[:j] + refs[j + 1 :]) - 1 for j, x in enumerate(refs)]
            if len(refs) > 1
            else []
        )
        ok = sum(abs(e) <= TARGET for e in errs)
        runs = [m for per_rate in r["reference_checks"] for m in per_rate]
        within, total, met, checks = within + ok, total + len(errs), met + sum(runs), checks + len(runs)
        spread = " ".join(f"{e:+.1%}" for e in errs)
        print(f"  {r['case']:26} {r['config']:38} {ok}/{len(errs)}  [{spread}]  {sum(runs)}/{len(runs)} met")
    print(
        f"reference bisections within 5 % of the others' median: {within}/{total}; "
        f"4,000-request checks at their rates met {met}/{checks}"
    )


def print_hinted(rows: list[dict]) -> None:
    """The default search beside the bracketed ones, over every config x search seed."""
    print("\nsearch             within 5 %  checks met  probes med  GPU min med (sum)")
    kinds = {"default": [(r, s) for r in rows if "error" not in r for s in r["searches"]]}
    for f in dict.fromkeys(f for r in rows if "error" not in r for f in r["hinted"]):
        kinds[f"hint {f:g} x ref"] = [(r, s) for r in rows if "error" not in r for s in r["hinted"][f]]
    for name, pairs in kinds.items():
        within = sum(abs(s["rate"] / r["reference"] - 1) <= TARGET for r, s in pairs if r["reference"])
        met = [m for _, s in pairs for _, m in s["checks"]]
        gpu = [s["gpu_s"] / 60 for _, s in pairs]
        probes = statistics.median(s["probes"] for _, s in pairs)
        print(
            f"{name:18} {within:>4}/{len(pairs):<5} {sum(met):>5}/{len(met):<5} {probes:>10g} "
            f"{statistics.median(gpu):>8.1f} ({sum(gpu):.0f})"
        )
