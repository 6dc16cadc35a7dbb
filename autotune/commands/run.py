"""`autotune run`: tune vLLM's launch flags for a model, GPU, workload and SLO (simulated by default)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.commands import run_end
from autotune.commands.options import launch_command
from autotune.commands.run_estimate import run_estimate
from autotune.commands.run_options import PARALLEL_SIZES, add_arguments, check_options
from autotune.core.values import counted
from autotune.sim.noise import noise_model

if TYPE_CHECKING:  # the modules a run needs are imported when it starts (`--help` stays quick)
    from autotune.core.interrupts import StopRecord
    from autotune.measure.slo import Slo
    from autotune.tune.space import SearchSpace
    from autotune.workloads.spec import WorkloadSpec

__all__ = ["HELP", "add_arguments", "run"]  # what cli.py uses (add_arguments lives in run_options.py)

HELP = "Tune vLLM launch flags with Optuna + Ray: SLOs as constraints, Pareto front, ready-to-paste flags."


def run(args: argparse.Namespace) -> int:
    """Run (or resume) a study and write its results to runs/<study>/."""
    check_options(args)
    setup = _prepare(args)
    return _execute(args, setup)


@dataclasses.dataclass
class _Setup:
    space: SearchSpace
    objectives: Any
    slos: list[Slo]
    workload: WorkloadSpec
    backend: Any
    gpu: Any
    max_position_embeddings: int | None
    gpu_ids: list[int]
    study_name: str
    run_dir: Path
    storage: str
    untuned: str | None  # which flag is not tuned on this workload, and why
    calibration: Any  # the simulator's constants (sim trials, the screen, a real run's estimate)
    settings: Any  # the StudySettings: what the study records, and what a resume must match
    guide_calibration: Any = None  # the guide's constants (None: the run is not guided)
    gpus_note: str | None = None  # which parallel sizes --gpus cannot give (None: all fit)


def _prepare(args: argparse.Namespace) -> _Setup:
    """Read and check every input before anything starts (each bad input: one AutotuneError line)."""
    from autotune.backends.factory import make_backend
    from autotune.catalog.gpus import get_gpu
    from autotune.catalog.models import known_max_model_len
    from autotune.commands.run_guide import check_guide_options, shared_calibration
    from autotune.commands.run_study import check_same_storage, storage_of, study_name, study_settings
    from autotune.core.errors import AutotuneError
    from autotune.core.inputs import check_gpus_text, check_runs_dir
    from autotune.dispatch.gpus import parse_gpus
    from autotune.measure.slo import parse_slos
    from autotune.sim.calibration import calibration_option
    from autotune.sim.flags import refusal
    from autotune.store.storage import check_sqlite_file, preflight_storage
    from autotune.store.urls import absolute
    from autotune.tune.objectives import check_goodput, load_objectives
    from autotune.tune.screen import check_gpu_count, check_model_len, check_rules, check_tensor_parallel
    from autotune.tune.space import load_space
    from autotune.tune.study_checks import check_not_driven, check_results_kept, check_resumable
    from autotune.workloads.files import load_workload
    from autotune.workloads.spec import check_fits

    check_runs_dir(Path(args.runs_dir))
    check_gpus_text(args.gpus)  # before any notice: a bad value is the one line said
    gpu_ids = parse_gpus(args.gpus)
    calibration = calibration_option(args.sim_calibration)
    space = load_space(args.space).with_overrides(model=args.model, gpu=args.gpu)
    objectives = load_objectives(args.objectives)
    slos = parse_slos(args.slo) if args.slo else list(objectives.slos)
    check_goodput(objectives, slos)
    workload = load_workload(args.workload)
    if args.load != "workload":
        workload = dataclasses.replace(workload, load=args.load)
    space, untuned = _untuned_for(space, workload)
    refused = refusal(space.flag_values(), f"search space {args.space}")
    if refused and args.backend == "sim":
        raise AutotuneError(refused)
    guide_calibration = check_guide_options(args, workload, refused)
    calibration, guide_calibration = shared_calibration(args, calibration, guide_calibration)
    gpu = get_gpu(space.gpu)
    space = space.with_overrides(gpu=gpu.short_name)  # one name for one GPU: headers, run.json, study names
    # None: a real model outside the catalog, whose context length vLLM checks itself.
    max_pos = known_max_model_len(space.model, None, args.backend)
    check_model_len(space, None if _long_len_allowed(args) else max_pos)
    check_rules(space, max_pos)
    check_fits(workload, args.seed, space.largest("max_model_len") or max_pos)
    check_tensor_parallel(space, calibration)
    gpus_note = check_gpu_count(space, len(gpu_ids)) if gpu_ids else None
    backend = make_backend(
        args.backend,
        space.gpu,
        serve_cmd=launch_command(args.serve_cmd),
        image=args.image,
        startup_timeout_s=args.startup_timeout,
        noise=noise_model(args.noise),
        calibration=calibration,
    )
    if hasattr(backend, "preflight"):
        backend.preflight()
    guided = guide_calibration is not None
    moved = space.moved_defaults(gpu.memory_gib, max_pos)
    settings = study_settings(args, space, (objectives, slos), workload, calibration, guided, moved)
    if args.storage:
        preflight_storage(absolute(args.storage), args.resume)  # before a study name is looked up in it
    name = args.study or study_name(args, space, workload, settings)
    run_dir = Path(args.runs_dir) / name
    storage = storage_of(args, name)
    check_same_storage(args, run_dir, storage)
    if args.resume:
        check_sqlite_file(storage, resume=True)
        check_not_driven(name, storage)
    check_results_kept(name, storage, run_dir)
    if args.resume:  # after the lost-storage check: results kept without their study say that instead
        check_resumable(name, storage, None if args.storage else Path(args.runs_dir))
    return _Setup(
        space,
        objectives,
        slos,
        workload,
        backend,
        gpu,
        max_pos,
        gpu_ids,
        name,
        run_dir,
        storage,
        untuned,
        calibration,
        settings,
        guide_calibration,
        gpus_note,
    )


def _long_len_allowed(args: argparse.Namespace) -> bool:
    """Whether a real server may start past the model's context: vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN,
    in this environment or the serve command (the simulator does not model it)."""
    name = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
    return args.backend != "sim" and (bool(os.environ.get(name)) or name in (args.serve_cmd or ""))


def _untuned_for(space: SearchSpace, workload: WorkloadSpec) -> tuple[SearchSpace, str | None]:
    """The space without the parameters this workload cannot tell apart (at vLLM's defaults), and a
    line saying so (None when nothing changed).

    Prefix caching only changes a result when prompts share prefixes; on a workload whose prompts never
    do, both values measure the same and every trial spent on the difference is wasted.
    """
    from autotune.core.config import EngineConfig

    name = "enable_prefix_caching"
    if name not in space.names or workload.shares_prefixes:
        return space, None
    default = getattr(EngineConfig(model=space.model), name)
    note = (
        f"{name} is not tuned: workload {workload.name} shares no prompt prefixes, so it cannot change a "
        f"result (kept at vLLM's default, {default})"
    )
    return space.fix(name, default), note


def _execute(args: argparse.Namespace, s: _Setup) -> int:
    from autotune.commands.run_executor import open_executor
    from autotune.core.errors import RunFailure
    from autotune.core.interrupts import sigterm_as_ctrl_c
    from autotune.store.storage import STORAGE_ERRORS, storage_error
    from autotune.tune.samplers import fallback_note, make_sampler

    note = fallback_note(args.sampler)
    if note:
        print(f"autotune: {note}", file=sys.stderr)
    sampler = make_sampler(args.sampler, s.space.grid(), args.seed, args.n_trials)

    # Imported before the study opens: a Ctrl-C that cut that import short left a half-made module
    # that an `except` evaluated afterwards failed on (AttributeError instead of "interrupted").
    storage_errors = STORAGE_ERRORS()
    executor, session = open_executor(args, s)  # Ray's start (if any) first: it has its SIGTERM handler
    try:
        with sigterm_as_ctrl_c() as stops:
            try:
                return _tune(args, s, sampler, executor, stops)
            except storage_errors as exc:  # opening the study, taking its lease: before any trial
                raise RunFailure(
                    f"the storage failed: {storage_error(exc)}; once fixed, {run_end.RESUME_HINT}"
                ) from None
    finally:
        if hasattr(executor, "close"):  # worker processes of a simulated run
            executor.close()
        if session is not None:
            session.close()


def _tune(args: argparse.Namespace, s: _Setup, sampler: Any, executor: Any, stops: StopRecord) -> int:
    """Open the study (one driver: store/lease.py), run the tuner, write the results whatever happens.
    `stops`: the stop signals noted so far; checked at each phase boundary (a stop's own
    KeyboardInterrupt can be swallowed by a finalizer: core/interrupts.py)."""
    from autotune.commands.client_cap import capped_run_note
    from autotune.commands.run_executor import busy_gpus
    from autotune.commands.run_guide import finish_guided, make_guided
    from autotune.core.atomic import remove_stale_temps
    from autotune.core.errors import RunFailure, SetupLost
    from autotune.outputs.dashboard import StudyNote
    from autotune.outputs.run_info import RunInfo
    from autotune.store.lease import Lease, new_driver
    from autotune.store.urls import for_run_file
    from autotune.tune.front import moved_note
    from autotune.tune.progress import Progress
    from autotune.tune.run_records import TunerOptions
    from autotune.tune.samplers import continued_seed, make_sampler
    from autotune.tune.screen import describe, make_screen
    from autotune.tune.study_open import start_study
    from autotune.tune.tuner import Tuner

    settings = s.settings
    # The study is created only once the GPUs checked out: a corrected command must not meet a
    # half-made study that asks for --resume.
    s.run_dir.mkdir(parents=True, exist_ok=True)
    baseline = s.space.baseline_params(s.gpu.memory_gib, s.max_position_embeddings)
    # a guided run measures the guide's first pick before the defaults: the guided search enqueues them
    first = baseline if s.guide_calibration is None else None
    driver = new_driver()
    study = start_study(s.study_name, s.storage, settings, sampler, args.resume, first, s.run_dir, driver)
    if args.resume and study.trials:
        seed = continued_seed(args.seed, len(study.trials))
        study.sampler = make_sampler(args.sampler, s.space.grid(), seed, args.n_trials)
    lease = Lease(study, driver=driver).start()
    remove_stale_temps(s.run_dir)  # a killed run's half-written results: this run is the folder's only writer
    dashboard, note, context, guide = None, None, {}, None
    kind = _load_kind(s.workload, args.seed)
    try:
        RunInfo(study=s.study_name, storage=for_run_file(s.storage, s.run_dir), directory=s.run_dir).save(
            {**settings.to_dict(), "space": s.space.source, "load": s.workload.load, **_image(args)}
            | {"simulated": s.backend.simulated, "gpus": len(s.gpu_ids)}
            | kind
        )
        progress = None if args.quiet else Progress()
        _announce(args, s, executor.describe(), study)
        per_replica = _per_replica_note(s)
        for line in (
            per_replica,
            s.gpus_note,
            moved_note(baseline, settings.baseline_moved),
            capped_run_note(s.workload),
        ):
            if line:
                print(f"autotune: {line}", file=sys.stderr)
        estimate = run_estimate(args, s, busy_gpus(executor), study)
        stops.check()
        guide = make_guided(args, s, estimate, study)  # None: not a guided run
        stops.check()
        screen = (
            None if args.no_screen else make_screen(s.space.model, s.space.gpu, calibration=s.calibration)
        )
        print(f"autotune: {describe(screen, enabled=not args.no_screen)}", file=sys.stderr)
        if s.untuned:
            print(f"autotune: {s.untuned}", file=sys.stderr)
        dashboard = _start_dashboard(s.storage) if args.dashboard else None
        context = {**settings.to_dict(), "load": s.workload.load, "simulated": s.backend.simulated}
        context |= {"gpus": len(s.gpu_ids)}
        context |= kind
        note = StudyNote(study, context, search=guide)  # a guided run's section: live from its search
        tuner = Tuner(
            study,
            s.space,
            s.objectives,
            s.slos,
            executor,
            TunerOptions(
                n_trials=args.n_trials,
                timeout_s=args.timeout,
                seed=args.seed,
                run_dir=s.run_dir,
                repeats=args.repeats if s.backend.noisy else 0,
                real_time=s.backend.runs_servers,
            ),
            progress=progress,
            max_position_embeddings=s.max_position_embeddings,
            screen=screen,
            on_told=note.update,
            guide=guide,
        )
        stops.check()  # the tuner's loop takes stops as a flag from here on
        summary = run_end.run_tuner(tuner, study, s.run_dir, s.storage)
        stops.check()  # one that came between the checks and the loop's own handler
        finish_guided(guide, study, s.run_dir, summary.ended_by())
    except RunFailure as exc:
        if isinstance(exc, SetupLost):  # the storage is fine: the results are written as after Ctrl-C
            stopped = (guide, f"{exc.what} was lost")
            run_end.write_results(study, s, args, context, note, lease, dashboard, stopped)
            raise
        # The storage failed: reading it back for the results would wait on it again. --resume writes them.
        run_end.stop(lease, dashboard, s.run_dir, write_lease=False)
        raise
    except BaseException as exc:
        stopped = (guide, "interrupted")
        _, problem = run_end.write_results(study, s, args, context, note, lease, dashboard, stopped)
        if problem:
            print(f"autotune run: {problem}", file=sys.stderr)  # then the interrupt's own line
        if isinstance(exc, KeyboardInterrupt):
            run_end.interrupted(study, s.run_dir, s.storage)
        raise
    try:
        written, problem = run_end.write_results(study, s, args, context, note, lease, dashboard)
        if problem:
            raise RunFailure(problem)
        run_end.print_summary(written, summary, s.run_dir)
    except KeyboardInterrupt:  # after the last trial: where the trials are, as for any other stop
        run_end.interrupted(study, s.run_dir, s.storage)
        raise
    if summary.halted:
        raise RunFailure(f"halted: {summary.halted}")
    return 0


def _announce(args: argparse.Namespace, s: _Setup, where: str, study: Any) -> None:
    slos = ", ".join(str(slo) for slo in s.slos) or "none"
    # in the words of the line Ctrl-C left (run_end.going_on): --n-trials counts the measured and unstarted
    before = run_end.told(study) if args.resume and study.trials else None
    resumed = f", {before.finished} finished before this resume: {before.kinds_text()}" if before else ""
    if before and before.done >= args.n_trials:  # said before the estimate, the guide and the results
        resumed += f"; --n-trials {args.n_trials} reached already: no new trial (raise it for more)"
    trials = counted(args.n_trials, "trial")
    print(
        f"autotune: study {s.study_name} ({args.backend}: {s.space.model} on {s.space.gpu}, workload "
        f"{s.workload.name} at {_load_text(s)}, SLO {slos}; {where}; {trials}{resumed})",
        file=sys.stderr,
    )


def _per_replica_note(s: _Setup) -> str | None:
    """When the space varies the GPUs a replica takes and the objective is a throughput per replica:
    a config wins by taking more GPUs, which a deployer pays for; say so before the run."""
    varied = next((p for p in s.space.params if p.name in PARALLEL_SIZES), None)
    first = s.objectives.objectives[0]
    if varied is None or not first.maximize or first.metric.endswith("_per_gpu"):
        return None
    values = ", ".join(str(v) for v in varied.grid_values())
    return (
        f"{varied.name} varies ({values}) and {first.metric} is per replica: a config wins by taking more "
        "GPUs; to compare per GPU, pass --objectives per_gpu (output_throughput_per_gpu)"
    )


def _image(args: argparse.Namespace) -> dict[str, str]:
    """The image a docker run tuned with, for `autotune export` to deploy the same one."""
    return {"image": args.image} if args.backend == "docker" else {}


def _load_kind(workload: WorkloadSpec, seed: int) -> dict[str, str]:
    """A fixed load's kind (open, closed, burst), for the results to say when an open loop was too short
    to judge (outputs/outcome.py `unjudged_note`); {} for a capacity load."""
    from autotune.measure.steady_state import load_kind

    if workload.load != "fixed":
        return {}
    return {"load_kind": load_kind(workload.requests(seed), workload.max_concurrency)}


def _load_text(s: _Setup) -> str:
    """What a trial measures, in words: without an SLO, capacity is bounded by keeping up alone."""
    if s.workload.load == "capacity" and not s.slos:
        return (
            "capacity load (no SLO: each config's highest rate it keeps up with, served >= 98 % of offered, "
            "latency unbounded)"
        )
    return f"{s.workload.load} load"


def _start_dashboard(storage: str) -> Any:
    from autotune.outputs.dashboard import start_dashboard

    server = start_dashboard(storage)
    print(f"autotune: optuna-dashboard at {server.url}", file=sys.stderr)
    return server
