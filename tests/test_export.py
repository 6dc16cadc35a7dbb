"""Exports: each format (flags, command, docker, vLLM YAML, Kubernetes, Helm) rendered from an
EngineConfig, round trips back to the same config, mounts of a local model, no secrets. `autotune export`
on a run folder: tests/test_export_cli.py."""

from __future__ import annotations

import csv
import re
import shlex
from pathlib import Path

import pytest
import yaml

from autotune.core.config import EngineConfig
from autotune.outputs.export import HF_CACHE_VOLUME, ExportOptions, parse_command, render

CONFIG = EngineConfig(
    model="meta-llama/Llama-3.1-8B-Instruct",
    tensor_parallel_size=2,
    max_num_seqs=384,
    max_num_batched_tokens=4096,
    enable_chunked_prefill=False,
    block_size=32,
    gpu_memory_utilization=0.93,
    enable_prefix_caching=True,
    max_model_len=8192,
).replace(dtype="bfloat16")


def test_cmd_and_flags_parse_back_to_the_same_config() -> None:
    cmd = render(CONFIG, "cmd")
    assert cmd.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct ")
    assert "--no-enable-chunked-prefill" in cmd and "--dtype bfloat16" in cmd
    assert parse_command(cmd) == CONFIG
    flags = render(CONFIG, "flags")
    assert parse_command(f"vllm serve {CONFIG.model} {flags}") == CONFIG


def test_docker_passes_hf_token_and_api_key_by_name_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    monkeypatch.setenv("VLLM_API_KEY", "hf_secret_key_456")
    args = shlex.split(render(CONFIG, "docker", image_tag="v0.11.0"))
    assert args[:4] == ["docker", "run", "--gpus", "2"] and "--ipc=host" in args
    assert args[args.index("-p") + 1] == "8000:8000"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--env"] == ["HF_TOKEN", "VLLM_API_KEY"]
    image = args.index("vllm/vllm-openai:v0.11.0")
    assert EngineConfig.from_args(args[image + 1 :]) == CONFIG  # the image's args are vllm serve's
    assert all("hf_secret" not in render(CONFIG, fmt) for fmt in ("cmd", "docker", "yaml", "k8s", "helm"))


def test_vllm_yaml_config_file() -> None:
    data = yaml.safe_load(render(CONFIG, "yaml"))
    assert data["model"] == CONFIG.model and data["max-num-seqs"] == 384
    assert data["no-enable-chunked-prefill"] is True and data["enable-prefix-caching"] is True
    # vLLM turns `key: true` into --key and `key: value` into --key value
    args = [CONFIG.model]
    for key, value in data.items():
        if key != "model":
            args += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    assert EngineConfig.from_args(args) == CONFIG


def pod_spec(text: str) -> dict:
    """The pod template's spec of a k8s export, checked to be a whole Deployment `kubectl apply` takes:
    its selector matches the template's labels."""
    deployment = yaml.safe_load(text)
    assert deployment["apiVersion"] == "apps/v1" and deployment["kind"] == "Deployment"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", deployment["metadata"]["name"])
    spec = deployment["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    return spec["template"]["spec"]


def test_k8s_deployment_has_its_volumes_and_names_the_secret() -> None:
    text = render(CONFIG, "k8s", options=ExportOptions(secret="my-hf", secret_key="tok"))
    spec = pod_spec(text)
    assert "kubectl create secret generic my-hf --from-literal=tok=$HF_TOKEN" in text
    assert yaml.safe_load(text)["spec"]["replicas"] == 1
    (container,) = spec["containers"]
    assert container["image"] == "vllm/vllm-openai:v0.11.0"  # a pinned release, never latest
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": "my-hf",
        "key": "tok",
        "optional": True,
    }
    # every mount has its volume in the same pod spec
    volumes = {v["name"] for v in spec["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} <= volumes and "dshm" in volumes
    args = container["args"]
    assert args[:2] == ["--model", CONFIG.model]
    assert EngineConfig.from_args(args) == CONFIG


def test_a_local_model_dir_is_mounted_in_docker_and_k8s(tmp_path: Path) -> None:
    model_dir = tmp_path / "my-llama"
    model_dir.mkdir()
    config = CONFIG.replace(model=str(model_dir))
    args = shlex.split(render(config, "docker"))
    assert docker_mounts(args) == [{"type": "bind", "source": str(model_dir), "target": "/models/my-llama"}]
    assert args[args.index("--model") + 1] == "/models/my-llama"
    assert args[args.index("--served-model-name") + 1] == str(model_dir)  # clients keep the tuned name
    spec = pod_spec(render(config, "k8s"))
    (volume,) = [v for v in spec["volumes"] if v["name"] == "model"]
    assert volume["hostPath"]["path"] == str(model_dir)
    mounts = spec["containers"][0]["volumeMounts"]
    assert {"name": "model", "mountPath": "/models/my-llama", "readOnly": True} in mounts


def docker_mounts(args: list[str]) -> list[dict[str, str]]:
    """Each read-only `--mount` of a `docker run` as docker's CLI reads it (one CSV record of key=value
    fields); an `-v` other than the Hugging Face cache's fails: it cannot take every path."""
    assert [args[i + 1] for i, a in enumerate(args) if a == "-v"] == [HF_CACHE_VOLUME]
    mounts = []
    for value in (args[i + 1] for i, a in enumerate(args) if a == "--mount"):
        (fields,) = csv.reader([value])
        assert "readonly" in fields
        mounts.append(dict(f.split("=", 1) for f in fields if f != "readonly"))
    return mounts


def test_helm_values_follow_the_production_stack_schema() -> None:
    options = ExportOptions(image="registry.local:5000/vllm/vllm-openai:v0.11.0", replicas=3)
    (spec,) = yaml.safe_load(render(CONFIG, "helm", options=options))["servingEngineSpec"]["modelSpec"]
    assert (spec["repository"], spec["tag"]) == ("registry.local:5000/vllm/vllm-openai", "v0.11.0")
    assert spec["modelURL"] == CONFIG.model and spec["replicaCount"] == 3 and spec["requestGPU"] == 2
    assert spec["hf_token"] == {"secretName": "hf-token", "secretKey": "token"}
    # the chart's secretKeyRef is not optional: the header says how to create the Secret it waits for
    assert "kubectl create secret generic hf-token --from-literal=token=$HF_TOKEN" in render(CONFIG, "helm")
    vllm = spec["vllmConfig"]
    assert vllm["maxNumSeqs"] == 384 and vllm["tensorParallelSize"] == 2 and vllm["enablePrefixCaching"]
    # the flags the chart does not name (and an off switch) go verbatim to extraArgs: the same config
    named = {"maxNumSeqs": "--max-num-seqs", "tensorParallelSize": "--tensor-parallel-size"}
    named |= {"gpuMemoryUtilization": "--gpu-memory-utilization", "maxModelLen": "--max-model-len"}
    named |= {"dtype": "--dtype"}
    args = [CONFIG.model, *vllm["extraArgs"], "--enable-prefix-caching"]
    for key, flag in named.items():
        args += [flag, str(vllm[key])]
    assert "--no-enable-chunked-prefill" in vllm["extraArgs"]
    assert EngineConfig.from_args(args) == CONFIG


def test_a_pipeline_parallel_replica_asks_for_all_its_gpus() -> None:
    """TP 2 x PP 2 takes four GPUs (the trials' GPU time counts four too): docker, k8s and helm ask for 4."""
    config = CONFIG.replace(pipeline_parallel_size=2)
    assert shlex.split(render(config, "docker"))[:4] == ["docker", "run", "--gpus", "4"]
    pod = pod_spec(render(config, "k8s"))
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    helm = yaml.safe_load(render(config, "helm"))
    assert helm["servingEngineSpec"]["modelSpec"][0]["requestGPU"] == 4


def _served_names(args: list[str]) -> list[str]:
    """Each --served-model-name value in a container's args (vLLM keeps the last one given)."""
    return [args[i + 1] for i, a in enumerate(args) if a == "--served-model-name"]


def test_a_served_model_name_of_the_space_is_the_one_every_format_serves(tmp_path: Path) -> None:
    """A local model with `served_model_name` fixed by the space: one --served-model-name, the user's,
    in docker, k8s and helm alike (vLLM keeps the last of several: helm served the path instead)."""
    model_dir = tmp_path / "my-llama"
    model_dir.mkdir()
    config = CONFIG.replace(model=str(model_dir), served_model_name="prod-llama")
    docker = shlex.split(render(config, "docker"))
    pod = pod_spec(render(config, "k8s"))["containers"][0]["args"]
    (spec,) = yaml.safe_load(render(config, "helm"))["servingEngineSpec"]["modelSpec"]
    for args in (docker, pod, spec["vllmConfig"]["extraArgs"]):
        assert _served_names(args) == ["prod-llama"]


def test_a_list_valued_flag_is_separate_arguments_in_every_format() -> None:
    """vLLM takes `--served-model-name a b` and `--cuda-graph-sizes 1 2 4` (nargs="+"): a list was
    written as Python's "['a', 'b']", one model named that, and clients asking for `a` got a 404."""
    config = CONFIG.replace(served_model_name=["llama", "llama-alias"], cuda_graph_sizes=[1, 2, 4])
    cmd = shlex.split(render(config, "cmd"))
    at = cmd.index("--served-model-name")
    assert cmd[at : at + 3] == ["--served-model-name", "llama", "llama-alias"]
    at = cmd.index("--cuda-graph-sizes")
    assert cmd[at : at + 4] == ["--cuda-graph-sizes", "1", "2", "4"]
    assert parse_command(render(config, "cmd")) == config  # and back
    assert config.api_name == "llama"  # what clients ask for: vLLM's first served name
    container = pod_spec(render(config, "k8s"))["containers"][0]["args"]
    (spec,) = yaml.safe_load(render(config, "helm"))["servingEngineSpec"]["modelSpec"]
    for args in (shlex.split(render(config, "docker")), container, spec["vllmConfig"]["extraArgs"]):
        assert "['llama', 'llama-alias']" not in args and "llama-alias" in args


@pytest.mark.parametrize(
    "model",
    ["org/My-Finetuned-Llama-3.1-8B-Instruct-Chat-v2-final", "org/" + "a" * 39 + "--b", "org/---", "org/x_"],
)
def test_the_helm_model_name_is_a_kubernetes_label_value(model: str) -> None:
    """The chart names its Deployment and labels after modelSpec.name: at most 63 characters, alphanumeric
    at both ends (a name cut to 40 right after a '-' failed `helm install`)."""
    (spec,) = yaml.safe_load(render(CONFIG.replace(model=model), "helm"))["servingEngineSpec"]["modelSpec"]
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", spec["name"]) and len(spec["name"]) <= 40


def test_a_local_model_path_with_colons_and_commas_mounts_everywhere(tmp_path: Path) -> None:
    """`-v HOST:DST:ro` cannot take a host path with ':' and a k8s mountPath refuses one: docker gets a
    --mount (its CSV quoted where the path has ','), and the container side a name without them."""
    model_dir = tmp_path / "my models" / 'llama:v2,"q"'
    model_dir.mkdir(parents=True)
    config = CONFIG.replace(model=str(model_dir))
    docker = shlex.split(render(config, "docker"))
    target = "/models/llama-v2-q-"
    assert docker_mounts(docker) == [{"type": "bind", "source": str(model_dir), "target": target}]
    assert docker[docker.index("--model") + 1] == target
    pod = pod_spec(render(config, "k8s"))
    assert {"name": "model", "mountPath": target, "readOnly": True} in pod["containers"][0]["volumeMounts"]
    (spec,) = yaml.safe_load(render(config, "helm"))["servingEngineSpec"]["modelSpec"]
    assert spec["modelURL"] == target and spec["extraVolumeMounts"][0]["mountPath"] == target
    assert spec["extraVolumes"][0]["hostPath"]["path"] == str(model_dir)


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("image", "repository", "tag"),
    [
        ("vllm/vllm-openai", "vllm/vllm-openai", "latest"),
        ("localhost:5000/vllm_x/a-b:v1.2", "localhost:5000/vllm_x/a-b", "v1.2"),
        (f"myreg.io/vllm@{DIGEST}", "myreg.io/vllm", f"latest@{DIGEST}"),  # was ("myreg.io/vllm@sha256", hex)
        (f"vllm/vllm-openai:v1@{DIGEST}", "vllm/vllm-openai", f"v1@{DIGEST}"),
    ],
)
def test_helm_splits_an_image_reference_into_repository_and_tag(
    image: str, repository: str, tag: str
) -> None:
    """The chart writes `repository:tag`: a digest rides on the tag, so the image is the one given."""
    (spec,) = yaml.safe_load(render(CONFIG, "helm", options=ExportOptions(image=image)))["servingEngineSpec"][
        "modelSpec"
    ]
    assert (spec["repository"], spec["tag"]) == (repository, tag)
