"""Guided search against today's search and guide-based baselines: real GPU-hours to within the
measurement's resolution of the best config, on realities the guide does not know.

Reality: the simulated engine with a perturbed calibration (benchmarks/guided_search_realities.py).
A real trial of a grid config is the capacity search a trial runs (trial/capacity.py) on the simulated
engine with the reality's calibration and 2 % noise; it costs the simulated GPU time that search
charges (startup, saturation, probes; x TP). Ground truth: the same search, noise off, on the union of
every config any strategy measured and the reality's own top 50 by its fast estimate (not the whole
grid: see benchmarks/guided_search_trials.py). Searches are cached in runs/guided_search/trials/<code>/.
Configs the guide's memory model predicts not to start are not launched by any strategy (the run's
startup screen).

Strategies, each from vLLM's defaults as trial #0 (guided: as trial #1, after the guide's best):
  auto        today's `autotune run` sampler (TPE), its suggestions snapped to the grid
  random      uniform over the grid
  guide-only  the guide's best config, confirmed by measuring it
  stack-rank  the guide's ranking, measured in order
  guided      tune/guided.py (the speed refit, the residual GP, EI, its budget and 95 %-bound stops)
  guided-bracket  the same, each trial's capacity search started from the corrected prediction
  guided-defaults-first  the same with vLLM's defaults as trial #0 (the order before guide-first)
  guided-fixed-noise     the same with the measurement's noise held at the resolution (not learned)
  guided-near-defaults   the same, configs it scores equal broken toward vLLM's defaults (--strategies)
  guided-unrefined       the same from the guide's fast estimate alone, its top not searched in full
  guided-ties            the same, a pick by best prediction taking the first of those within 3 % of it
Per strategy and case, over seeds x realities: GPU-hours and trials until the recommendation (the best
measured so far) is within RESOLUTION of the reality's best (its true value), and the regret at the
budget (guided: where it stopped); then the run's end as `autotune run` ends it (benchmarks/
guided_search_end.py: the top and the defaults re-measured with --repeats other seeds, the guided runs'
repeats within the budget), the regret of its pick and of what it deploys, and the GPU-hours with the
repeats. Usage: python benchmarks/guided_search.py [--quick] [--cases ...]
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import Parser, add_names, noise, positive, whole  # noqa: E402
from guide_accuracy import Case, cases  # noqa: E402
from guided_search_end import finish  # noqa: E402
from guided_search_realities import QUICK, REALITIES, Reality, realities  # noqa: E402
from guided_search_trials import NOISE, SEARCHING, TRUTH_TOP, Measured, Trials, TruthSpec  # noqa: E402

from autotune.catalog.gpus import get_gpu  # noqa: E402
from autotune.commands.run_options import DEFAULT_REPEATS  # noqa: E402
from autotune.tune.guide import code_digest, predict_points, predict_space  # noqa: E402
from autotune.tune.guide_check import replayer  # noqa: E402
from autotune.tune.guide_refine import refine_table, search_points  # noqa: E402
from autotune.tune.guide_refit import Refit  # noqa: E402
from autotune.tune.guided import GuidedOptions, GuidedSearch  # noqa: E402
from autotune.tune.objectives import Objective  # noqa: E402
from autotune.tune.result_attrs import INFO_ATTR  # noqa: E402
from autotune.tune.samplers import make_sampler  # noqa: E402
from autotune.tune.space import violations  # noqa: E402
from autotune.tune.study import config_key  # noqa: E402

RUNS = Path("runs/guided_search")
OBJECTIVE = Objective("output_throughput", "maximize")
RESOLUTION = 0.03
FIRST_TRIAL_GPU_MIN = 20.0  # the guided run's cost estimate before its first trial (the pre-run estimate's)
MAX_TRIALS = 50
STRATEGIES = ("auto", "random", "guide-only", "stack-rank", "guided")
# --ablation: the residual as one global bias (no local part); over the flags alone (no operating point);
# the residual model without the speed refit; vLLM's defaults measured first; the noise not learned
DEFAULTS_FIRST = "guided-defaults-first"
NEAR_DEFAULTS = "guided-near-defaults"
UNREFINED = "guided-unrefined"
RESOLUTION_TIES = "guided-ties"
UNCHECKED = "guided-unchecked"  # the stop never trusts the guide's predictions (GuidedOptions.check_bursts)
# it trusts them, and bounds those not searched in full by the fast estimate's error (GuidedOptions.settle)
UNSETTLED = "guided-unsettled"
LOCAL = "guided-local"  # ... and keeps its residual GP's local part where the model is adequate (level)
ABLATION = (
    "guided-bias",
    "guided-flags",
    "guided-residual",
    DEFAULTS_FIRST,
    "guided-fixed-noise",
    UNCHECKED,
    UNSETTLED,
    LOCAL,
)
BRACKET = "guided-bracket"
# every name run_strategy runs (an unknown one would be run as another)
KNOWN_STRATEGIES = (*STRATEGIES, *ABLATION, BRACKET, NEAR_DEFAULTS, UNREFINED, RESOLUTION_TIES)
optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class World:
    """One case under one reality: the guide's view, the reality's searches, the space's grid."""

    case: Case
    reality: Reality
    guide: GuidedSearch  # built once; each guided run uses a fresh study
    fast_guide: GuidedSearch  # the same on the fast estimate alone (UNREFINED)
    trials: Trials
    baseline: dict
    tp: int
    refit: Refit  # its point predictions are kept across the world's runs
    grid_keys: dict[str, dict] = field(default_factory=dict)  # key -> params (grid points, the defaults)
    launchable: set[str] = field(default_factory=set)  # the guide's memory model says it starts
    reality_top: list[str] = field(default_factory=list)  # the reality's best by its fast estimate


@dataclass
class Trace:
    """A strategy's run: per trial, GPU-hours after it and the recommendation (best measured so far)."""

    seed: int
    gpu_h: list[float] = field(default_factory=list)
    rec_keys: list[str] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    probes: list[int] = field(default_factory=list)
    best_measured: float = 0.0

    def add(self, world: World, key: str, hint: float | None = None) -> Measured:
        """Measure `key`: its capacity search (run, or read from the cache)."""
        m = world.trials.measure(key, world.grid_keys[key], self.seed, hint)
        if m.value > self.best_measured or not self.rec_keys:
            self.best_measured = max(m.value, self.best_measured)
            self.rec_keys.append(key)
        else:
            self.rec_keys.append(self.rec_keys[-1])
        self.gpu_h.append((self.gpu_h[-1] if self.gpu_h else 0.0) + m.gpu_s / 3600)
        self.measured.append(key)
        self.values.append(m.value)
        self.probes.append(m.probes)
        return m

    def reached(self, truth: dict[str, float], best: float, budget_h: float) -> tuple[float, int] | None:
        """(GPU-hours, trials) when the recommendation first came within RESOLUTION of `best` (None: not
        within the budget)."""
        for i, key in enumerate(self.rec_keys):
            if self.gpu_h[i] <= budget_h + 1e-9 and truth[key] >= (1 - RESOLUTION) * best:
                return self.gpu_h[i], i + 1
        return None

    def within(self, budget_h: float) -> int:
        """How many of its trials ended inside the budget (a search's cost is known once it ran)."""
        return sum(h <= budget_h + 1e-9 for h in self.gpu_h)

    def regret(self, truth: dict[str, float], best: float, budget_h: float) -> float:
        """The best single run's regret (the recommendation before any repeat)."""
        n = self.within(budget_h)
        return 1 - (truth[self.rec_keys[n - 1]] if n else 0.0) / best


def build_world(case: Case, reality: Reality, processes: int) -> World:
    space, workload, slos = case.space(), case.workload(), case.scenario.slo_list()
    gpu = get_gpu(space.gpu)
    baseline = space.baseline_params(gpu.memory_gib, None)
    fast_table = predict_space(space, workload, slos, runs_dir=RUNS, processes=processes)
    guide_table = refine_table(fast_table, space, workload, slos, OBJECTIVE, processes=processes)
    guide_extra = predict_points(space, [baseline], workload, slos)
    cal = reality.calibration()
    table = predict_space(space, workload, slos, calibration=cal, runs_dir=RUNS, processes=processes)
    extra = {p.key: p for p in guide_extra.predictions}
    guide = GuidedSearch(guide_table, space, OBJECTIVE, extra=extra)
    fast_guide = GuidedSearch(fast_table, space, OBJECTIVE, extra=extra)
    refit = Refit(
        lambda c: predict_space(space, workload, slos, calibration=c, runs_dir=RUNS, processes=processes),
        lambda c, points: predict_points(space, points, workload, slos, c).predictions,
        OBJECTIVE,
        guide_table.tensor_parallel_size,
        scale_of=guide_table.scale_of,
        replay=replayer(space, workload),
        search=lambda c, points: search_points(space, points, workload, slos, c, processes)[0],
    )
    slug = "".join(c if c.isalnum() else "-" for c in reality.name)
    # keyed by the code a search runs (SEARCHING): a changed model or search measures anew
    cache = RUNS / "trials" / code_digest(SEARCHING) / case.name / f"{slug}.json"
    trials = Trials(cache, case, cal, OBJECTIVE)
    world = World(case, reality, guide, fast_guide, trials, baseline, guide_table.tensor_parallel_size, refit)
    world.grid_keys = {p.key: p.params for p in [*guide_table.predictions, *guide_extra.predictions]}
    world.launchable = {p.key for p in [*guide_table.predictions, *guide_extra.predictions] if p.starts}
    world.reality_top = [p.key for p in table.ranking(OBJECTIVE)[:TRUTH_TOP]]
    return world


def run_strategy(name: str, world: World, seed: int, budget_h: float) -> Trace:
    if name not in KNOWN_STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}")
    rng = random.Random(zlib.crc32(f"{name}/{world.reality.name}/{seed}".encode()))
    trace = Trace(seed)
    space = world.case.space()
    base_key = config_key(space.config(world.baseline))
    if name.startswith("guided"):
        return _guided(world, trace, budget_h, name)
    trace.add(world, base_key)
    if name in ("guide-only", "stack-rank"):
        ranked = [p.key for p in world.guide.table.ranking(OBJECTIVE) if p.key != base_key]
        for key in ranked[: 1 if name == "guide-only" else MAX_TRIALS - 1]:
            if trace.gpu_h[-1] >= budget_h:
                break
            trace.add(world, key)
        return trace
    keys = list(world.grid_keys)
    sampler = make_sampler("auto", space.grid(), seed, MAX_TRIALS) if name == "auto" else None
    study = optuna.create_study(direction="maximize", sampler=sampler) if sampler else None
    tried = {base_key}
    for _ in range(MAX_TRIALS * 5):
        if len(trace.gpu_h) >= MAX_TRIALS:
            break
        if study is not None:
            trial = study.ask()
            key = _snap(world, space.suggest(trial))
        else:
            key = rng.choice(keys)
        if key not in world.launchable or key in tried:  # screened, invalid, or measured: free
            if study is not None:
                study.tell(trial, trace.best_measured if key in tried else 0.0)
            continue
        if trace.gpu_h[-1] >= budget_h:  # a search's cost is known once it ran: regret counts to the budget
            break
        tried.add(key)
        value = trace.add(world, key).value
        if study is not None:
            study.tell(trial, value)
    return trace


def _guided(world: World, trace: Trace, budget_h: float, name: str) -> Trace:
    guide = world.fast_guide if name == UNREFINED else world.guide
    first_s = FIRST_TRIAL_GPU_MIN * 60 * world.tp
    local, flags_only = name != "guided-bias", name == "guided-flags"
    options = GuidedOptions(
        budget_h,
        first_trial_gpu_s=first_s,
        local=local,
        operating_point=not flags_only,
        learn_noise=name != "guided-fixed-noise",
        bracket=name == BRACKET,
        prefer_defaults=name == NEAR_DEFAULTS,
        resolution_ties=name == RESOLUTION_TIES,
        check_bursts=name != UNCHECKED,
        settle=name != UNSETTLED,
        level=name not in (UNSETTLED, LOCAL),
    )
    guide.options = options
    # one refit (its point predictions shared), on the scale of the table it refits
    refit = dataclasses.replace(world.refit, scale_of=lambda key: 1.0) if name == UNREFINED else world.refit
    guide.refit = None if name == "guided-residual" else refit
    guide.reset()  # from the guide's own calibration, whatever an earlier run refitted
    space = world.case.space()
    study = optuna.create_study(direction="maximize")
    guide.baseline = None if name == DEFAULTS_FIRST else dict(world.baseline)  # None: enqueued here, first
    if name == DEFAULTS_FIRST:
        study.enqueue_trial(dict(world.baseline), user_attrs={"baseline": True})
    while len(trace.gpu_h) < MAX_TRIALS:
        if guide.step(study) is not None:
            break
        trial = study.ask()
        config = space.config(space.suggest(trial))
        key = config_key(config)
        if violations(config) or key not in world.launchable:
            trial.set_user_attr("launched", False)
            study.tell(trial, 0.0)
            continue
        m = trace.add(world, key, guide.hint_rate(trial))
        for attr_name, attr in (("config_key", key), ("feasible", m.value > 0), ("gpu_seconds", m.gpu_s)):
            trial.set_user_attr(attr_name, attr)
        trial.set_user_attr(INFO_ATTR, {"saturation_bursts": m.bursts})  # as a run stores them
        study.tell(trial, m.value)
    return trace


def _snap(world: World, params: dict) -> str:
    """The grid point nearest `params` (log distance for numbers): TPE samples the whole space."""
    grid = world.case.space().grid(5)
    snapped = {}
    for name, values in grid.items():
        value = params[name]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            snapped[name] = min(values, key=lambda v: abs(math.log(v / value)))
        else:
            snapped[name] = value
    return config_key(world.case.space().config(snapped))


def main() -> None:
    parser = Parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="the small space, 4 realities, 2 seeds")
    add_names(parser, "--cases", cases(), "default: default-run 70b-a100-tp2-chat (--quick: default-run)")
    parser.add_argument("--seeds", type=whole(1), default=None, help="default: 3 (--quick: 2)")
    parser.add_argument("--budget", type=positive, default=4.0, help="GPU-hours per GPU of a replica")
    parser.add_argument("--processes", type=whole(1), default=2)
    add_names(parser, "--strategies", KNOWN_STRATEGIES, f"default: {' '.join(STRATEGIES)}")
    parser.add_argument("--ablation", action="store_true", help=f"also {', '.join(ABLATION)}")
    parser.add_argument("--bracket", action="store_true", help=f"also {BRACKET} (bracketed searches)")
    quick = ", ".join(QUICK).replace("%", "%%")  # argparse's help is a %-format
    add_names(parser, "--realities", [r.name for r in REALITIES], f"default: all (--quick: {quick})")
    parser.add_argument("--truth-seeds", type=whole(1), default=1, help="seeds the ground truth averages")
    parser.add_argument(
        "--truth-noise",
        type=noise,
        default=0.0,
        help=f"the truth's searches with this noise (trials: {NOISE:g})",
    )
    parser.add_argument(
        "--repeats", type=whole(0), default=DEFAULT_REPEATS, help="the run's --repeats at the end (0: none)"
    )
    args = parser.parse_args()
    outside = [r for r in args.realities or () if args.quick and r not in QUICK]
    if outside:
        parser.error(f"argument --realities: --quick runs only {', '.join(QUICK)}, not {', '.join(outside)}")
    strategies = tuple(args.strategies or STRATEGIES) + (ABLATION if args.ablation else ())
    strategies += (BRACKET,) if args.bracket else ()
    known = cases()
    if args.quick:
        known["default-run"] = Case(known["default-run"].scenario, "small")
    names = args.cases or (["default-run"] if args.quick else ["default-run", "70b-a100-tp2-chat"])
    seeds = args.seeds or (2 if args.quick else 3)
    wall, cpu = time.monotonic(), time.process_time()
    for name in names:
        chosen = [r for r in realities(args.quick) if not args.realities or r.name in args.realities]
        report_case(
            known[name],
            chosen,
            seeds,
            args.budget,
            args.processes,
            strategies,
            TruthSpec(args.truth_seeds, args.truth_noise),
            args.repeats,
        )
    print(f"\nwall {time.monotonic() - wall:.0f} s, CPU (this process) {time.process_time() - cpu:.0f} s")


def report_case(
    case: Case,
    worlds_of: list[Reality],
    seeds: int,
    budget: float,
    processes: int,
    strategies: tuple[str, ...],
    truth_spec: TruthSpec,
    repeats: int = DEFAULT_REPEATS,
) -> None:
    results: dict[tuple[str, str], list[tuple[float, ...]]] = {}
    for reality in worlds_of:
        began = time.monotonic()
        world = build_world(case, reality, processes)
        budget_h = budget * world.tp
        _progress(f"{case.name}: {reality.name}: its tables", began)
        traces: dict[tuple[str, int], Trace] = {}
        for s in strategies:
            began = time.monotonic()
            for seed in range(seeds):
                traces[s, seed] = run_strategy(s, world, seed, budget_h)
            _progress(f"{case.name}: {reality.name}: {s}, {seeds} seeds", began)
        base_key = config_key(case.space().config(world.baseline))
        ends = {
            (s, seed): finish(
                world, t, t.within(budget_h), base_key, repeats, budget_h if s.startswith("guided") else None
            )
            for (s, seed), t in traces.items()
        }
        world.trials.save()
        keys = {k for t in traces.values() for k in t.measured} | set(world.reality_top)
        truth = world.trials.truth([(k, world.grid_keys[k]) for k in keys], processes, truth_spec)
        world.trials.save()
        best = max(truth.values())
        for (strategy, seed), trace in traces.items():
            hit = trace.reached(truth, best, budget_h)
            row = (*(hit or (math.inf, 10**6)), trace.regret(truth, best, budget_h), trace.gpu_h[-1])
            row += (statistics.fmean(trace.probes), len(trace.gpu_h), 60 * trace.gpu_h[-1] / len(trace.gpu_h))
            end = ends[strategy, seed]
            row += tuple(1 - (truth[k] if k else 0.0) / best for k in (end.picked, end.deployed))
            row += (trace.gpu_h[-1] + end.gpu_h,)
            results.setdefault((strategy, reality.group), []).append(row)
        note = f"  {case.name}: {reality.name} done ({len(truth)} configs in its truth)"
        print(note, file=sys.stderr, flush=True)
    budget_h = budget * (2 if "tp2" in case.name else 1)
    print(
        f"\n## {case.name} (budget {budget_h:g} GPU-h; {seeds} seeds; {truth_spec}; "
        f"{repeats} repeats at the end)"
    )
    head = "GPU-h to 3 % med | p90 | trials med | p90 | regret med | p90 | regret <= 3 % | GPU-h spent med"
    tail = "picked regret med | p90 | <= 3 % | deployed regret med | <= 3 % | GPU-h with repeats med"
    print(
        f"| strategy | realities | runs | {head} | trials run med | probes/trial | GPU-min/trial | {tail} |"
    )
    print("|---" * 20 + "|")
    for group in ("identity", "tuned", "structural", "held-out"):
        for strategy in strategies:
            rows = results.get((strategy, group))
            if rows:
                print(_line(strategy, group, rows))


def _progress(what: str, began: float) -> None:
    """A line on stderr as a step ends: a case takes minutes, and stdout holds only its tables."""
    print(f"  {what} done in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)


def _line(strategy: str, group: str, rows: list[tuple[float, ...]]) -> str:
    columns = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
    hours, trials, regret, spent, probes, ran, per_trial, picked, deployed, total = columns

    def q(x: np.ndarray, p: float, fmt: str) -> str:
        value = float(np.percentile(x, p, method="higher"))
        return "never" if value >= 1e5 or math.isinf(value) else format(value, fmt)

    ok = _share_within(regret)
    return (
        f"| {strategy} | {group} | {len(rows)} | {q(hours, 50, '.2f')} | {q(hours, 90, '.2f')} | "
        f"{q(trials, 50, '.0f')} | {q(trials, 90, '.0f')} | {np.median(regret):.1%} | "
        f"{np.percentile(regret, 90):.1%} | {ok:.0%} | {np.median(spent):.2f} | {np.median(ran):.0f} | "
        f"{np.mean(probes):.1f} | {np.mean(per_trial):.1f} | {np.median(picked):.1%} | "
        f"{np.percentile(picked, 90):.1%} | {_share_within(picked):.0%} | {np.median(deployed):.1%} | "
        f"{_share_within(deployed):.0%} | {np.median(total):.2f} |"
    )


def _share_within(regrets: np.ndarray) -> float:
    return statistics.fmean(float(r <= RESOLUTION) for r in regrets)


if __name__ == "__main__":
    main()
