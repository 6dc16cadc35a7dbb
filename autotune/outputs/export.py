"""A tuned config in the forms users paste: flags, a `vllm serve` command, `docker run`, a vLLM YAML
config file (`vllm serve --config`), a Kubernetes Deployment (`kubectl apply -f`), and values for the
vLLM production stack's Helm chart.

Secrets are referenced, never written: HF_TOKEN goes by name (`--env HF_TOKEN`, a secretKeyRef to a
Secret named by `--secret`), and so does VLLM_API_KEY in `docker run`, as the docker backend passed it.
A local model directory is mounted read-only at /models/<name> (its name without ':' or ',', which a mount
cannot take); docker mounts it with `--mount`, which takes any host path (`-v` splits one with ':').
"""

from __future__ import annotations

import csv
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.core.api_keys import SERVER_KEY_VAR
from autotune.core.config import DEFAULT_IMAGE, VLLM_IMAGE, VLLM_RELEASE, EngineConfig, gpus_per_replica
from autotune.core.errors import AutotuneError
from autotune.outputs.images import split_image

FORMATS = ("flags", "cmd", "docker", "yaml", "k8s", "helm")
IMAGE = VLLM_IMAGE
PORT = 8000
MODEL_MOUNT = "/models"  # where a local model directory is mounted in a container
# The host's Hugging Face cache, left to the user's shell to expand (so it is double-quoted, not single).
HF_CACHE_VOLUME = "$HOME/.cache/huggingface:/root/.cache/huggingface"


def serve_flags(config: EngineConfig) -> list[str]:
    """The `vllm serve` flags of a config, without the model."""
    return config.to_args()[1:]


# Kubernetes names (k8s.io/apimachinery validation): a Secret is a DNS-1123 subdomain, a key in it a
# config key. Checked because they are written into the export, comments included: a newline in one
# would add YAML of the user's making to a manifest.
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
K8S_NAME_CHARS = 253


def secret_name(value: str, what: str = "--secret") -> str:
    """A Kubernetes Secret's name (lowercase letters, digits, '-' and '.'); AutotuneError otherwise."""
    if not _SECRET_NAME.fullmatch(value) or len(value) > K8S_NAME_CHARS:
        raise AutotuneError(f"{what} {value!r} is not a Kubernetes Secret name (e.g. hf-token)")
    return value


def secret_key(value: str, what: str = "--secret-key") -> str:
    """A key of a Kubernetes Secret (letters, digits, '-', '_' and '.'; not '.', nor starting with '..',
    which Kubernetes' IsConfigMapKey refuses); AutotuneError otherwise."""
    bad = value == "." or value.startswith("..")
    if bad or not _SECRET_KEY.fullmatch(value) or len(value) > K8S_NAME_CHARS:
        raise AutotuneError(f"{what} {value!r} is not a Kubernetes Secret key (e.g. token)")
    return value


@dataclass(frozen=True)
class ExportOptions:
    """What the container formats need beyond the flags.

    `image` is the image the run was tuned with (the docker backend's `--image`), else vLLM's at
    `--tag`; `secret` names the Kubernetes Secret (and key) holding HF_TOKEN: referenced, never written.
    """

    image: str = DEFAULT_IMAGE
    secret: str = "hf-token"
    secret_key: str = "token"
    replicas: int = 1
    replicas_note: str = ""  # where replicaCount came from, when not from --replicas (a YAML comment)


def render(
    config: EngineConfig, fmt: str, image_tag: str = f"v{VLLM_RELEASE}", options: ExportOptions | None = None
) -> str:
    """The config in one of FORMATS, as text ending with a newline."""
    opts = options or ExportOptions(image=f"{IMAGE}:{image_tag}")
    if fmt == "flags":
        return shlex.join(serve_flags(config)) + "\n"
    if fmt == "cmd":
        return shlex.join(["vllm", "serve", *config.to_args()]) + "\n"
    if fmt == "docker":
        args = docker_command(config, opts.image)
        return " ".join(f'"{a}"' if a == HF_CACHE_VOLUME else shlex.quote(a) for a in args) + "\n"
    if fmt == "yaml":
        return vllm_yaml(config)
    if fmt == "k8s":
        return k8s_deployment(config, opts)
    if fmt == "helm":
        return helm_values(config, opts)
    raise AutotuneError(f"unknown export format {fmt!r} (use {', '.join(FORMATS)})")


def command_lines(config: EngineConfig) -> str:
    """The `vllm serve` command with one flag a line (shell line continuations), for where a long line
    does not wrap (a code block)."""
    groups = _flag_groups(["vllm", "serve", *config.to_args()])
    return " \\\n  ".join(shlex.join(group) for group in groups) + "\n"


def _flag_groups(args: list[str]) -> list[list[str]]:
    """`vllm serve MODEL --a 1 --b` -> [[vllm, serve, MODEL], [--a, 1], [--b]]: a flag with its value."""
    groups: list[list[str]] = [[]]
    for arg in args:
        if arg.startswith("--"):
            groups.append([])
        groups[-1].append(arg)
    return groups


# Formats whose output is words to splice into a command (`vllm serve MODEL $(autotune export RUN
# --format flags)`): command substitution does not parse `#` as a comment, so a note there would become
# arguments. Their note goes to stderr; the other formats are a whole command or document, which carry it.
NOTE_ON_STDERR = ("flags",)


def with_note(text: str, note: str) -> str:
    """`text` (a `render` output of a format not in NOTE_ON_STDERR) with `note` as a `#` line above the
    command or YAML document: a line a shell running it as a script, or a YAML parser, ignores."""
    return "# " + " ".join(note.split()) + "\n" + text


def local_model_dir(model: str) -> Path | None:
    """The model as a local directory (`--model DIR`), or None for a Hugging Face id."""
    path = Path(model).expanduser()
    if path.is_dir() or model.startswith(("/", "./", "../", "~")):
        return path.resolve()
    return None


def _container_model(config: EngineConfig) -> tuple[list[str], Path | None]:
    """The model args inside a container, and the host directory to mount (a local model), if any.

    A local directory is mounted read-only at /models/<name>; `--served-model-name` keeps the name
    clients used during tuning, unless the config sets its own (vLLM keeps the last of two: one only).
    """
    local = local_model_dir(config.model)
    if local is None:
        return ["--model", config.model], None
    named = "served_model_name" in config.params()
    served = [] if named else ["--served-model-name", config.model]
    return ["--model", model_mount(local), *served], local


def model_mount(local: Path) -> str:
    """Where a local model directory is mounted in a container: /models/<its name>, with each run of
    characters beyond letters, digits, '.', '_' and '-' made one '-' (a ':' splits docker's `-v` and is
    refused in a k8s mountPath; a ',' splits docker's `--mount`)."""
    return f"{MODEL_MOUNT}/{re.sub(r'[^A-Za-z0-9._-]+', '-', local.name) or 'model'}"


def docker_mount(local: Path) -> list[str]:
    """`--mount` of a local model, read-only: unlike `-v HOST:DST:ro` it takes a host path with ':'. Its
    value is one CSV record (docker reads it with Go's encoding/csv): a field with ',' or '"' is quoted."""
    record = io.StringIO()
    fields = ["type=bind", f"source={local}", f"target={model_mount(local)}", "readonly"]
    csv.writer(record, lineterminator="").writerow(fields)
    return ["--mount", record.getvalue()]


def docker_command(config: EngineConfig, image: str = DEFAULT_IMAGE) -> list[str]:
    """`docker run` of vLLM's OpenAI image with this config. HF_TOKEN and VLLM_API_KEY go by name: docker
    copies a variable the shell has set and skips one it has not, so a server tuned behind an API key is
    deployed behind the same one."""
    gpus = gpus_per_replica(config.params())
    model_args, local = _container_model(config)
    mount = docker_mount(local) if local is not None else []
    return [
        "docker",
        "run",
        "--gpus",
        str(gpus),
        "--ipc=host",
        "-p",
        f"{PORT}:{PORT}",
        "-v",
        HF_CACHE_VOLUME,
        *mount,
        "--env",
        "HF_TOKEN",
        "--env",
        SERVER_KEY_VAR,
        image,
        *model_args,
        *serve_flags(config),
    ]


def vllm_yaml(config: EngineConfig) -> str:
    """A config file for `vllm serve --config FILE`: kebab-case flag names as keys.

    vLLM turns `key: true` into `--key`; a false boolean is written as its `no-` flag, which is how
    vLLM's BooleanOptionalAction flags (e.g. --no-enable-chunked-prefill) are switched off.
    """
    data: dict[str, Any] = {"model": config.model}
    for name, value in config.params().items():
        key = name.replace("_", "-")
        if value is False:
            data[f"no-{key}"] = True
        else:
            data[key] = value
    return yaml.safe_dump(data, sort_keys=False)


def k8s_deployment(config: EngineConfig, options: ExportOptions = ExportOptions()) -> str:  # noqa: B008
    """A Deployment to `kubectl apply -f`: `options.replicas` pods of one vLLM container each, with the
    volumes it mounts (shared memory for vLLM's workers, a local model directory as a hostPath)."""
    model_args, local = _container_model(config)
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    if local is not None:
        mounts.append({"name": "model", "mountPath": model_mount(local), "readOnly": True})
        volumes.append({"name": "model", "hostPath": {"path": str(local), "type": "Directory"}})
    secret = {"secretKeyRef": {"name": options.secret, "key": options.secret_key, "optional": True}}
    container = {
        "name": "vllm",
        "image": options.image,
        "args": [*model_args, *serve_flags(config)],
        "env": [{"name": "HF_TOKEN", "valueFrom": secret}],
        "ports": [{"containerPort": PORT, "name": "http"}],
        "resources": {"limits": {"nvidia.com/gpu": gpus_per_replica(config.params())}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10},
        "volumeMounts": mounts,
    }
    name = f"vllm-{helm_model_name(config.model)}"
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
    pod = {"containers": [container], "volumes": volumes}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": max(1, options.replicas),
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    head = (
        f"# A Kubernetes Deployment. HF_TOKEN comes from the Secret {options.secret!r} (key "
        f"{options.secret_key!r}):\n{_secret_line(options)}"
        f"#   kubectl apply -f vllm.yaml && kubectl expose deployment {name} --port {PORT}\n"
    )
    if options.replicas_note:
        head += f"# replicas {options.replicas}: {options.replicas_note}\n"
    return head + yaml.safe_dump(deployment, sort_keys=False)


def _secret_line(options: ExportOptions) -> str:
    """The comment line that creates the Secret holding HF_TOKEN (its value from the user's shell)."""
    return (
        f"#   kubectl create secret generic {options.secret} --from-literal={options.secret_key}=$HF_TOKEN\n"
    )


# vLLM flags the production stack's vllmConfig names (values.yaml of vllm-project/production-stack);
# every other flag goes to its extraArgs.
_STACK_KEYS = {
    "enable_prefix_caching": "enablePrefixCaching",
    "enable_chunked_prefill": "enableChunkedPrefill",
    "max_model_len": "maxModelLen",
    "dtype": "dtype",
    "tensor_parallel_size": "tensorParallelSize",
    "max_num_seqs": "maxNumSeqs",
    "gpu_memory_utilization": "gpuMemoryUtilization",
}


def helm_values(config: EngineConfig, options: ExportOptions = ExportOptions()) -> str:  # noqa: B008
    """Values for the vLLM production stack's Helm chart (servingEngineSpec.modelSpec)."""
    repository, tag = split_image(options.image)
    model_args, local = _container_model(config)
    vllm_config: dict[str, Any] = {}
    extra: list[str] = []
    flags = config.params()
    # A false switch stays an explicit --no-... flag: the chart may only emit the flag when true, and
    # vLLM's default (chunked prefill on) would then win.
    named = {n for n, v in flags.items() if n in _STACK_KEYS and v is not False}
    vllm_config.update({_STACK_KEYS[n]: flags[n] for n in flags if n in named})
    extra += _args_without(config, named)
    if local is not None:
        extra += model_args[2:]  # --served-model-name
    vllm_config["extraArgs"] = extra
    gpus = gpus_per_replica(config.params())
    spec: dict[str, Any] = {
        "name": helm_model_name(config.model),
        "repository": repository,
        "tag": tag or "latest",
        "modelURL": model_args[1],
        "replicaCount": max(1, options.replicas),
        "requestCPU": 8,
        "requestMemory": "32Gi",
        "requestGPU": gpus,
        "shmSize": "16Gi",
        "vllmConfig": vllm_config,
        "hf_token": {"secretName": options.secret, "secretKey": options.secret_key},
    }
    if local is not None:
        spec["extraVolumes"] = [{"name": "model", "hostPath": {"path": str(local), "type": "Directory"}}]
        mount = {"name": "model", "mountPath": model_mount(local), "readOnly": True}
        spec["extraVolumeMounts"] = [mount]
    # the chart refers to the Secret without `optional`: an engine pod waits for it until it exists
    head = (
        "# values.yaml for the vLLM production stack (github.com/vllm-project/production-stack); HF_TOKEN\n"
        f"# comes from the Secret {options.secret!r} (key {options.secret_key!r}), which must exist:\n"
        f"{_secret_line(options)}"
        "#   helm repo add vllm https://vllm-project.github.io/production-stack\n"
        "#   helm install vllm vllm/vllm-stack -f values.yaml\n"
    )
    if options.replicas_note:
        head += f"# replicaCount {options.replicas}: {options.replicas_note}\n"
    return head + yaml.safe_dump({"servingEngineSpec": {"modelSpec": [spec]}}, sort_keys=False)


HELM_NAME_CHARS = 40  # the chart's Deployment name adds the release's and a suffix: 63 in all


def helm_model_name(model: str) -> str:
    """modelSpec.name for a model: its last path part in lowercase letters, digits and '-', cut, then
    stripped of '-' (a Kubernetes label value starts and ends alphanumeric); "model" when none is left."""
    slug = re.sub(r"[^a-z0-9-]+", "-", model.rstrip("/").split("/")[-1].lower())
    return slug[:HELM_NAME_CHARS].strip("-") or "model"


def _args_without(config: EngineConfig, names: set[str]) -> list[str]:
    """`serve_flags(config)` without the flags of `names` (each flag with its value, if it has one)."""
    dropped = {"--" + n.replace("_", "-") for n in names} | {"--no-" + n.replace("_", "-") for n in names}
    out: list[str] = []
    skip = False
    for arg in serve_flags(config):
        if skip and not arg.startswith("--"):
            continue
        skip = arg in dropped
        if not skip:
            out.append(arg)
    return out


def parse_command(text: str) -> EngineConfig:
    """A `vllm serve ...` command line back to an EngineConfig (the inverse of `render(..., "cmd")`)."""
    return EngineConfig.from_args(shlex.split(text))
