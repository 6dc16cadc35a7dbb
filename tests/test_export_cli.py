"""`autotune export` on a run folder: the recommended or chosen trial, a local model's absolute path,
the image a run was tuned with and its --tag, Helm's replicas from the run's sizing, a run still
running, and the options and trials it refuses in one line."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import time
from pathlib import Path

import optuna
import pytest
import yaml
from cli import autotune
from errors import assert_rejected
from test_export import CONFIG, docker_mounts
from test_study import build_run, ok

from autotune.cli import main
from autotune.core.config import EngineConfig
from autotune.measure.load_report import LoadReport, SteadyState
from autotune.outputs.export import parse_command
from autotune.outputs.run_info import RunInfo, load_run
from autotune.store.lease import LEASE_KEY, Driver

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
    pod = yaml.safe_load(capsys.readouterr().out)["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "vllm/vllm-openai:v0.11.0"
    # a docker run records its --image in run.json: the export deploys the image it was tuned with
    RunInfo(study="unit", storage=load_run(run_dir).storage, directory=run_dir).save(
        {"image": "my/vllm:tuned"}
    )
    assert main(["export", str(run_dir), "--format", "docker"]) == 0
    assert "my/vllm:tuned" in shlex.split(capsys.readouterr().out)
    assert main(["export", str(run_dir), "--trial", "99"]) == 2
    assert main(["export", str(tmp_path / "nope")]) == 2
    assert "run folder not found" in capsys.readouterr().err


def test_a_study_with_no_finished_trial_says_so(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "no feasible trial to recommend; pass --trial N", and no trial could be passed."""
    study = build_run(tmp_path / "run", [])
    study.ask()  # running
    line = assert_rejected(["export", "{tmp}/run"], {}, tmp_path, capfd, monkeypatch)
    assert line.endswith("has no finished trial yet: nothing to export"), line


def test_a_damaged_study_database_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """4 KiB of garbage inside study.db: `run` said "the storage failed" in one line, export printed an
    89-line traceback (optuna's StorageInternalError, from reading the trials)."""
    run_dir = tmp_path / "run"
    build_run(run_dir, [({"max_num_seqs": 1024, "baseline": True}, ok(4000, 1500, 20))])
    db = run_dir / "study.db"
    with db.open("r+b") as f:
        f.seek(db.stat().st_size // 2)
        f.write(b"\xff" * 4096)
    assert main(["export", str(run_dir), "--format", "cmd"]) == 1
    err = capsys.readouterr().err.strip()
    said = "autotune export: error: the storage failed: DatabaseError: database disk image is malformed"
    assert err == said


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
    pod = yaml.safe_load(capsys.readouterr().out)["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == deployed


def test_a_damaged_image_in_run_json_stops_only_the_formats_that_deploy_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    build_run(run_dir, [({"max_num_seqs": 256}, ok(4000, 1500, 20))])
    RunInfo(study="unit", storage=load_run(run_dir).storage, directory=run_dir).save({"image": "bad image"})
    for fmt in ("flags", "cmd", "yaml"):
        assert main(["export", str(run_dir), "--format", fmt]) == 0, capsys.readouterr().err
        assert "--max-num-seqs" in capsys.readouterr().out.replace("max-num-seqs:", "--max-num-seqs")
    for fmt in ("docker", "k8s", "helm"):
        assert main(["export", str(run_dir), "--format", fmt]) == 2
        assert "is not a Docker image reference" in capsys.readouterr().err


def test_helm_and_k8s_replicas_follow_the_runs_sizing_unless_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with --target-rate sizes its recommendation (best.json's "sizing"): Helm's replicaCount and
    the Deployment's replicas are that many replicas of the exported trial; --replicas wins; no target
    rate: 1."""
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
    assert main(["export", str(run_dir), "--format", "k8s"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text)["spec"]["replicas"] == 5 and "# replicas 5: the run's sizing" in text
    assert main(["export", str(run_dir), "--format", "k8s", "--replicas", "2"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["replicas"] == 2


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


def test_exporting_a_trial_that_fell_behind_its_load_warns_with_that_reason(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Its latencies met the SLOs, so the warning said "violates the SLOs" where trials.csv said "did not
    keep up"."""
    behind = SteadyState(40.0, 15.5, 0.6, 0.02, 0.0, kept_up=False)
    slow = dataclasses.replace(ok(5000, 900, 30), load=LoadReport(steady=behind))
    build_run(tmp_path / "run", [({"max_num_seqs": 256}, ok(5000, 900, 30)), ({"max_num_seqs": 64}, slow)])
    assert main(["export", str(tmp_path / "run"), "--trial", "1"]) == 0
    assert "warning: trial 1 is not feasible (did not keep up)" in capfd.readouterr().err
