"""How `autotune run` ends: the one line after an interrupt or a storage fault, the results written
(whatever happened), the summary printed. `s` is run.py's setup of the run (objectives, SLOs, run dir).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def run_tuner(tuner: Any, study: Any, run_dir: Path, storage: str) -> Any:
    """tuner.run(); a lost cluster or engine or a storage fault ends in one line that says how to go on (an
    interrupt's line: `interrupted`, wherever in the run it came)."""
    from autotune.core.errors import RunFailure, SetupLost
    from autotune.store.storage import STORAGE_ERRORS, storage_error

    try:
        return tuner.run()
    except SetupLost as exc:  # the tuner already marked the interrupted trials FAIL
        raise type(exc)(
            f"{exc}; {going_on(study, run_dir, storage, RESUME_HINT + exc.resume_note)}"
        ) from None
    except (*STORAGE_ERRORS(), OSError) as exc:
        tuner.executor.cancel_all()
        hint = f"once fixed, {RESUME_HINT}"
        raise RunFailure(
            f"the run stopped: {storage_error(exc)}; {going_on(study, run_dir, storage, hint)}"
        ) from None


RESUME_HINT = "the same command with --resume continues"


def interrupted(study: Any, run_dir: Path, storage: str) -> None:
    """The line after Ctrl-C or SIGTERM, before the first trial (the study exists: a rerun needs
    --resume) or after the last as much as mid-run."""
    print(f"autotune run: {going_on(study, run_dir, storage, RESUME_HINT)}", file=sys.stderr)


def going_on(study: Any, run_dir: Path, storage: str, hint: str) -> str:
    """'N finished trials kept in WHERE (...); `hint`', or, when the study's SQLite file was removed
    while the run went (the open database still answered from the deleted file), that its trials are
    lost and how to start again."""
    from autotune.store.urls import sqlite_path

    path = sqlite_path(storage)
    if path is not None and not path.exists():
        return (
            f"{path} was removed during the run, and with it the study's finished trials; "
            "the same command without --resume starts again"
        )
    return f"{kept(study, run_dir, storage)}; {hint}"


def kept(study: Any, run_dir: Path, storage: str) -> str:
    """'N finished trials kept in WHERE (by kind, as a resume counts them: Tally.kinds_text)', or 'every
    finished trial is kept in WHERE' when the study cannot say. WHERE: the run folder when the study's
    SQLite file is in it, else that file, else the storage URL (its password masked)."""
    where = _where(run_dir, storage)
    try:
        tally = told(study)
    except Exception:  # noqa: BLE001  (the storage is what failed)
        return f"every finished trial is kept in {where}"
    return f"{tally.finished} finished trials kept in {where} ({tally.kinds_text()})"


def _where(run_dir: Path, storage: str) -> str:
    """Where a study's trials are kept, in words."""
    from autotune.core.secrets import masked
    from autotune.store.urls import sqlite_path

    path = sqlite_path(storage)
    if path is None:
        return masked(storage)
    return f"{run_dir}/" if path.parent.resolve() == run_dir.resolve() else str(path)


def told(study: Any) -> Any:
    """A Tally of the study's finished trials (tune/tally.py), as a resumed run starts from."""
    from optuna.trial import TrialState

    from autotune.tune.tally import Tally

    tally = Tally(maximize=True)  # the counts only: the best value is not read
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        tally.record(trial)
    return tally


def write_results(
    study: Any,
    s: Any,
    args: argparse.Namespace,
    context: dict,
    note: Any,
    lease: Any,
    dashboard: Any,
    stopped: tuple[Any, str] | None = None,
) -> tuple[Any, str]:
    """Write the results (Ctrl-C waits until they are complete): (the outcome and the names of the files
    written, ''), or (None, why) when they could not be written (a full disk: the study still
    has every trial). `stopped`: a guided search cut short (Ctrl-C, a lost cluster) and why: its
    guide.json and calibration.yaml are written first (best.json quotes guide.json); a run that ended
    wrote them with its summary."""
    from autotune.commands.run_guide import CALIBRATION_FILE, mark_stopped, write_guided
    from autotune.core.interrupts import deferred_ctrl_c
    from autotune.outputs import report
    from autotune.outputs.guide_view import GUIDE_FILE, PLOT_FILE
    from autotune.outputs.outcome import outcome as read_outcome
    from autotune.store.storage import storage_error
    from autotune.tune.remeasure import StoredRepeats
    from autotune.tune.study import records

    out, problem = None, ""
    with deferred_ctrl_c():
        try:
            if stopped is not None and stopped[0] is None and s.guide_calibration is not None:
                mark_stopped(s.run_dir, args.gpu_hours, stopped[1])  # stopped before its guide was made
            elif stopped is not None:
                write_guided(stopped[0], study, s.run_dir, stopped[1])
            recs = records(study)
            maximize = [o.maximize for o in s.objectives.objectives]
            slos = [str(slo) for slo in s.slos]
            outcome = read_outcome(
                recs,
                s.objectives.names,
                maximize,
                slos,
                context,
                args.target_rate,
                args.gpu_price,
                StoredRepeats.of(study),
            )
            files = [p.name for p in report.write_all(s.run_dir, outcome)] if recs else []
            # a guided run's own files, written beside them (guide.png by report.html's section)
            guided = (GUIDE_FILE, PLOT_FILE, CALIBRATION_FILE) if s.guide_calibration is not None else ()
            files += [name for name in guided if (s.run_dir / name).exists()]
            out = outcome, files
            if recs and note is not None:
                note.update(force=True)
        except Exception as exc:  # noqa: BLE001  (a full disk, a broken storage: the trials are safe)
            problem = (
                f"cannot write the results to {s.run_dir}/ ({storage_error(exc)}); the study keeps every "
                f"trial: once fixed, {RESUME_HINT} and writes them"
            )
            out = None
        finally:
            stop(lease, dashboard, s.run_dir)
    return out, problem


def stop(lease: Any, dashboard: Any, run_dir: Path, write_lease: bool = True) -> None:
    """Release the study's lease and stop the dashboard (saying how to reopen it)."""
    lease.release(write=write_lease)
    if dashboard is not None:
        dashboard.stop()
        print(f"autotune: the dashboard stopped with the run; reopen it: autotune dashboard {run_dir}")


def print_summary(written: Any, summary: Any, run_dir: Path) -> None:
    """The front, the recommendation and what the run did, on stdout."""
    from autotune.core.values import counted
    from autotune.outputs import report

    out, files = written
    print(report.summary_text(out))
    ended = " (timeout)" if summary.timed_out else ""
    converged = " (the sampler converged: it proposed only measured configs)" if summary.converged else ""
    if summary.repeated:
        ended += f"; {counted(summary.repeated, 're-measurement')} of the top configs and the baseline"
    cost = out.cost.text() if out.cost is not None else ""
    print(
        f"\n{_measured_text(summary)}, {counted(summary.duplicates, 'duplicate suggestion')} answered from "
        f"earlier results{converged}, {counted(summary.rejected, 'suggestion')} rejected "
        f"before launch ({summary.screened} predicted to fail to start); {summary.told} told this run in "
        f"{summary.wall_s:.0f} s{ended}; {cost}"
        f"\nResults: {run_dir}/ ({', '.join(files) or 'nothing written: no trial finished'})"
    )


def _measured_text(summary: Any) -> str:
    """'N configs measured'; where some failed to start (never served: not measured), both counts."""
    from autotune.core.values import counted

    if not summary.unstarted:
        return f"{counted(summary.completed, 'config')} measured"
    measured = summary.completed - summary.unstarted
    launched = counted(summary.completed, "config")
    return f"{launched} launched, {measured} measured ({summary.unstarted} failed to start)"
