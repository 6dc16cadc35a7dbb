"""`autotune bench`: the full config it measured, the same max_model_len as run, JSON errors, --url."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.sim_server.server import start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SMALL = """name: small
num_requests: 12
load: fixed
request_rate: 20
prompt_len: {dist: fixed, mean: 64}
output_len: {dist: fixed, mean: 8}
"""


@pytest.fixture
def workload(tmp_path: Path) -> str:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return str(path)


def test_bench_prints_the_resolved_config_with_runs_max_model_len(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--workload", workload, "--set", "max_num_seqs=128", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    config = report["config"]
    # the default space's fixed max_model_len (8192, as `run` uses), not the model's 131072
    assert config["max_model_len"] == 8192 and config["max_num_seqs"] == 128
    assert config["max_num_batched_tokens"] == 8192  # vLLM's H100 default, resolved and shown
    assert report["completed"] == 12


def test_a_failed_config_with_json_prints_a_json_error(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--workload", workload, "--set", "gpu_memory_utilization=0.2", "--json"]) == 1
    captured = capsys.readouterr()
    error = json.loads(captured.out)
    assert error["error"] == "kv_cache_oom" and "No available memory" in error["message"]
    assert error["config"]["gpu_memory_utilization"] == 0.2
    assert "kv_cache_oom" in captured.err


def test_bench_url_measures_a_running_server_without_launching(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_sim_server([MODEL, "--max-model-len", "4096"]) as server:
        assert main(["bench", "--url", server.base_url, "--workload", workload, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["server"] == server.base_url and report["model_id"] == MODEL  # from /v1/models
        assert report["completed"] == 12 and report["total_output_tokens"] == 12 * 8
        assert report["num_gpu_blocks"] > 0  # read from the server's /metrics
        assert server.process.poll() is None  # still running: bench did not own it
    assert main(["bench", "--url", "http://127.0.0.1:9", "--workload", workload]) == 2
