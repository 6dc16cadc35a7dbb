"""Secrets the hostile try found shown or written: storage passwords with '/' or '@' or given as a
query parameter, a password in run.json, a `bench --url` password, and YAML injected through
`export --secret`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from errors import assert_rejected

from autotune.cli import main
from autotune.core.secrets import masked
from autotune.sim_server.server import start_sim_server
from autotune.store.urls import for_run_file

SECRET = "hunter2pass"  # assert_rejected checks it is never shown
TINY = "num_requests: 8\nload: fixed\nprompt_len: 64\noutput_len: 8\n"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{SECRET}/x@127.0.0.1:1/db",  # SQLAlchemy takes '/' in a password
        f"postgresql://u:pre@{SECRET}@127.0.0.1:1/db",  # an '@' SQLAlchemy splits it at: the rest is "host"
        f"postgresql://u@127.0.0.1:1/db?password={SECRET}",  # libpq's connection parameter
        f"postgresql://u@127.0.0.1:1/db?sslmode=disable&password={SECRET}",
    ],
    ids=["slash", "at", "query", "query-second"],
)
def test_a_storage_password_is_never_shown(
    url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = assert_rejected(["run", "--storage", url], {}, tmp_path, capfd, monkeypatch)
    assert "storage" in line


@pytest.mark.parametrize(
    ("url", "recorded"),
    [
        (f"postgresql://u:{SECRET}/x@db.example:5432/s", "postgresql://u@db.example:5432/s"),
        (
            f"postgresql://u@db.example/s?password={SECRET}&sslmode=require",
            "postgresql://u@db.example/s?sslmode=require",
        ),
        (f"sqlite:////elsewhere/x.db?password={SECRET}", "sqlite:////elsewhere/x.db"),
    ],
)
def test_run_json_keeps_no_storage_password(url: str, recorded: str, tmp_path: Path) -> None:
    assert for_run_file(url, tmp_path) == recorded  # what RunInfo.save writes as run.json's storage
    assert SECRET not in masked(f"cannot open {url}: refused")


def test_bench_url_never_shows_its_password(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY)
    with start_sim_server(["Qwen/Qwen3-0.6B"]) as server:
        url = server.base_url.replace("http://", f"http://user:{SECRET}@")
        for output in ([], ["--json"]):
            assert main(["bench", "--url", url, "--workload", str(workload), *output]) == 0
            out, err = capfd.readouterr()
            assert "user:***@" in out and SECRET not in out + err


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> Path:
    """A real run's folder (1 simulated trial)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    argv = [
        "run",
        "--space",
        "small",
        "--workload",
        "tiny.yaml",
        "--study",
        "k",
        "--n-trials",
        "1",
        "--quiet",
    ]
    assert main(argv) == 0
    capfd.readouterr()
    return tmp_path / "runs" / "k"


@pytest.mark.parametrize(
    "option",
    [
        ["--secret", "x\nmalicious: true"],
        ["--secret-key", "token\nmalicious: true"],
        ["--secret", "Bad_Name"],
        ["--secret-key", ".."],
        ["--secret-key", "..token"],
        ["--secret-key", "."],
    ],
    ids=["secret-newline", "key-newline", "secret-not-a-name", "key-dotdot", "key-dotdot-prefix", "key-dot"],
)
def test_export_refuses_a_secret_name_that_is_not_one(
    option: list[str], run_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    for fmt in ("k8s", "helm"):
        try:
            code = main(["export", str(run_dir), "--format", fmt, *option])
        except SystemExit as exc:
            code = exc.code
        out, err = capfd.readouterr()
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, out + err


def test_export_names_a_valid_secret_without_adding_keys(
    run_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["export", str(run_dir), "--format", "k8s", "--secret", "hf.token-1", "--secret-key", "tok_en"])
        == 0
    )
    spec = yaml.safe_load(capfd.readouterr().out)["spec"]["template"]["spec"]
    assert set(spec) == {"containers", "volumes"}
    ref = spec["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "hf.token-1", "key": "tok_en", "optional": True}
    assert json.loads((run_dir / "run.json").read_text())["storage"] == "sqlite:///study.db"
