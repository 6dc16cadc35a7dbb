"""`autotune run --guide sim`: the guided search's options, its setup before the run and what it writes
and prints after (tune/guided.py has the strategy; docs/guided-search.md the method and its figures)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from autotune.core import values
from autotune.core.inputs import arg
from autotune.core.json_out import json_text

GUIDES = ("sim", "none")
CALIBRATION_FILE = "calibration.yaml"
PROGRESS_EVERY_S = 30.0


def add_guide_options(parser: Any) -> None:
    """--guide, --guide-calibration, --guide-top, --gpu-hours."""

    parser.add_argument(
        "--guide",
        choices=GUIDES,
        help="sim: choose real trials from the simulator's prediction of the whole space, corrected by each "
        "measurement (default with --backend vllm|docker); none: the sampler alone (default with sim)",
    )
    parser.add_argument(
        "--guide-calibration",
        metavar="FILE",
        help="the guide's simulator constants (default: the built-in ones; a guided run writes "
        f"runs/<study>/{CALIBRATION_FILE} to reuse here on the same GPU)",
    )
    parser.add_argument(
        "--guide-top",
        type=arg(values.bounded_int, 0),
        metavar="N",
        help="measure the guide's N best configs by the full simulated capacity search before the first "
        "trial, 0.5-3 CPU-s each (default 16, tune/guide_refine.py REFINE_TOP; 0: the fast estimate alone)",
    )
    parser.add_argument(
        "--gpu-hours",
        type=arg(values.positive_number),
        help="guided runs: a cap on the GPU-hours spent (each trial's search stops at its share of it)",
    )


def guide_on(args: argparse.Namespace) -> bool:
    """Whether the run is guided: --guide, else on for a real backend and off for the simulated one."""
    return (args.guide or ("none" if args.backend == "sim" else "sim")) == "sim"


def check_guide_options(args: argparse.Namespace, workload: Any, unmodelled: str | None = None) -> Any:
    """The guide's calibration (None when the run is not guided); one AutotuneError line for bad input.
    `unmodelled`: why the simulated engine cannot predict the space (sim/flags.py; None: it can)."""
    from autotune.core.errors import AutotuneError
    from autotune.sim.calibration import calibration_option

    guided = guide_on(args)
    if not guided:
        for option, value in (
            ("--gpu-hours", args.gpu_hours),
            ("--guide-calibration", args.guide_calibration),
            ("--guide-top", args.guide_top),
        ):
            if value is not None:
                raise AutotuneError(f"{option} needs a guided run (--guide sim)")
        return None
    if workload.load != "capacity":
        if args.guide == "sim" and getattr(args, "load", None) == workload.load:
            raise AutotuneError(f"--guide sim needs capacity load; --load {workload.load} asks for another")
        if args.guide == "sim":
            raise AutotuneError(
                f"--guide sim needs capacity load (workload {workload.name} is at {workload.load} load): "
                "pass --load capacity"
            )
        print(f"autotune: no guide: workload {workload.name} is at {workload.load} load", file=sys.stderr)
        args.guide = "none"
        return None
    if unmodelled:
        if args.guide == "sim":
            raise AutotuneError(f"--guide sim: {unmodelled}")
        print(f"autotune: no guide: {unmodelled}", file=sys.stderr)
        args.guide = "none"
        return None
    return calibration_option(args.guide_calibration)


def shared_calibration(args: argparse.Namespace, sim: Any, guide: Any) -> tuple[Any, Any]:
    """The calibrations a run uses: (the simulator's: the startup screen and the pre-run estimate, or
    the simulated trials; the guide's, None when not guided). With `--backend sim` the simulator's
    calibration plays the reality, which the guide must learn from measurements alone; on a real
    backend there is no reality to keep from it, and one calibration of the GPU, given with either
    option, serves both (`autotune calibrate` writes one for --sim-calibration, a guided run one for
    --guide-calibration)."""
    if args.backend == "sim":
        return sim, guide
    if guide is not None and args.guide_calibration is None and args.sim_calibration is not None:
        return sim, sim
    if args.sim_calibration is None and args.guide_calibration is not None:
        return guide, guide
    return sim, guide


def make_guided(args: argparse.Namespace, s: Any, estimate: Any, study: Any) -> Any:
    """The guided search of the run set up in `s` (run._Setup) on `study`: the guide's table of the whole
    space (cached in <runs-dir>/guide/) and its prediction of vLLM's defaults; None when the run is not
    guided. `estimate`: the pre-run estimate (its baseline's GPU time, scaled to a pick's predicted rate,
    is what the budget charges a pick before any trial's cost is known); printed here, so charged."""
    from autotune.core.procs import usable_cpus
    from autotune.tune.guide import predict_points, predict_space
    from autotune.tune.guide_check import replayer
    from autotune.tune.guide_refine import REFINE_TOP, refine_table, search_points
    from autotune.tune.guide_refit import Refit
    from autotune.tune.guided import GuidedOptions, GuidedSearch
    from autotune.tune.study import config_key

    cal = s.guide_calibration
    if cal is None:
        return None
    first_trial_gpu_s = estimate.trial_gpu_s if estimate is not None else None
    print(
        f"autotune: guide: predicting the whole space on the simulated engine ({usable_cpus()} core(s), "
        "lowest CPU priority) ...",
        file=sys.stderr,
        flush=True,
    )
    runs_dir = Path(args.runs_dir)
    table = predict_space(
        s.space, s.workload, s.slos, s.objectives, calibration=cal, runs_dir=runs_dir, progress=Progress()
    )
    top = REFINE_TOP if args.guide_top is None else args.guide_top
    table = refine_table(table, s.space, s.workload, s.slos, s.objectives.objectives[0], cal, top)
    baseline = s.space.baseline_params(s.gpu.memory_gib, s.max_position_embeddings)
    extra = {}
    if table.lookup(config_key(s.space.config(baseline))) is None:
        extra = {p.key: p for p in predict_points(s.space, [baseline], s.workload, s.slos, cal).predictions}
    options = GuidedOptions(gpu_hours=args.gpu_hours, first_trial_gpu_s=first_trial_gpu_s)

    refit = Refit(
        lambda c: predict_space(s.space, s.workload, s.slos, s.objectives, calibration=c, runs_dir=runs_dir),
        lambda c, points: predict_points(s.space, points, s.workload, s.slos, c).predictions,
        s.objectives.objectives[0],
        table.tensor_parallel_size,
        cal,
        say=lambda line: print(f"autotune: guide: {line}", file=sys.stderr),
        scale_of=table.scale_of,
        replay=replayer(s.space, s.workload),
        search=lambda c, points: search_points(s.space, points, s.workload, s.slos, c)[0],
    )
    search = GuidedSearch(table, s.space, s.objectives.objectives[0], options, extra, refit, baseline)
    ranked = table.ranking()
    starts = sum(p.starts for p in table.predictions)
    cached = " (cached)" if table.from_cache else f" in {table.cpu_s:.0f} CPU-s"
    refined = f", the best {top} by the full capacity search" if top else ""
    best = (
        f"; best predicted {search.raw(ranked[0]) or 0:,.0f} ({_short(ranked[0].params)})" if ranked else ""
    )
    print(
        f"autotune: guide: {len(table.predictions):,} configs predicted{refined}{cached}: {starts:,} start, "
        f"{len(search.candidates):,} meet the SLOs{best}",
        file=sys.stderr,
    )
    first = search.raw(ranked[0]) if ranked else None  # the guide's first pick: its best predicted
    charge_s = search.budget.next_cost_s(search.observations(study), first)
    if estimate is not None:
        print(f"autotune: {estimate.charged(charge_s).text()}", file=sys.stderr)
    left_s = estimate.left.budget_s if estimate is not None else None
    left_h = None if left_s is None else left_s / 3600
    print(f"autotune: guide: {budget_text(args.gpu_hours, charge_s or None, left_h)}", file=sys.stderr)
    return search


class Progress:
    """How far the guide's prediction of the space is, on stderr every PROGRESS_EVERY_S (a small fast
    model's space can take many minutes: each config simulates thousands of requests)."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S and done < total:
            self.last = now
            took = now - self.start
            when = f"{took:.0f} s" if took < 120 else f"{took / 60:.0f} min"
            print(
                f"autotune: guide: {done:,} of {total:,} configs predicted ({when})",
                file=sys.stderr,
                flush=True,
            )


def budget_text(budget_h: float | None, trial_gpu_s: float | None, left_h: float | None = None) -> str:
    """The expected spend, before anything launches; `left_h`: what the budget has left after a resumed
    study's spend (None: all of it)."""
    from autotune.tune.progress import clock

    per = f"a trial costs about {clock(trial_gpu_s)} of GPU time (the estimate above)" if trial_gpu_s else ""
    if budget_h is None:
        return (per + "; " if per else "") + (
            "no --gpu-hours: the run stops at --n-trials or when the guide predicts nothing better is left"
        )
    left_h = budget_h if left_h is None else max(0.0, left_h)
    budget = f"budget {budget_h:g} GPU-h" + (
        f" ({left_h:.2f} GPU-h left after what the study spent)" if left_h < budget_h else ""
    )
    if trial_gpu_s and left_h * 3600 < trial_gpu_s:
        return (
            f"{budget} affords no trial: one costs about {trial_gpu_s / 3600:.2f} GPU-h (the estimate "
            "above), so nothing will launch; a larger --gpu-hours affords one"
        )
    most = (
        f", about {values.counted(math.floor(left_h * 3600 / trial_gpu_s), 'trial')} as dear"
        if trial_gpu_s
        else ""
    )
    return (
        f"{budget}{most}{'; ' + per if per else ''}, re-measuring the top included; it "
        "stops earlier when the guide predicts nothing better is left"
    )


def finish_guided(search: Any, study: Any, run_dir: Path, stop_reason: str | None) -> dict[str, Any] | None:
    """Write the guide's files (`write_guided`) and print the table. Returns guide.json's data (None, and
    nothing written, when `search` is None: not a guided run)."""
    data = write_guided(search, study, run_dir, stop_reason)
    if data is not None:
        print(guide_summary(data), file=sys.stderr)
    return data


def write_guided(search: Any, study: Any, run_dir: Path, stop_reason: str | None) -> dict[str, Any] | None:
    """Write guide.json (predicted vs measured per trial, spend, why it stopped) and calibration.yaml
    (the guide's calibration with the speed factor fitted to the measurements); return guide.json's data
    (None, and nothing written, when `search` is None: not a guided run, or stopped before its guide)."""
    if search is None:
        return None
    from autotune.core.atomic import atomic_write_text
    from autotune.outputs.guide_view import GUIDE_FILE, guide_data
    from autotune.sim.calibration import calibration_yaml

    data = guide_data(search, study, stop_reason)
    factor = search.refit.factor(search.index)
    fitted = search.refit.calibration(search.index)
    atomic_write_text(run_dir / GUIDE_FILE, json_text(data, indent=1))
    measured = sum(r["measured"] is not None for r in data["trials"])
    header = (
        f"The guide's calibration after guided run {run_dir.name}: its speed constants scaled by the\n"
        f"factor {factor:.3f} fitted to {measured} trials' measurements.\n"
        "Reuse: --guide-calibration (real GPUs) or --sim-calibration (simulated runs)."
    )
    atomic_write_text(run_dir / CALIBRATION_FILE, calibration_yaml(fitted, header))
    return data


def mark_stopped(run_dir: Path, budget_h: float | None, reason: str) -> None:
    """A guided run stopped before its guide was made (Ctrl-C while it predicts the space): the study's
    guide.json, from its earlier run, says why this one stopped and at its budget (nothing ran since, so
    its trials and spend hold). Nothing when there is none."""
    from autotune.core.atomic import atomic_write_text
    from autotune.outputs.guide_view import GUIDE_FILE, read_guide

    data = read_guide(run_dir)
    if data is not None:
        data |= {"budget_gpu_hours": budget_h, "stop_reason": reason}
        atomic_write_text(run_dir / GUIDE_FILE, json_text(data, indent=1))


def guide_summary(data: dict[str, Any]) -> str:
    """The guided run's lines: predicted vs measured per trial, spend against the budget, why it stopped."""
    from autotune.outputs.guide_view import defaults_text, measured_text, spend_text

    lines = ["guide: predicted vs measured per real trial:"]
    for r in data["trials"]:
        measured = measured_text(r)
        predicted = f"{r['predicted']:,.1f}" if r["predicted"] is not None else "-"
        by = f"; {r['by']}" if r.get("by") else ""
        if r.get("bursts"):  # tune/guide_check.py: + is slower than the guide's model
            by += f"; bursts vs guide: shape {r['bursts']['shape']:.1%}, speed {r['bursts']['offset']:+.1%}"
        lines.append(
            f"  #{r['trial']}: predicted {predicted}, measured {measured} ({r['gpu_hours']:.2f} GPU-h{by})"
        )
    if data.get("defaults"):
        lines.append(f"  {defaults_text(data['defaults'])}")
    lines.append(f"guide: {spend_text(data)}")
    return "\n".join(lines)


def _short(params: dict[str, Any]) -> str:
    from autotune.tune.progress import short_params

    return short_params(params)
