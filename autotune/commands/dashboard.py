"""`autotune dashboard`: optuna-dashboard on a run's study (127.0.0.1, a free port unless --port)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from autotune.core.inputs import port_number

HELP = "Serve optuna-dashboard for a run's study on 127.0.0.1 (the URL is printed); Ctrl-C stops it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune dashboard` options."""
    parser.add_argument("run_dir", metavar="RUN", help="a run folder, e.g. runs/<study>")
    parser.add_argument("--port", type=port_number, default=0, help="port (default: a free one)")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from autotune.core.errors import AutotuneError
    from autotune.outputs.dashboard import start_dashboard
    from autotune.outputs.run_info import load_run
    from autotune.store.urls import run_storage

    info = load_run(args.run_dir)
    storage = run_storage(info)  # resolved against the run folder, wherever the command runs from
    _write_note(info, storage)
    try:
        server = start_dashboard(storage, port=args.port)
    except OSError as exc:
        raise AutotuneError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}") from exc
    print(f"optuna-dashboard for study {info.study}: {server.url}", flush=True)
    print("Ctrl-C to stop.", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _write_note(info: Any, storage: str | None = None) -> None:
    """Refresh the study's note and feasibility figure (a study from before they existed gets them)."""
    from autotune.outputs.dashboard import StudyNote
    from autotune.store.storage import open_study
    from autotune.store.urls import run_storage

    study = open_study(info.study, storage or run_storage(info))
    StudyNote(study, info.meta, run_dir=info.directory).update(force=True)  # a guided run's: its guide.json
