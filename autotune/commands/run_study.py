"""`autotune run`'s study: what it records (the settings a resume must match), where it lives and its
default name, which tells apart runs that can never be one study.

A study keeps its search space (a resume with another is refused) and, once guided, its guide: runs that
differ in either got one default name, and the second was stopped with "already exists", then with a
refused --resume. The name adds the space's name (all but the default one) and "guided" when the run is
guided: whether it is, not how that was asked (`--backend vllm` is guided by default: with or without
`--guide sim` it is one run, one name). A --gpu-hours budget is not in the name: a larger one continues
the study.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a run starts (`--help` stays quick)
    from autotune.measure.slo import Slo
    from autotune.sim.calibration import Calibration
    from autotune.tune.objectives import ObjectiveSet
    from autotune.tune.space import SearchSpace
    from autotune.tune.study import StudySettings
    from autotune.workloads.spec import WorkloadSpec

DEFAULT_SPACE = "vllm"  # --space's default, search_spaces/vllm.yaml: the one space a name leaves out
GUIDED = "guided"


def study_settings(
    args: argparse.Namespace,
    space: SearchSpace,
    goals: tuple[ObjectiveSet, Sequence[Slo]],
    workload: WorkloadSpec,
    calibration: Calibration,
    guided: bool,
    moved: dict[str, Any],
) -> StudySettings:
    """What the study records (`goals`: the objectives and the SLOs; `moved`: the baseline's moved
    defaults, SearchSpace.moved_defaults). Known before anything starts, so that a --resume of a study
    under its earlier default name is compared as any --resume is (study_name)."""
    from autotune.tune.study import StudySettings
    from autotune.workloads.digest import workload_digest

    objectives, slos = goals
    return StudySettings(
        objectives=objectives.names,
        directions=objectives.directions,
        slos=[str(slo) for slo in slos],
        model=space.model,
        gpu=space.gpu,
        workload=workload.name,
        backend=args.backend,
        sim_calibration=calibration.to_dict(),
        load=workload.load,
        space_digest=space.digest(),
        workload_digest=workload_digest(workload),
        noise=args.noise,
        guide="sim" if guided else "none",
        gpu_hours=args.gpu_hours,
        seed=args.seed,
        baseline_moved=moved,
        image=args.image if args.backend == "docker" else "",
    )


def storage_of(args: argparse.Namespace, name: str) -> str:
    """The storage study `name` lives in: --storage, else runs/<name>/study.db."""
    from autotune.store.urls import absolute
    from autotune.tune.study_open import sqlite_url

    return absolute(args.storage) if args.storage else sqlite_url(Path(args.runs_dir) / name)


def check_same_storage(args: argparse.Namespace, run_dir: Path, storage: str) -> None:
    """Refuse (one line) a run without --storage whose folder's run.json says its study is in another
    storage than `storage` (storage_of's): it would find no study there and ask whether study.db was
    lost, or start a second one."""
    from autotune.core.errors import AutotuneError
    from autotune.core.secrets import masked
    from autotune.outputs.run_info import load_run
    from autotune.store.urls import resolve

    if args.storage or not (run_dir / "run.json").is_file():
        return
    try:
        recorded = resolve(load_run(run_dir).storage, run_dir)
    except AutotuneError:
        return  # a damaged run.json: the checks after this one judge the folder by its study
    if recorded != storage:
        raise AutotuneError(
            f"{run_dir} keeps its study in another storage (run.json: {masked(recorded)}): pass "
            "--storage with it (its password too, which run.json does not keep); nothing was changed"
        )


def study_name(
    args: argparse.Namespace, space: SearchSpace, workload: WorkloadSpec, settings: StudySettings
) -> str:
    """The study this run opens when --study is not given (`settings`: study_settings's).

    A --resume whose name finds no study resumes the one an earlier autotune named without the space
    and the guide, when this run may resume it (the comparison --resume makes): that study's own
    command, typed again, still finds it. A new run always takes the new name.
    """
    from autotune.tune.study_checks import default_study_name, holds, resumable

    guided = settings.guide == "sim"
    parts = (space.model, space.gpu, workload.name)
    name = default_study_name(*parts, [*variant(args, workload, guided), *settings.slos])
    if not args.resume or holds(name, storage_of(args, name)):
        return name
    earlier = default_study_name(*parts, [*_earlier_variant(args, workload), *settings.slos])
    if earlier == name or not resumable(earlier, storage_of(args, earlier), settings):
        return name
    print(
        f"autotune: no study {name}: resuming {earlier}, this run's study by the default name without "
        "the search space and the guide (as autotune named studies before)",
        file=sys.stderr,
    )
    return earlier


def variant(args: argparse.Namespace, workload: WorkloadSpec, guided: bool) -> list[str]:
    """What a default name adds past model, GPU and workload: a load other than capacity, objectives
    other than the default, a search space other than the default (its file's name) and a guided run."""
    space = Path(args.space).stem
    return [
        *_earlier_variant(args, workload),
        *([space] if space != DEFAULT_SPACE else []),
        *([GUIDED] if guided else []),
    ]


def _earlier_variant(args: argparse.Namespace, workload: WorkloadSpec) -> list[str]:
    """What a default name added before the space and the guide: the load and the objectives."""
    load = [workload.load] if workload.load != "capacity" else []
    return load + ([Path(args.objectives).stem] if args.objectives != "default" else [])
