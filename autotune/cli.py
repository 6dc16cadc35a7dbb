"""The `autotune` command line: one subcommand per module in autotune/commands/.

Each command module defines HELP (one line), add_arguments(parser) and run(args) -> exit code,
and keeps heavy imports (optuna, ray...) inside run() so `autotune --help` stays fast.
User errors (AutotuneError) print one line and exit 2 (a run stopped by a fault: 1); Ctrl-C and
SIGTERM exit 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from autotune import __version__
from autotune.core.errors import AutotuneError

COMMANDS = {
    "run": "autotune.commands.run",
    "bench": "autotune.commands.bench",
    "sim-server": "autotune.commands.sim_server",
    "calibrate": "autotune.commands.calibrate",
    "export": "autotune.commands.export",
    "dashboard": "autotune.commands.dashboard",
}


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong, and where the help is), exit 2."""

    def error(self, message: str) -> NoReturn:  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = _OneLineParser(
        prog="autotune", description="Find the best vLLM launch flags for a model, GPU, workload and SLO."
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(handler=module.run, usage_error=cmd.error)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `autotune` console script."""
    try:
        parser = build_parser()  # imports every command module: a Ctrl-C may come meanwhile
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand, whose --help lists its flags (the top level names none)
        args.usage_error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.handler(args) or 0)
    except AutotuneError as exc:
        line = " ".join(str(exc).split("\n"))  # one line, even when a library's message had several
        print(f"autotune {args.command}: error: {line}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except OSError as exc:
        # The environment failed (a full disk, a folder that went away): one line, not a traceback.
        where = f": {exc.filename}" if exc.filename else ""
        print(f"autotune {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
