"""A tuned config in the forms users paste: flags, a `vllm serve` command, `docker run`, a vLLM YAML
config file (`vllm serve --config`), and a Kubernetes container snippet.

Secrets are referenced, never written: HF_TOKEN goes by name (`--env HF_TOKEN`, a secretKeyRef).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.config import EngineConfig
from autotune.errors import AutotuneError

FORMATS = ("flags", "cmd", "docker", "yaml", "k8s")
IMAGE = "vllm/vllm-openai"
PORT = 8000
# The host's Hugging Face cache, left to the user's shell to expand (so it is double-quoted, not single).
HF_CACHE_VOLUME = "$HOME/.cache/huggingface:/root/.cache/huggingface"
RUN_FILE = "run.json"


@dataclass(frozen=True)
class RunInfo:
    """What runs/<study>/run.json records so export, report and dashboard find the study."""

    study: str
    storage: str
    directory: Path

    def save(self, extra: dict[str, Any] | None = None) -> None:
        """Write run.json (the storage URL is a path or URL, never a secret-bearing value we add)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = {"study": self.study, "storage": self.storage, **(extra or {})}
        (self.directory / RUN_FILE).write_text(json.dumps(data, indent=2) + "\n")


def load_run(directory: str | Path) -> RunInfo:
    """Read runs/<study>/run.json; AutotuneError when the folder is not a run."""
    path = Path(directory)
    meta = path / RUN_FILE
    if not meta.is_file():
        if not path.exists():
            raise AutotuneError(f"run folder not found: {directory}")
        raise AutotuneError(f"{directory} is not an autotune run (no {RUN_FILE}); pass runs/<study>")
    try:
        data = json.loads(meta.read_text())
        return RunInfo(study=data["study"], storage=data["storage"], directory=path)
    except (ValueError, KeyError) as exc:
        raise AutotuneError(f"{meta}: unreadable run file") from exc


def serve_flags(config: EngineConfig) -> list[str]:
    """The `vllm serve` flags of a config, without the model."""
    return config.to_args()[1:]


def render(config: EngineConfig, fmt: str, image_tag: str = "latest") -> str:
    """The config in one of FORMATS, as text ending with a newline."""
    if fmt == "flags":
        return shlex.join(serve_flags(config)) + "\n"
    if fmt == "cmd":
        return shlex.join(["vllm", "serve", *config.to_args()]) + "\n"
    if fmt == "docker":
        args = docker_command(config, image_tag)
        return " ".join(f'"{a}"' if a == HF_CACHE_VOLUME else shlex.quote(a) for a in args) + "\n"
    if fmt == "yaml":
        return vllm_yaml(config)
    if fmt == "k8s":
        return k8s_container(config, image_tag)
    raise AutotuneError(f"unknown export format {fmt!r} (use {', '.join(FORMATS)})")


def docker_command(config: EngineConfig, image_tag: str = "latest") -> list[str]:
    """`docker run` of vLLM's OpenAI image with this config (HF_TOKEN passed through by name)."""
    gpus = max(1, config.tensor_parallel_size)
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
        "--env",
        "HF_TOKEN",
        f"{IMAGE}:{image_tag}",
        "--model",
        config.model,
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


def k8s_container(config: EngineConfig, image_tag: str = "latest") -> str:
    """A Kubernetes container spec (under a Deployment's `containers:`) running this config."""
    container = {
        "name": "vllm",
        "image": f"{IMAGE}:{image_tag}",
        "args": ["--model", config.model, *serve_flags(config)],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}],
        "ports": [{"containerPort": PORT, "name": "http"}],
        "resources": {"limits": {"nvidia.com/gpu": max(1, config.tensor_parallel_size)}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    note = "# volumes: [{name: dshm, emptyDir: {medium: Memory}}]  (shared memory for vLLM workers)\n"
    return "containers:\n" + _indent(yaml.safe_dump([container], sort_keys=False)) + note


def parse_command(text: str) -> EngineConfig:
    """A `vllm serve ...` command line back to an EngineConfig (the inverse of `render(..., "cmd")`)."""
    return EngineConfig.from_args(shlex.split(text))


def _indent(text: str) -> str:
    return "".join("  " + line if line.strip() else line for line in text.splitlines(keepends=True))
