"""Exports: each format, round trips back to the same EngineConfig, no secrets, and the CLI."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import socket
import time
from pathlib import Path

import optuna
import pytest
import yaml
from cli import autotune
from errors import assert_rejected
from test_study import build_run, ok

from autotune.cli import main
from autotune.core.config import EngineConfig
from autotune.outputs.export import HF_CACHE_VOLUME, ExportOptions, RunInfo, load_run, parse_command, render
from autotune.store.lease import LEASE_KEY, Driver

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


def test_k8s_pod_spec_has_its_volumes_and_names_the_secret() -> None:
    spec = yaml.safe_load(render(CONFIG, "k8s", options=ExportOptions(secret="my-hf", secret_key="tok")))
    (container,) = spec["containers"]
    assert container["image"] == "vllm/vllm-openai:v0.11.0"  # a pinned release, never latest
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": "my-hf",
        "key": "tok",
        "optional": True,
    }
    # every mount has its volume in the same pod spec (a valid Deployment spec.template.spec)
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
    spec = yaml.safe_load(render(config, "k8s"))
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


LOCAL_MODEL = {
    "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 131072,
}  # fmt: skip
TINY = "name: tiny\nnum_requests: 40\nload: fixed\nrequest_rate: 10\nprompt_len: {dist: fixed, mean: 64}\n"


def test_a_run_on_a_relative_local_model_folder_exports_its_absolute_path(tmp_path: Path) -> None:
    """`--model localmodel` names the folder only from where the run started: run.json, best.sh and
    every export name it by its absolute path, so they serve (and mount) it from anywhere."""
    (tmp_path / "localmodel").mkdir()
    (tmp_path / "localmodel" / "config.json").write_text(json.dumps(LOCAL_MODEL))
    (tmp_path / "tiny.yaml").write_text(TINY + "output_len: {dist: fixed, mean: 16}\n")
    args = ["--space", "small", "--model", "localmodel", "--workload", "tiny.yaml", "--n-trials", "2"]
    autotune(tmp_path, "run", *args, "--quiet", "--study", "loc", "--slo", "ttft_p99=2s")
    model = str(tmp_path / "localmodel")
    assert json.loads((tmp_path / "runs/loc/run.json").read_text())["model"] == model
    assert f"exec vllm serve {model} " in (tmp_path / "runs/loc/best.sh").read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for fmt in ("cmd", "flags", "yaml"):
        text = autotune(elsewhere, "export", "../runs/loc", "--format", fmt).stdout
        assert "localmodel" not in text.replace(model, "")
    docker = shlex.split(
        autotune(elsewhere, "export", "../runs/loc", "--format", "docker").stdout, comments=True
    )
    assert docker_mounts(docker) == [{"type": "bind", "source": model, "target": "/models/localmodel"}]
    assert docker[docker.index("--model") + 1] == "/models/localmodel"


def test_helm_values_follow_the_production_stack_schema() -> None:
    options = ExportOptions(image="registry.local:5000/vllm/vllm-openai:v0.11.0", replicas=3)
    (spec,) = yaml.safe_load(render(CONFIG, "helm", options=options))["servingEngineSpec"]["modelSpec"]
    assert (spec["repository"], spec["tag"]) == ("registry.local:5000/vllm/vllm-openai", "v0.11.0")
    assert spec["modelURL"] == CONFIG.model and spec["replicaCount"] == 3 and spec["requestGPU"] == 2
    assert spec["hf_token"] == {"secretName": "hf-token", "secretKey": "token"}
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


def test_export_cli_recommended_and_chosen_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    build_run(
        run_dir,
        [
            ({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20)),
            ({"max_num_seqs": 256, "max_num_batched_tokens": 2048}, ok(4800, 1700, 25)),
            ({"max_num_seqs": 512}, ok(9000, 2600, 25)),  # infeasible
        ],
    )
    assert main(["export", str(run_dir), "--format", "cmd"]) == 0
    out = capsys.readouterr().out
    assert parse_command(out) == EngineConfig(
        model=CONFIG.model, max_num_seqs=256, max_num_batched_tokens=2048
    )
    assert main(["export", str(run_dir), "--trial", "2", "--format", "flags"]) == 0
    captured = capsys.readouterr()
    assert (
        captured.out.strip() == "--tensor-parallel-size 1 --max-num-seqs 512 --enable-chunked-prefill "
        "--block-size 16 --gpu-memory-utilization 0.9 --enable-prefix-caching --kv-cache-dtype auto"
    )
    assert "not feasible" in captured.err
    assert main(["export", str(run_dir), "--format", "k8s", "--image", "vllm/vllm-openai:v0.11.0"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["containers"][0]["image"] == "vllm/vllm-openai:v0.11.0"
    # a docker run records its --image in run.json: the export deploys the image it was tuned with
    RunInfo(study="unit", storage=load_run(run_dir).storage, directory=run_dir).save(
        {"image": "my/vllm:tuned"}
    )
    assert main(["export", str(run_dir), "--format", "docker"]) == 0
    assert "my/vllm:tuned" in shlex.split(capsys.readouterr().out)
    assert main(["export", str(run_dir), "--trial", "99"]) == 2
    assert main(["export", str(tmp_path / "nope")]) == 2
    assert "run folder not found" in capsys.readouterr().err


def test_a_pipeline_parallel_replica_asks_for_all_its_gpus() -> None:
    """TP 2 x PP 2 takes four GPUs (the trials' GPU time counts four too): docker, k8s and helm ask for 4."""
    config = CONFIG.replace(pipeline_parallel_size=2)
    assert shlex.split(render(config, "docker"))[:4] == ["docker", "run", "--gpus", "4"]
    pod = yaml.safe_load(render(config, "k8s"))
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    helm = yaml.safe_load(render(config, "helm"))
    assert helm["servingEngineSpec"]["modelSpec"][0]["requestGPU"] == 4


@pytest.mark.parametrize(
    ("fmt", "option"),
    [("helm", "--tag"), ("docker", "--image"), ("k8s", "--secret"), ("helm", "--secret-key")],
)
def test_an_empty_container_option_is_refused_not_defaulted(
    fmt: str,
    option: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build_run(tmp_path / "run", [({"max_num_seqs": 256}, ok(4000, 1500, 20))])
    line = assert_rejected(
        ["export", "{tmp}/run", "--format", fmt, option, ""], {}, tmp_path, capfd, monkeypatch
    )
    assert f"argument {option}:" in line


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
    pod = yaml.safe_load(render(config, "k8s"))["containers"][0]["args"]
    (spec,) = yaml.safe_load(render(config, "helm"))["servingEngineSpec"]["modelSpec"]
    for args in (docker, pod, spec["vllmConfig"]["extraArgs"]):
        assert _served_names(args) == ["prod-llama"]


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
    pod = yaml.safe_load(render(config, "k8s"))
    assert {"name": "model", "mountPath": target, "readOnly": True} in pod["containers"][0]["volumeMounts"]
    (spec,) = yaml.safe_load(render(config, "helm"))["servingEngineSpec"]["modelSpec"]
    assert spec["modelURL"] == target and spec["extraVolumeMounts"][0]["mountPath"] == target
    assert spec["extraVolumes"][0]["hostPath"]["path"] == str(model_dir)


def test_tag_with_image_is_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--image names its own tag: a --tag beside it was dropped unseen."""
    build_run(tmp_path / "run", [({"max_num_seqs": 256}, ok(4000, 1500, 20))])
    argv = ["export", "{tmp}/run", "--format", "docker", "--image", "my/vllm:1", "--tag", "v2"]
    line = assert_rejected(argv, {}, tmp_path, capfd, monkeypatch)
    assert "--tag v2 with --image my/vllm:1" in line


@pytest.mark.parametrize(
    ("recorded", "deployed"),
    [
        (None, "vllm/vllm-openai:v9"),
        ("my/vllm:tuned", "my/vllm:v9"),
        ("registry.local:5000/my/vllm", "registry.local:5000/my/vllm:v9"),
        ("my/vllm:tuned@sha256:" + "a" * 64, "my/vllm:v9"),  # the digest pinned the old tag's content
    ],
)
def test_tag_retags_the_image_the_run_was_tuned_with(
    recorded: str | None, deployed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    build_run(run_dir, [({"max_num_seqs": 256}, ok(4000, 1500, 20))])
    RunInfo(study="unit", storage=load_run(run_dir).storage, directory=run_dir).save(
        {"image": recorded} if recorded else {}
    )
    assert main(["export", str(run_dir), "--format", "k8s", "--tag", "v9"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["containers"][0]["image"] == deployed


def test_helm_replicas_follow_the_runs_sizing_unless_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with --target-rate sizes its recommendation (best.json's "sizing"): Helm's replicaCount is
    that many replicas of the exported trial (it was 1); --replicas wins; no target rate: 1."""
    run_dir = tmp_path / "run"
    build_run(run_dir, [({"max_num_seqs": 256}, ok(4000, 1500, 20))])  # 10 req/s a replica

    def replica_count(*extra: str) -> tuple[int, str]:
        assert main(["export", str(run_dir), "--format", "helm", *extra]) == 0
        text = capsys.readouterr().out
        return yaml.safe_load(text)["servingEngineSpec"]["modelSpec"][0]["replicaCount"], text

    assert replica_count()[0] == 1
    (run_dir / "best.json").write_text(
        json.dumps({"trial": 0, "sizing": {"target_rate": 45.0, "replicas": 5}})
    )
    count, text = replica_count()
    assert count == 5 and "# replicaCount 5: the run's sizing for 45 req/s" in text
    assert replica_count("--replicas", "2")[0] == 2
    assert main(["export", str(run_dir), "--format", "k8s"]) == 0  # a pod spec has no replica count
    assert "replica" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("trial", "why"),
    [(1, "trial 1 did not start (kv_cache_oom): vLLM would not serve it"), (2, "trial 2 did not finish")],
)
def test_a_trial_that_did_not_start_or_finish_is_refused(
    trial: int, why: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to deploy: vLLM refused the config, or the trial was interrupted before its verdict (they
    were exported with a warning, exit 0). One that ran and missed an SLO still exports, with one."""
    study = build_run(
        tmp_path / "run",
        [({"max_num_seqs": 256}, ok(5000, 2500, 30)), ({"max_num_seqs": 1024}, None)],  # slow; no KV room
    )
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # interrupted
    line = assert_rejected(["export", "{tmp}/run", "--trial", str(trial)], {}, tmp_path, capfd, monkeypatch)
    assert why in line
    assert main(["export", str(tmp_path / "run"), "--trial", "0"]) == 0
    assert "warning: trial 0 is not feasible" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--image", "my registry/img"], "argument --image: value 'my registry/img' is not a Docker image"),
        (["--image", "Vllm/OpenAI"], "is not a Docker image reference"),  # a repository is lowercase
        (["--image", "vllm:bad:tag"], "is not a Docker image reference"),
        (["--image", "vllm@sha256:xyz"], "is not a Docker image reference"),
        (["--replicas", "10001"], "argument --replicas: value must be <= 10,000"),
        (["--replicas", "99999999999999999999"], "argument --replicas: value must be <= 10,000"),
        (["--replicas", "0"], "argument --replicas: value must be >= 1"),
    ],
)
def test_an_image_or_replica_count_a_cluster_would_refuse_is_refused(
    argv: list[str],
    said: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build_run(tmp_path / "run", [({"max_num_seqs": 256}, ok(4000, 1500, 20))])
    line = assert_rejected(
        ["export", "{tmp}/run", "--format", "helm", *argv], {}, tmp_path, capfd, monkeypatch
    )
    assert said in line


def test_an_empty_run_path_is_named_as_such(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = assert_rejected(["export", ""], {}, tmp_path, capfd, monkeypatch)
    assert line == "autotune export: error: an empty run path: pass a run folder, e.g. runs/<study>"


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


def test_a_run_still_running_exports_its_best_so_far_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study whose driver holds its lease (alive: this process) is still running: the export says its
    pick may change, on stderr, exit 0; released, no note."""
    study = build_run(tmp_path / "run", [({"max_num_seqs": 256}, ok(4000, 1500, 20))])
    driver = Driver(id="d1", pid=os.getpid(), host=socket.gethostname(), renewed=time.time())
    study._storage.set_study_system_attr(study._study_id, LEASE_KEY, dict(driver.__dict__))
    assert main(["export", str(tmp_path / "run"), "--format", "docker"]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"autotune export: note: {tmp_path / 'run'} is still running (pid {os.getpid()} on "
        f"{socket.gethostname()}): this is its best config so far, which may change\n"
    )
    study._storage.set_study_system_attr(study._study_id, LEASE_KEY, dict(driver.__dict__, renewed=0.0))
    assert main(["export", str(tmp_path / "run"), "--format", "docker"]) == 0
    assert capsys.readouterr().err == ""
