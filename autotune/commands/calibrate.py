"""`autotune calibrate`: fit the simulator's constants to measurements, or print the built-in ones.

    autotune calibrate --print-defaults > my.yaml             every constant, with unit, range, meaning
    autotune calibrate --url http://host:8000 --gpu H100      the designed set on a running server
    autotune calibrate --backend vllm --model M --gpu H100    the designed set on configs it launches
    autotune calibrate --points measured.yaml                 refit earlier (or published) measurements

It writes the fitted calibration (`-o FILE`, default runs/calibration-<what>/calibration.yaml), the
report next to it (<stem>-report.txt) and, when it measured, the points (<stem>-points.yaml, refit
with --points; those measured before a failure or Ctrl-C too). Every input is checked before anything
runs: a bad one is one line, exit 2, nothing written. `--sim-calibration FILE` starts (and pulls weakly
toward) another calibration than the built-in one. The fitted file goes to `--sim-calibration` of run,
bench and sim-server.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.commands.options import DEFAULT_SERVE_CMD
from autotune.core import values
from autotune.core.errors import AutotuneError
from autotune.core.inputs import arg, given_flags, nearest_existing, refuse_unless, refuse_unused
from autotune.outputs.images import image_reference
from autotune.sim.calibration import add_calibration_argument

if TYPE_CHECKING:
    from autotune.calibrate.campaign import Measured

DEFAULT_GPU_MINUTES = 10.0
LATEST_IMAGE = "vllm/vllm-openai:latest"
# The options for launched servers, as (flag, attribute, default, the backends using them).
_LAUNCH_OPTIONS = (
    ("--serve-cmd", "serve_cmd", DEFAULT_SERVE_CMD, ("vllm",)),
    ("--image", "image", LATEST_IMAGE, ("docker",)),
    ("--gpus", "gpus", None, ("vllm", "docker")),
)
# The options of a measurement (--url or --backend): a --points fit reads all of it from the file.
_MEASURE_OPTIONS = (
    ("--model", "model", None),
    ("--gpu", "gpu", None),
    ("--set", "settings", []),
    ("--gpu-minutes", "gpu_minutes", DEFAULT_GPU_MINUTES),
)
DEFAULT_PRIOR_WEIGHT = 0.1
DEFAULT_MAX_EVALUATIONS = 30
# Every option but --print-defaults (and --quiet, which says nothing either way): it prints the built-in
# calibration whatever they say.
_OTHER_OPTIONS = (
    ("--points", "points", None),
    ("--url", "url", None),
    ("--backend", "backend", None),
    *_MEASURE_OPTIONS,
    *((flag, name, default) for flag, name, default, _ in _LAUNCH_OPTIONS),
    ("--split", "split", None),
    ("--sim-calibration", "sim_calibration", None),
    ("--prior-weight", "prior_weight", DEFAULT_PRIOR_WEIGHT),
    ("--max-evaluations", "max_evaluations", DEFAULT_MAX_EVALUATIONS),
    ("-o", "output", None),
)
HELP = (
    "Fit the simulator's constants to your GPU's measurements (a running server, launched configs, a file)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune calibrate` options."""
    source = parser.add_argument_group("what to fit to (one of)")
    source.add_argument(
        "--print-defaults",
        action="store_true",
        help="print the built-in calibration as YAML (with no other option: it prints the built-in "
        "values whatever they say, --sim-calibration's included)",
    )
    source.add_argument(
        "--points", metavar="FILE", help="measured points (benchmarks/fidelity_points.yaml's format)"
    )
    source.add_argument(
        "--url",
        type=arg(values.server_url),
        help="run the designed set on this running OpenAI-compatible server",
    )
    source.add_argument(
        "--backend", choices=("vllm", "docker"), help="launch the configs the designed set needs"
    )
    server = parser.add_argument_group("the server")
    server.add_argument(
        "--model", help="the model (catalog name or config.json); --url: default the served one"
    )
    server.add_argument(
        "--gpu", help="the GPU type the server runs on (e.g. H100); needed with --url/--backend"
    )
    server.add_argument(
        "--set", dest="settings", action="append", default=[], metavar="NAME=VALUE",
        help="a vLLM flag the server runs with (repeatable); --url: every one not vLLM's default that "
        "/metrics does not say (it says max_model_len, block_size, gpu_memory_utilization, "
        "kv_cache_dtype, enable_prefix_caching; not max_num_seqs, max_num_batched_tokens, "
        "enable_chunked_prefill, ...)",
    )  # fmt: skip
    server.add_argument(
        "--gpus", help="--backend: device ids (0,1) or a count; two or more add a TP=2 config"
    )
    server.add_argument("--serve-cmd", default=DEFAULT_SERVE_CMD, help="--backend vllm: the server command")
    server.add_argument(
        "--image", default=LATEST_IMAGE, type=arg(image_reference), help="--backend docker: the image"
    )
    server.add_argument(
        "--gpu-minutes", type=float, default=DEFAULT_GPU_MINUTES,
        help=f"a cap on the designed set's GPU time, as predicted (default {DEFAULT_GPU_MINUTES:g}; one "
        "below the least set is refused, naming it)",
    )  # fmt: skip
    fit = parser.add_argument_group("the fit")
    fit.add_argument("--split", choices=("train", "validation"), help="--points: fit only this split")
    add_calibration_argument(fit)
    fit.add_argument(
        "--prior-weight", type=float, default=DEFAULT_PRIOR_WEIGHT,
        help=f"pull toward the prior (default {DEFAULT_PRIOR_WEIGHT:g})",
    )  # fmt: skip
    fit.add_argument(
        "--max-evaluations", type=int, default=DEFAULT_MAX_EVALUATIONS,
        help=f"least-squares evaluations (default {DEFAULT_MAX_EVALUATIONS})",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", metavar="FILE",
        help="where the calibration goes (default "
        "runs/calibration-<--model or server>-<gpu>/calibration.yaml; --points: "
        "runs/calibration-<its stem>/calibration.yaml); neither it nor the <stem>-report.txt and "
        "<stem>-points.yaml written next to it may exist (--points writes no points file)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    """Print the defaults, or measure (if asked), fit and write the calibration and its report."""
    from autotune.sim.calibration import DEFAULT_CALIBRATION, calibration_option, calibration_yaml

    if args.print_defaults:
        given = given_flags(args, _OTHER_OPTIONS)
        if given:
            raise AutotuneError(
                "--print-defaults prints the built-in calibration and takes no other option: "
                f"{', '.join(given)} given"
            )
        header = (
            "autotune simulator calibration: the built-in constants (autotune calibrate --print-defaults).\n"
        )
        header += "A file for --sim-calibration may name only some keys; the others keep these values."
        print(calibration_yaml(DEFAULT_CALIBRATION, header), end="")
        return 0
    from autotune.core.interrupts import stops_as_sigint

    prior = calibration_option(args.sim_calibration)
    job = _prepare(args)
    say = (lambda line: None) if args.quiet else (lambda line: print(f"calibrate: {line}", file=sys.stderr))
    with stops_as_sigint():  # SIGTERM keeps the measured points as Ctrl-C does
        return _fit_and_write(args, job, prior, say)


def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Check every input before anything runs; the job's source, target and output paths."""
    from autotune.calibrate.campaign import Target
    from autotune.catalog.gpus import get_gpu
    from autotune.commands.bench import parse_settings

    sources = [name for name in ("points", "url", "backend") if getattr(args, name)]
    if len(sources) != 1:
        raise AutotuneError(
            "give exactly one of --points FILE, --url URL or --backend vllm|docker (or --print-defaults)"
        )
    if not 0 < args.gpu_minutes <= 600:
        raise AutotuneError(f"--gpu-minutes must be in (0, 600], got {args.gpu_minutes:g}")
    if not (math.isfinite(args.prior_weight) and args.prior_weight > 0):  # nan and inf broke the fit
        raise AutotuneError(f"--prior-weight must be a finite number > 0, got {args.prior_weight:g}")
    if args.max_evaluations < 1:
        raise AutotuneError(f"--max-evaluations must be >= 1, got {args.max_evaluations}")
    _refuse_ignored(args)
    job: dict[str, Any] = {"source": sources[0]}
    if args.points:
        from autotune.calibrate.points import load_points
        from autotune.calibrate.rankings import unfitted_points

        points = [p for p in load_points(args.points) if args.split in (None, p.get("split", "train"))]
        unfitted = unfitted_points(args.points)  # sources marked `fitted: false` are reported, not fitted
        points = [p for p in points if p["id"] not in unfitted]
        if not points:
            raise AutotuneError(f"points file {args.points}: no point in split {args.split}")
        job["points"], job["name"] = points, Path(args.points).stem
    else:
        if not args.gpu:
            raise AutotuneError("--gpu: which GPU the server runs on (e.g. H100)")
        get_gpu(args.gpu)
        model = args.model
        if model:
            from autotune.catalog.models import get_model, qualified_name

            get_model(model)
            model = qualified_name(model)
        job["target"] = Target(model, args.gpu, parse_settings(args.settings))
        job["name"] = f"{(model or 'server').split('/')[-1]}-{args.gpu}".lower()
    if args.url:
        from autotune.calibrate.campaign import check_settings
        from autotune.calibrate.measure import probe_server

        job["info"] = probe_server(args.url)
        check_settings(job["target"].settings, job["info"])
    if args.backend:
        job["backend"], job["gpu_ids"] = _backend(args)
    job["output"] = _output(args, job["name"])
    return job


def _refuse_ignored(args: argparse.Namespace) -> None:
    """Options the chosen source would ignore are errors: a launched server's without --backend (or for
    the other backend), a measurement's with --points, --split without it."""
    refuse_unused(args, "--backend", _LAUNCH_OPTIONS)
    refuse_unless(not args.points, args, _MEASURE_OPTIONS, "--url or --backend")
    refuse_unless(bool(args.points), args, [("--split", "split", None)], "--points")


def _backend(args: argparse.Namespace) -> tuple[Any, list[int]]:
    from autotune.backends.factory import make_backend
    from autotune.core.inputs import check_gpus_text, serve_command
    from autotune.dispatch.gpus import parse_gpus

    if not args.model:
        raise AutotuneError("--backend needs --model: the model to launch")
    check_gpus_text(args.gpus)
    backend = make_backend(args.backend, args.gpu, serve_cmd=serve_command(args.serve_cmd), image=args.image)
    if hasattr(backend, "preflight"):
        backend.preflight()
    return backend, parse_gpus(args.gpus) or [0]


def _output(args: argparse.Namespace, name: str) -> Path:
    """Where the calibration goes (-o, else runs/calibration-NAME/), refused in one line before anything
    is measured when it or a file written next to it exists, or its folder cannot take a file."""
    if args.output == "":  # argparse takes `-o ""`: it silently wrote the default path
        raise AutotuneError("-o: an empty path: give a file, or leave -o out for the default")
    path = (
        Path(args.output)
        if args.output is not None
        else Path("runs") / f"calibration-{re.sub(r'[^a-z0-9.]+', '-', name)}" / "calibration.yaml"
    )
    # --points writes no points file: the one it refits may be this output's companion
    written = [f for kind, f in _companions(path).items() if kind != "points" or not args.points]
    for target in (path, *written):
        if target.exists():
            raise AutotuneError(f"{target} exists: pass another -o FILE (nothing is overwritten)")
    if path.parent.exists() and not path.parent.is_dir():
        raise AutotuneError(f"cannot write {path}: {path.parent} is not a folder")
    _check_writable(path)
    return path


def _check_writable(path: Path) -> None:
    """A file created and removed where `path`'s folder is (or will be made): found after the measuring,
    an unwritable output lost it. os.access is no test: root passes it on /proc."""
    import tempfile

    existing = nearest_existing(path.parent)
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".calibrate-"):
            pass
    except OSError as exc:
        raise AutotuneError(
            f"cannot write {path}: no file can be created in {existing} ({exc.strerror})"
        ) from None


def _companions(path: Path) -> dict[str, Path]:
    return {
        "report": path.with_name(f"{path.stem}-report.txt"),
        "points": path.with_name(f"{path.stem}-points.yaml"),
    }


def _fit_and_write(args: argparse.Namespace, job: dict[str, Any], prior: Any, say: Any) -> int:
    from autotune.calibrate.fit import FitOptions, fit_calibration
    from autotune.calibrate.report import fit_report
    from autotune.core.atomic import atomic_write_text
    from autotune.sim.calibration import calibration_yaml

    output: Path = job["output"]
    files = _companions(output)
    header = [f"autotune calibrate ({time.strftime('%Y-%m-%d %H:%M')}): {_what(args, job)}"]
    notes: list[str] = []
    if job["source"] == "points":
        points = job["points"]
    else:
        measured = _measure(args, job, prior, say, header, files["points"])
        if measured is None:
            return 130
        points, notes = measured.points, measured.notes
    options = FitOptions(prior_weight=args.prior_weight, max_evaluations=args.max_evaluations)
    try:
        result = fit_calibration(points, prior, options, say)
    except (AutotuneError, KeyboardInterrupt) as exc:
        if job["source"] == "points":
            raise
        return _stopped(exc, "during the fit", _kept(len(points), files["points"], output))
    result.notes += notes
    report = fit_report(result, header, job["source"] == "points")
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(files["report"], report)
    atomic_write_text(
        output, calibration_yaml(result.fitted, "\n".join([*header, f"report: {files['report'].name}"]))
    )
    print(report, end="")
    print(f"calibration written to {output} (use it: --sim-calibration {output})", file=sys.stderr)
    return 0


def _measure(
    args: argparse.Namespace, job: dict[str, Any], prior: Any, say: Any, header: list[str], path: Path
) -> Measured | None:
    """The measured points (written to `path`, the points file, with the `header` line they add). What a
    failure or Ctrl-C leaves is written too, and its line says so (None: interrupted, said)."""
    from autotune.calibrate.campaign import Measured, on_backend, on_url

    measured = Measured()
    try:
        if job["source"] == "url":
            on_url(job["info"], job["target"], args.gpu_minutes, prior, say, measured)
        else:
            on_backend(job["backend"], job["target"], job["gpu_ids"], args.gpu_minutes, prior, say, measured)
    except (AutotuneError, KeyboardInterrupt) as exc:
        if not measured.points:
            raise
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else exc
        _write_points(measured, [*header, f"stopped early: {why}"], path)
        _stopped(exc, "while measuring", _kept(len(measured.points), path, job["output"]))
        return None
    _write_points(measured, header, path)
    say(f"measured points written to {path}")
    return measured


def _write_points(measured: Measured, header: list[str], path: Path) -> None:
    """The points file of a measurement; `header` gets the line of what it measured."""
    from autotune.calibrate.points import points_yaml
    from autotune.core.atomic import atomic_write_text

    startup = measured.startup_seconds
    header.append(
        f"measured: {len(measured.points)} points, {measured.gpu_seconds / 60:.2f} GPU-minutes of runs"
        + (f" + {startup / 60:.2f} of server startup" if startup else "")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, points_yaml(measured.points, {"autotune-calibrate": " ".join(header)}))


def _stopped(exc: BaseException, when: str, kept: str) -> int:
    """Ctrl-C or an error once points were measured, with `kept` (where they are): Ctrl-C said here
    (exit 130), an error raised with it."""
    if isinstance(exc, KeyboardInterrupt):
        print(f"autotune calibrate: interrupted {when}; {kept}", file=sys.stderr)
        return 130
    raise type(exc)(f"{exc}; {kept}") from None


def _kept(count: int, points: Path, output: Path) -> str:
    """Where the measured points are, and how to refit them."""
    refit = f"autotune calibrate --points {points} -o {output}"
    return f"{count} measured points are in {points}: refit them with {refit}"


def _what(args: argparse.Namespace, job: dict[str, Any]) -> str:
    if job["source"] == "points":
        return f"fitted to {args.points}" + (f" (split {args.split})" if args.split else "")
    target = job["target"]
    where = job["info"].shown if args.url else f"configs launched by the {args.backend} backend"
    return (
        f"fitted to the designed set on {where}; model {target.model or job['info'].model}, GPU {target.gpu}"
    )
