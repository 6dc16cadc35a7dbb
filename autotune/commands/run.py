"""`autotune run`: tune vLLM's launch flags for a model, GPU, workload and SLO (simulated by default)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from autotune.backends.factory import BACKENDS
from autotune.inputs import add_startup_timeout, positive_seconds

HELP = "Tune vLLM launch flags with Optuna + Ray: SLOs as constraints, Pareto front, ready-to-paste flags."
DEFAULT_TRIALS = 50
LOADS = ("workload", "fixed", "capacity")
SIM_TRIAL_TIMEOUT_S = 600.0
# A real trial's own limits are the backend's (startup 600 s, benchmark 1800 s); the executor's deadline
# is the safety net above them.
REAL_TRIAL_TIMEOUT_S = 2700.0
MAX_PARALLEL = 256  # CPU slots for simulated trials: more than any host has cores


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune run` options."""
    what = parser.add_argument_group("what to tune")
    what.add_argument("--space", default="vllm", help="search-space YAML (or a name in search_spaces/)")
    what.add_argument("--model", help="override the space's model (default meta-llama/Llama-3.1-8B-Instruct)")
    what.add_argument("--gpu", help="override the space's GPU type (default H100)")
    what.add_argument("--workload", default="chat", help="workload YAML (or a name in workloads/)")
    what.add_argument(
        "--load",
        choices=LOADS,
        default="workload",
        help="workload (default): what the workload file's `load:` says; capacity: measure each config at "
        "the highest request rate that meets the SLOs; fixed: at the file's rate/concurrency",
    )
    what.add_argument("--slo", action="append", default=[], help="e.g. ttft_p99=2s,itl_p99=50ms (repeatable)")
    what.add_argument("--objectives", default="default", help="objectives YAML (or a name in objectives/)")
    study = parser.add_argument_group("study")
    study.add_argument("--study", help="study name (default: from model, GPU and workload)")
    study.add_argument("--storage", help="Optuna storage URL (default: sqlite in runs/<study>/study.db)")
    study.add_argument("--runs-dir", default="runs", help="where run folders go (default: runs)")
    study.add_argument("--resume", action="store_true", help="continue an existing study to --n-trials")
    study.add_argument(
        "--sampler",
        default="auto",
        choices=("auto", "tpe", "gp", "nsga2", "random", "grid"),
        help="auto (default): multivariate TPE, chosen by benchmarks/sample_efficiency.py (see README)",
    )
    study.add_argument(
        "--n-trials", type=int, default=DEFAULT_TRIALS, help=f"configs to measure (default {DEFAULT_TRIALS})"
    )
    study.add_argument(
        "--timeout", type=positive_seconds, help="stop asking for new trials after this many seconds"
    )
    study.add_argument("--seed", type=int, default=0, help="sampler and workload seed (>= 0)")
    study.add_argument(
        "--no-screen",
        action="store_true",
        help="launch every valid config, also those the memory model predicts to fail to start",
    )
    where = parser.add_argument_group("where trials run")
    where.add_argument(
        "--backend",
        default="sim",
        choices=BACKENDS,
        help="sim (default): the simulated engine in process; vllm: `vllm serve` subprocesses; docker: "
        "vllm/vllm-openai containers",
    )
    where.add_argument(
        "--gpus",
        help="GPUs to use: a count (4) or device ids (0,1,2,3); virtual ones for the simulator "
        "(--backend sim, or --serve-cmd 'autotune sim-server')",
    )
    where.add_argument("--parallel", type=int, default=1, help="sim: trials at once on CPU slots (default 1)")
    where.add_argument("--ray-address", help="join an existing Ray cluster instead of starting one")
    where.add_argument(
        "--trial-timeout", type=positive_seconds, help="deadline per trial in seconds (forced cancel)"
    )
    add_startup_timeout(where)
    where.add_argument(
        "--serve-cmd",
        default="vllm serve",
        help="vllm backend: the server command (default 'vllm serve'; 'autotune sim-server' needs no GPU)",
    )
    where.add_argument("--image", default="vllm/vllm-openai:latest", help="docker backend: the image")
    parser.add_argument("--dashboard", action="store_true", help="serve optuna-dashboard during the run")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def run(args: argparse.Namespace) -> int:
    """Run (or resume) a study and write its results to runs/<study>/."""
    from autotune.errors import AutotuneError

    if args.n_trials < 1:
        raise AutotuneError("--n-trials must be at least 1")
    if not 1 <= args.parallel <= MAX_PARALLEL:
        raise AutotuneError(f"--parallel must be between 1 and {MAX_PARALLEL}")
    if args.seed < 0:
        raise AutotuneError("--seed must be >= 0")
    setup = _prepare(args)
    return _execute(args, setup)


@dataclasses.dataclass
class _Setup:
    space: Any
    objectives: Any
    slos: list[Any]
    workload: Any
    backend: Any
    gpu: Any
    max_position_embeddings: int | None
    gpu_ids: list[int]
    study_name: str
    run_dir: Path
    storage: str


def _prepare(args: argparse.Namespace) -> _Setup:
    """Read and check every input before anything starts (each bad input: one AutotuneError line)."""
    from autotune.backends.factory import make_backend
    from autotune.errors import AutotuneError
    from autotune.executor import parse_gpus
    from autotune.inputs import (
        check_fits,
        check_gpus_text,
        check_runs_dir,
        known_max_model_len,
        serve_command,
    )
    from autotune.objectives import load_objectives
    from autotune.sim.hardware import get_gpu
    from autotune.slo import parse_slos
    from autotune.space import load_space
    from autotune.storage import check_sqlite_file, preflight_storage
    from autotune.storage_url import absolute
    from autotune.study import check_not_driven, default_study_name, sqlite_url
    from autotune.workload import load_workload

    check_runs_dir(Path(args.runs_dir))
    space = load_space(args.space).with_overrides(model=args.model, gpu=args.gpu)
    objectives = load_objectives(args.objectives)
    slos = parse_slos(args.slo) if args.slo else list(objectives.slos)
    workload = load_workload(args.workload)
    if args.load != "workload":
        workload = dataclasses.replace(workload, load=args.load)
    gpu = get_gpu(space.gpu)
    # None: a real model outside the catalog, whose context length vLLM checks itself.
    max_pos = known_max_model_len(space.model, None, args.backend)
    check_fits(workload, args.seed, space.largest("max_model_len") or max_pos)
    check_gpus_text(args.gpus)
    gpu_ids = parse_gpus(args.gpus)
    backend = make_backend(
        args.backend,
        space.gpu,
        serve_cmd=serve_command(args.serve_cmd),
        image=args.image,
        startup_timeout_s=args.startup_timeout,
    )
    if hasattr(backend, "preflight"):
        backend.preflight()
    name = args.study or default_study_name(space.model, space.gpu, workload.name)
    if not all(c.isalnum() or c in "-_." for c in name) or name.strip(".") == "":
        raise AutotuneError(f"bad --study {name!r}: use letters, digits, '-', '_' and '.'")
    run_dir = Path(args.runs_dir) / name
    storage = absolute(args.storage) if args.storage else sqlite_url(run_dir)
    if args.storage:
        preflight_storage(storage, args.resume)
    if args.resume:
        check_sqlite_file(storage, resume=True)
        check_not_driven(name, storage)
    return _Setup(space, objectives, slos, workload, backend, gpu, max_pos, gpu_ids, name, run_dir, storage)


def _execute(args: argparse.Namespace, s: _Setup) -> int:
    import ray

    from autotune.errors import RunFailure
    from autotune.executor import Executor, cluster_gpus, start_ray
    from autotune.interrupts import sigterm_as_ctrl_c
    from autotune.storage import storage_error
    from autotune.study import StudySettings, make_sampler

    settings = StudySettings(
        objectives=s.objectives.names,
        directions=s.objectives.directions,
        slos=[str(slo) for slo in s.slos],
        model=s.space.model,
        gpu=s.space.gpu,
        workload=s.workload.name,
        backend=args.backend,
    )
    sampler = make_sampler(args.sampler, s.space.grid(), args.seed, args.n_trials)

    sim = args.backend == "sim"
    owns_ray = not ray.is_initialized()
    fake_gpus = None  # the simulator's GPUs are virtual: a local Ray cluster gets that many fake ones
    if s.backend.simulated and args.ray_address is None:
        fake_gpus = len(s.gpu_ids) or (None if sim else 1)
    start_ray(args.ray_address, num_cpus=max(args.parallel, 1), fake_gpus=fake_gpus)
    try:
        with sigterm_as_ctrl_c():  # after ray.init, which installs its own SIGTERM handler
            gpu_ids = s.gpu_ids or ([] if sim else list(range(cluster_gpus())))
            if not sim and not gpu_ids:
                from autotune.errors import AutotuneError

                raise AutotuneError(f"the {args.backend} backend needs GPUs and the Ray cluster has none")
            timeout = args.trial_timeout or (SIM_TRIAL_TIMEOUT_S if sim else REAL_TRIAL_TIMEOUT_S)
            if s.workload.load == "capacity":
                from autotune.capacity import MAX_EVALS

                timeout *= MAX_EVALS if not args.trial_timeout else 1
            executor = Executor(
                s.backend,
                s.workload,
                s.slos,
                gpu_ids=gpu_ids,
                cpu_slots=args.parallel,
                trial_timeout_s=timeout,
            )
            try:
                return _tune(args, s, settings, sampler, executor, gpu_ids)
            except STORAGE_ERRORS() as exc:  # opening the study, taking its lease: before any trial
                raise RunFailure(
                    f"the storage failed: {storage_error(exc)}; once fixed, {RESUME_HINT}"
                ) from None
    finally:
        if owns_ray:
            ray.shutdown()


def _tune(
    args: argparse.Namespace, s: _Setup, settings: Any, sampler: Any, executor: Any, gpu_ids: list[int]
) -> int:
    """Open the study (one driver: autotune.lease), run the tuner, write the results whatever happens."""
    from autotune.errors import RunFailure
    from autotune.export import RunInfo
    from autotune.lease import Lease
    from autotune.progress import Progress
    from autotune.screen import describe, make_screen
    from autotune.storage_url import for_run_file
    from autotune.study import start_study
    from autotune.tuner import Tuner, TunerOptions

    # The study is created only once the GPUs checked out: a corrected command must not meet a
    # half-made study that asks for --resume.
    s.run_dir.mkdir(parents=True, exist_ok=True)
    baseline = s.space.baseline_params(s.gpu.memory_gib, s.max_position_embeddings)
    study = start_study(s.study_name, s.storage, settings, sampler, args.resume, baseline, s.run_dir)
    lease = Lease(study).start()
    dashboard = None
    try:
        RunInfo(study=s.study_name, storage=for_run_file(s.storage, s.run_dir), directory=s.run_dir).save(
            {**settings.to_dict(), "space": s.space.source, "load": s.workload.load}
        )
        progress = None if args.quiet else Progress()
        _announce(args, s, gpu_ids, study)
        screen = None if args.no_screen else make_screen(s.space.model, s.space.gpu)
        print(f"autotune: {describe(screen, enabled=not args.no_screen)}", file=sys.stderr)
        dashboard = _start_dashboard(s.storage) if args.dashboard else None
        tuner = Tuner(
            study,
            s.space,
            s.objectives,
            s.slos,
            executor,
            TunerOptions(n_trials=args.n_trials, timeout_s=args.timeout, seed=args.seed, run_dir=s.run_dir),
            progress=progress,
            max_position_embeddings=s.max_position_embeddings,
            screen=screen,
        )
        summary = _run_tuner(tuner, study, s.run_dir)
    except RunFailure:
        # The storage failed: reading it back for the results would wait on it again. --resume writes them.
        _stop(lease, dashboard, write_lease=False)
        raise
    except BaseException:
        _, problem = _write_results(study, s, settings, lease, dashboard)
        if problem:
            print(f"autotune run: {problem}", file=sys.stderr)  # then the interrupt's own line
        raise
    written, problem = _write_results(study, s, settings, lease, dashboard)
    if problem:
        raise RunFailure(problem)
    _print_summary(written, summary, args.backend == "sim", s.run_dir)
    return 0


def _run_tuner(tuner: Any, study: Any, run_dir: Path) -> Any:
    """tuner.run(); an interrupt or a storage fault ends in one line that says how to continue."""
    from autotune.errors import RunFailure
    from autotune.storage import storage_error

    try:
        return tuner.run()
    except KeyboardInterrupt:
        print(f"autotune run: {_kept(study)} kept in {run_dir}/; {RESUME_HINT}", file=sys.stderr)
        raise
    except (*STORAGE_ERRORS(), OSError) as exc:
        tuner.executor.cancel_all()
        raise RunFailure(
            f"the run stopped: {storage_error(exc)}; {_kept(study)} kept in {run_dir}/; once fixed, "
            f"{RESUME_HINT}"
        ) from None


RESUME_HINT = "the same command with --resume continues"


def STORAGE_ERRORS() -> tuple[type[BaseException], ...]:  # noqa: N802  (a constant, imported late)
    """What a failing study storage raises (locked, full, corrupted, unreachable database)."""
    import optuna
    import sqlalchemy.exc

    return (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError)


def _kept(study: Any) -> str:
    """'N finished trials' (COMPLETE) of the study, or 'every finished trial is' when it cannot say."""
    import optuna

    try:
        n = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    except Exception:  # noqa: BLE001  (the storage is what failed)
        return "every finished trial is"
    return f"{n} finished trials"


def _write_results(study: Any, s: _Setup, settings: Any, lease: Any, dashboard: Any) -> tuple[Any, str]:
    """Write the results (Ctrl-C waits until they are complete): (the outcome and records, ''), or
    (None, why) when they could not be written (a full disk: the study still has every trial)."""
    from autotune import report
    from autotune.interrupts import deferred_ctrl_c
    from autotune.storage import storage_error
    from autotune.study import records

    out, problem = None, ""
    with deferred_ctrl_c():
        try:
            recs = records(study)
            maximize = [o.maximize for o in s.objectives.objectives]
            out = report.outcome(recs, s.objectives.names, maximize, settings.slos), recs
            if recs:
                report.write_all(s.run_dir, out[0])
        except Exception as exc:  # noqa: BLE001  (a full disk, a broken storage: the trials are safe)
            problem = (
                f"cannot write the results to {s.run_dir}/ ({storage_error(exc)}); the study keeps every "
                f"trial: once fixed, {RESUME_HINT} and writes them"
            )
            out = None
        finally:
            _stop(lease, dashboard)
    return out, problem


def _stop(lease: Any, dashboard: Any, write_lease: bool = True) -> None:
    lease.release(write=write_lease)
    if dashboard is not None:
        dashboard.stop()


def _print_summary(written: Any, summary: Any, sim: bool, run_dir: Path) -> None:
    from autotune import report

    out, recs = written
    print(report.summary_text(out))
    gpu_hours = sum(r.gpu_seconds for r in recs) / 3600
    saved_hours = sum(r.gpu_seconds_saved for r in recs) / 3600
    ended = " (timeout)" if summary.timed_out else ""
    print(
        f"\n{summary.completed} configs measured or deduplicated, {summary.rejected} suggestions rejected "
        f"before launch ({summary.screened} predicted to fail to start); {summary.told} told this run in "
        f"{summary.wall_s:.0f} s{ended}; "
        f"{'simulated ' if sim else ''}GPU time {gpu_hours:.2f} h, {saved_hours:.2f} h more saved by early "
        f"abort in {sum(r.gpu_seconds_saved > 0 for r in recs)} trials."
        f"\nResults: {run_dir}/ (trials.csv, pareto.csv, best.json, best.sh, pareto.png, report.html)"
    )


def _announce(args: argparse.Namespace, s: _Setup, gpu_ids: list[int], study: Any) -> None:
    slos = ", ".join(str(slo) for slo in s.slos) or "none"
    where = f"GPUs {gpu_ids}" if gpu_ids else f"{args.parallel} CPU slot(s)"
    resumed = f", resuming at {len(study.trials)} trials" if args.resume and study.trials else ""
    print(
        f"autotune: study {s.study_name} ({args.backend}: {s.space.model} on {s.space.gpu}, workload "
        f"{s.workload.name} at {s.workload.load} load, SLO {slos}; {where}; {args.n_trials} trials{resumed})",
        file=sys.stderr,
    )


def _start_dashboard(storage: str) -> Any:
    from autotune.dashboard import start_dashboard

    server = start_dashboard(storage)
    print(f"autotune: optuna-dashboard at {server.url}", file=sys.stderr)
    return server
