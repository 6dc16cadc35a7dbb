"""`autotune dashboard`: optuna-dashboard on a run's study (127.0.0.1, a free port unless --port)."""

from __future__ import annotations

import argparse
import sys
import time

from autotune.inputs import port_number

HELP = "Serve optuna-dashboard for a run's study on 127.0.0.1 (the URL is printed); Ctrl-C stops it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune dashboard` options."""
    parser.add_argument("run_dir", metavar="RUN", help="a run folder, e.g. runs/<study>")
    parser.add_argument("--port", type=port_number, default=0, help="port (default: a free one)")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from autotune.dashboard import start_dashboard
    from autotune.errors import AutotuneError
    from autotune.export import load_run
    from autotune.storage_url import run_storage

    info = load_run(args.run_dir)
    try:
        server = start_dashboard(run_storage(info), port=args.port)
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
