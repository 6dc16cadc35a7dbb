"""`autotune export`: a tuned config as vllm serve flags, a command, docker run, a vLLM YAML, a Kubernetes
Deployment or production-stack Helm values."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from autotune.core.config import VLLM_RELEASE
from autotune.core.inputs import ChoiceOption

if TYPE_CHECKING:
    import optuna

    from autotune.outputs.run_info import RunInfo
    from autotune.tune.study import TrialRecord

DEFAULT_TAG = f"v{VLLM_RELEASE}"
DEFAULT_SECRET, DEFAULT_SECRET_KEY = "hf-token", "token"
MAX_REPLICAS = 10_000  # a replicaCount past it is a typo (Kubernetes takes up to 2**31 - 1)
CONTAINERS = ("docker", "k8s", "helm")
REPLICATED = ("k8s", "helm")  # the formats that say how many replicas to run
# The options only some formats use, as (flag, attribute, default, those formats): the others would
# drop them unseen.
FORMAT_OPTIONS: tuple[ChoiceOption, ...] = (
    ("--tag", "tag", None, CONTAINERS),
    ("--image", "image", None, CONTAINERS),
    ("--secret", "secret", DEFAULT_SECRET, ("k8s", "helm")),
    ("--secret-key", "secret_key", DEFAULT_SECRET_KEY, ("k8s", "helm")),
    ("--replicas", "replicas", None, REPLICATED),
)

HELP = (
    "Print a run's recommended (or any) config as flags, a command, docker run, vLLM YAML, a Kubernetes "
    "Deployment or production-stack Helm values."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `autotune export` options."""
    from autotune.core import values
    from autotune.core.inputs import arg
    from autotune.outputs import export, images
    from autotune.outputs.export import FORMATS

    parser.add_argument("run_dir", metavar="RUN", help="a run folder, e.g. runs/<study>")
    parser.add_argument("--trial", type=int, help="trial number (default: the recommended config)")
    parser.add_argument("--format", default="cmd", choices=FORMATS, help="output format (default cmd)")
    parser.add_argument(
        "--tag",
        type=arg(images.image_tag),  # an empty tag would deploy `:latest` (or the default) unasked
        help="docker, k8s, helm: the tag of the image the run was tuned with, else of vllm/vllm-openai "
        f"(default {DEFAULT_TAG}, the vLLM release autotune follows); not with --image",
    )
    parser.add_argument(
        "--image",
        type=arg(images.image_reference),  # "" is not "the default image"; a space would split it
        help="container image (default: the one the run was tuned with, else vllm/vllm-openai:TAG)",
    )
    parser.add_argument(
        "--secret",
        type=arg(export.secret_name),
        default=DEFAULT_SECRET,
        help="k8s/helm: the Secret holding HF_TOKEN",
    )
    parser.add_argument(
        "--secret-key",
        type=arg(export.secret_key),
        default=DEFAULT_SECRET_KEY,
        help="k8s/helm: the key of HF_TOKEN in that Secret",
    )
    parser.add_argument(
        "--replicas",
        type=arg(values.bounded_int, 1, MAX_REPLICAS),
        help="k8s, helm: replicas (default: the replicas the run sized for its --target-rate, else 1)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the export on stdout (a simulated run's note with it, or on stderr for `flags`)."""
    import optuna

    from autotune.core.errors import AutotuneError, RunFailure
    from autotune.core.inputs import refuse_unused
    from autotune.outputs import export, run_info
    from autotune.outputs.outcome import SIMULATED_NOTE, is_simulated
    from autotune.store.storage import STORAGE_ERRORS, open_study, storage_error
    from autotune.store.urls import run_storage
    from autotune.tune.recommendation import decide
    from autotune.tune.remeasure import StoredRepeats
    from autotune.tune.study import records

    refuse_unused(args, "--format", FORMAT_OPTIONS)
    info = run_info.load_run(args.run_dir)
    # only the container formats read the run's image: a damaged one must not stop the others
    uses_image = args.format in CONTAINERS
    image = deployed_image(args.image, args.tag, info.meta.get("image")) if uses_image else ""
    storage = run_storage(info)
    study = open_study(info.study, storage)
    try:
        recs = records(study)
    except STORAGE_ERRORS() as exc:  # a damaged database: one line, as `run` says it
        raise RunFailure(f"the storage failed: {storage_error(exc)}") from None
    if args.trial is not None:
        chosen = next((r for r in recs if r.number == args.trial), None)
        if chosen is None:
            raise AutotuneError(f"trial {args.trial} not found (or not finished) in {args.run_dir}")
        refuse_unservable(chosen)
    else:
        maximize = [d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions]
        names = study.metric_names or [f"objective {i}" for i in range(len(maximize))]
        chosen = decide(recs, maximize, names, StoredRepeats.of(study).values).trial
        if chosen is None and not recs:
            raise AutotuneError(f"{args.run_dir} has no finished trial yet: nothing to export")
        if chosen is None:
            raise AutotuneError(f"{args.run_dir} has no feasible trial to recommend; pass --trial N")
    running = still_running(study)
    if running:
        so_far = "its best config so far, which may change" if args.trial is None else "a trial of it"
        print(
            f"autotune export: note: {args.run_dir} is still running ({running}): this is {so_far}",
            file=sys.stderr,
        )
    if not chosen.feasible:
        reason = chosen.status  # its failure, an SLO, or not keeping up: as trials.csv says it
        print(f"autotune export: warning: trial {chosen.number} is not feasible ({reason})", file=sys.stderr)
    replicas, why = replica_count(args.replicas, args.format, info, chosen)
    options = export.ExportOptions(
        image=image, secret=args.secret, secret_key=args.secret_key, replicas=replicas, replicas_note=why
    )
    text = export.render(chosen.engine_config(), args.format, options=options)
    if is_simulated(info.meta):
        if args.format in export.NOTE_ON_STDERR:
            print(f"autotune export: {SIMULATED_NOTE}", file=sys.stderr)
        else:
            text = export.with_note(text, SIMULATED_NOTE)
    sys.stdout.write(text)
    return 0


def still_running(study: optuna.Study) -> str:
    """Who is still running the study ("pid N on HOST"), from its driver's lease; "" when none is."""
    from autotune.store.lease import current_driver

    driver = current_driver(study)
    return f"pid {driver.pid} on {driver.host}" if driver is not None and driver.alive() else ""


def refuse_unservable(chosen: TrialRecord) -> None:
    """AutotuneError (one line) for a trial with no server to deploy: one that did not finish (no
    verdict), or did not start (vLLM refused it, or the screen predicted it would). One that ran and
    missed an SLO still serves: it is exported with a warning."""
    from autotune.core.errors import STARTUP_FAILURES, AutotuneError

    why = chosen.failure or "interrupted"
    if chosen.state != "COMPLETE":
        raise AutotuneError(f"trial {chosen.number} did not finish ({why}): pass another --trial")
    if chosen.failure in STARTUP_FAILURES or not chosen.launched:
        did = "was predicted not to start" if chosen.screened else "did not start"
        raise AutotuneError(
            f"trial {chosen.number} {did} ({why}): vLLM would not serve it; pass another --trial"
        )


def deployed_image(image: str | None, tag: str | None, recorded: str | None) -> str:
    """The image to deploy: --image, else the one the run was tuned with (given --tag, with that tag),
    else vLLM's at --tag. AutotuneError for --tag with --image: the image names its own tag."""
    from autotune.core.errors import AutotuneError
    from autotune.outputs.export import IMAGE
    from autotune.outputs.images import image_reference, retag

    if image is not None:
        if tag is not None:
            raise AutotuneError(f"--tag {tag} with --image {image}: give the tag in --image (REPO:TAG)")
        return image
    if recorded:
        image_reference(recorded, "the run's image (run.json)")
        return retag(recorded, tag) if tag else recorded
    return f"{IMAGE}:{tag or DEFAULT_TAG}"


def replica_count(given: int | None, fmt: str, info: RunInfo, chosen: TrialRecord) -> tuple[int, str]:
    """The replica count and, when not given, where it came from: --replicas, else (k8s, helm) the
    replicas the run sizes the chosen trial at for its --target-rate, else 1."""
    from autotune.outputs.cost import sizing
    from autotune.outputs.run_info import target_rate

    if given is not None or fmt not in REPLICATED:  # a broken best.json fails only the formats reading it
        return given or 1, ""
    rate = target_rate(info)
    sized = sizing(chosen, rate) if rate else None
    if sized is None:
        return 1, ""
    return sized.replicas, (
        f"the run's sizing for {rate:g} req/s (one replica serves {sized.per_replica_rate:.2f} req/s); "
        "--replicas N to change"
    )
