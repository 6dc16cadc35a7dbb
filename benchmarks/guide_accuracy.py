"""How well does the guide's fast estimate rank configs, against the capacity search a trial runs?

For each case (a search space, workload and SLOs; the cases come from benchmarks/scenarios.py, and the
first is the README's default run), on the simulated engine:
- the guide: `predict_space` on the case's whole grid (autotune/tune/guide.py), in a fresh runs dir;
- the full search: `find_capacity` as `autotune run` runs a trial (autotune/trial/capacity.py), on a
  random sample (`--sample`, seeded) of the grid points that start;
and prints, per case: the grid size and how many start (the guide's startup verdicts against the
simulated server's on every grid point), Spearman's rank correlation of capacity between the two on
the sample, how many of the search's top 10 the guide's top 10 holds, the guide's median and 90th-
percentile relative error of capacity (configs the search gives a capacity), and the CPU seconds per
config of each (process CPU time, summed over worker processes: the guide's amortized over the grid,
the search's per sampled config). The search's results are cached in runs/guide_accuracy/ (keyed by
the case and the source of the code that measures): the guide is what changes between runs.

    python benchmarks/guide_accuracy.py [--cases NAME ...] [--sample 60] [--processes 2] [--detail DIR]

`--detail DIR` writes DIR/<case>.csv: each sampled config's flags, the guide's capacity and knee, the
search's capacity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import Parser, add_names, folder, whole  # noqa: E402
from scenarios import Scenario, get_scenarios  # noqa: E402

from autotune.backends.sim import SimBackend, SimSession  # noqa: E402
from autotune.catalog.models import get_model  # noqa: E402
from autotune.core.procs import worker_pool  # noqa: E402
from autotune.trial.capacity import find_capacity  # noqa: E402
from autotune.tune.guide import code_digest, predict_space  # noqa: E402
from autotune.tune.space import SearchSpace, load_space, violations  # noqa: E402
from autotune.tune.study import config_key  # noqa: E402

CACHE = Path("runs/guide_accuracy")
TOP = 10
MEASURING = ("sim", "catalog", "workloads", "measure", "trial", "backends/sim.py", "core/config.py")


@dataclass(frozen=True)
class Case:
    """A scenario's workload and SLOs on a search space (its own discretized one, or a space file)."""

    scenario: Scenario
    space_file: str | None = None  # None: the scenario's space

    @property
    def name(self) -> str:
        return self.scenario.name

    def space(self) -> SearchSpace:
        if self.space_file is None:
            return self.scenario.space()
        space = load_space(self.space_file).with_overrides(self.scenario.model, self.scenario.gpu)
        if not self.scenario.workload_spec().shares_prefixes:  # as `autotune run` does (no effect)
            space = space.fix("enable_prefix_caching", True)
        return space

    def workload(self):  # noqa: ANN201
        # Capacity is an open-loop rate: a client-side concurrency cap would make it another thing.
        return dataclasses.replace(self.scenario.workload_spec(), max_concurrency=None)


def cases() -> dict[str, Case]:
    """The cases: the README's default run, and scenarios.py's prefill, 70B and L4 ones."""
    chat, prefill, big, small = get_scenarios(
        ["8b-h100-chat", "8b-h100-prefill-tight", "70b-a100-tp2-chat", "8b-l4-decode"]
    )
    default = dataclasses.replace(
        chat, name="default-run", description="the README's run", overrides={}, slos=("ttft_p99=2s",)
    )
    return {c.name: c for c in (Case(default, "vllm"), Case(prefill), Case(big), Case(small))}


def main() -> None:
    """Print the guide's agreement with the capacity search, per case."""
    parser = Parser(__doc__)
    add_names(parser, "--cases", cases(), "default: all")
    parser.add_argument("--sample", type=whole(1), default=60, help="configs the full search runs per case")
    parser.add_argument("--processes", type=whole(1), default=2)
    parser.add_argument("--seed", type=int, default=0, help="of the sample")
    parser.add_argument("--detail", type=folder, help="write per-config CSVs here")
    args = parser.parse_args()
    known = cases()
    chosen = [known[n] for n in args.cases] if args.cases else list(known.values())
    print(
        f"{'case':24} {'grid':>5} {'start':>5} {'agree':>5} {'n':>3} {'spearman':>8} {'top10':>5} "
        f"{'err med':>7} {'err p90':>7} {'guide cpu/cfg':>13} {'search cpu/cfg':>14} {'guide wall':>10}"
    )
    for case in chosen:
        print(_row(case, args.sample, args.processes, args.seed, args.detail), flush=True)


def _row(case: Case, sample_size: int, processes: int, seed: int, detail: Path | None) -> str:
    space = case.space()
    workload, slos = case.workload(), case.scenario.slo_list()
    with tempfile.TemporaryDirectory() as runs:
        wall = time.monotonic()
        table = predict_space(space, workload, slos, runs_dir=Path(runs), processes=processes)
        wall = time.monotonic() - wall
    starting = [p for p in table.predictions if p.starts]
    agree = sum(_starts(space, p.params) == p.starts for p in table.predictions)
    rng = random.Random(seed)
    sample = sorted(rng.sample(starting, min(sample_size, len(starting))), key=lambda p: p.key)
    full = _full_search(case, space, [p.params for p in sample], processes)
    guide_caps = np.array([p.capacity_rate for p in sample])
    full_caps = np.array([full[p.key][0] for p in sample])
    errors = [abs(g / f - 1) for g, f in zip(guide_caps, full_caps, strict=True) if f > 0]
    search_cpu = float(np.mean([full[p.key][1] for p in sample]))
    if detail is not None:
        _write_detail(detail / f"{case.name}.csv", sample, full)
    return (
        f"{case.name:24} {len(table.predictions):5d} {len(starting):5d} {agree:5d} {len(sample):3d} "
        f"{spearman(guide_caps, full_caps):8.3f} {_top_overlap(sample, guide_caps, full_caps):5d} "
        f"{np.median(errors):7.1%} {np.percentile(errors, 90):7.1%} "
        f"{table.cpu_s / len(table.predictions):13.3f} {search_cpu:14.2f} {wall:9.1f}s"
    )


def _write_detail(path: Path, sample: list, full: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(sample[0].params)
    lines = [",".join([*names, "guide_capacity", "guide_knee", "search_capacity"])]
    for p in sorted(sample, key=lambda p: -full[p.key][0]):
        values = [
            *(str(p.params[n]) for n in names),
            str(p.capacity_rate),
            str(p.knee_rate),
            str(full[p.key][0]),
        ]
        lines.append(",".join(values))
    path.write_text("\n".join(lines) + "\n")


def _starts(space: SearchSpace, params: dict) -> bool:
    """Whether the simulated server starts with this grid point (the validity rules first)."""
    config = space.config(params)
    if violations(config, get_model(space.model).max_position_embeddings):
        return False
    return SimSession(config, space.gpu).alive


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties get their average rank)."""
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for value in np.unique(x):  # ties: their mean rank
        ranks[x == value] = ranks[x == value].mean()
    return ranks


def _top_overlap(sample: list, guide: np.ndarray, full: np.ndarray) -> int:
    """How many of the search's TOP configs (by capacity) are among the guide's TOP."""
    top = min(TOP, len(sample))
    best_full = set(np.argsort(-full, kind="stable")[:top])
    best_guide = set(np.argsort(-guide, kind="stable")[:top])
    return len(best_full & best_guide)


def _full_search(case: Case, space: SearchSpace, points: list[dict], processes: int) -> dict:
    """config key -> (capacity, CPU seconds) of the capacity search on each point (cached)."""
    keys = [config_key(space.config(p)) for p in points]
    digest = hashlib.sha256(
        json.dumps([case.scenario.digest(), keys, code_digest(MEASURING)]).encode()
    ).hexdigest()[:12]
    path = CACHE / f"{case.name}-{digest}.json"
    if path.is_file():
        return {k: tuple(v) for k, v in json.loads(path.read_text()).items()}
    jobs = [(case, space.config(p)) for p in points]
    with worker_pool(processes) if processes > 1 else ProcessPoolExecutor(1) as pool:
        results = list(pool.map(_search_one, jobs))
    out = dict(zip(keys, results, strict=True))
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


def _search_one(job: tuple) -> tuple[float, float]:
    case, config = job
    start = time.process_time()
    result = find_capacity(SimBackend(case.scenario.gpu), config, case.workload(), case.scenario.slo_list())
    return (result.capacity.rate if result.capacity else 0.0), time.process_time() - start


if __name__ == "__main__":
    main()
