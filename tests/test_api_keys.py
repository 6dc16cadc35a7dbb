"""API keys as vLLM takes them: real `autotune sim-server` processes with `--api-key` or VLLM_API_KEY,
measured by `autotune bench --url` / `autotune calibrate --url` run as processes, and trials of the
`vllm` backend launching sim-servers.

The server must refuse /v1 requests without one of its keys (401, vLLM's body) and leave /health and
/metrics open; the clients must send VLLM_API_KEY's or OPENAI_API_KEY's key; a refusal must be one clear
line that says what to set; and no key may appear in a log, a result or anything printed.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from cli import autotune

from autotune.backends.process import ProcessBackend
from autotune.core.api_keys import server_api_key
from autotune.core.config import EngineConfig
from autotune.sim_server.process import start_sim_server
from autotune.workloads.spec import LengthDist, WorkloadSpec

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KEY = "sk-autotune-test-5f2c9a71"
OTHER_KEY = "sk-rotated-key-0b81e4"
NEEDS_A_KEY = "it needs an API key: set VLLM_API_KEY or OPENAI_API_KEY"
WORKLOAD_FILE = """name: tiny
num_requests: 6
load: fixed
request_rate: inf
prompt_len: {dist: fixed, mean: 32}
output_len: {dist: fixed, mean: 8}
"""
WORKLOAD = WorkloadSpec(
    name="tiny",
    num_requests=6,
    request_rate=math.inf,
    prompt_len=LengthDist("fixed", 32),
    output_len=LengthDist("fixed", 8),
)
SIM_SERVER = (sys.executable, "-m", "autotune.cli", "sim-server")


def environment(**keys: str) -> dict[str, str]:
    """This process's environment (without API keys: see tests/conftest.py), plus `keys`."""
    return {**os.environ, **keys}


def completion(base_url: str, headers: Mapping[str, str]) -> httpx.Response:
    """One short plain completion request."""
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
    return httpx.post(base_url + "/v1/completions", json=body, headers=dict(headers), timeout=10)


def test_the_server_requires_one_of_its_keys_on_v1_routes_only() -> None:
    with start_sim_server(
        [MODEL, "--max-model-len", "4096", "--api-key", KEY, OTHER_KEY], env=environment()
    ) as server:
        url = server.base_url
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": f"Basic {KEY}"}):
            refused = completion(url, headers)
            assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
        assert completion(url, {"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert (
            completion(url, {"Authorization": f"bearer {OTHER_KEY}"}).status_code == 200
        )  # any key; any case
        # checked before routing, as vLLM's middleware does: an unknown /v1 path is refused, not 404
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/v1/nothing").status_code == 401
        for open_path in ("/health", "/metrics", "/version"):
            assert httpx.get(url + open_path).status_code == 200, open_path
        log = server.log()
    assert "api_key='***'" in log  # the startup line says keys are required
    assert KEY not in log and OTHER_KEY not in log


def test_vllm_api_key_in_the_environment_and_the_flag_taking_precedence() -> None:
    with start_sim_server([MODEL, "--max-model-len", "4096"], env=environment(VLLM_API_KEY=KEY)) as server:
        assert completion(server.base_url, {}).status_code == 401
        assert completion(server.base_url, {"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert KEY not in server.log()
    flag_and_env = environment(VLLM_API_KEY=KEY)
    with start_sim_server([MODEL, "--api-key", OTHER_KEY], env=flag_and_env) as server:
        assert completion(server.base_url, {"Authorization": f"Bearer {KEY}"}).status_code == 401
        assert completion(server.base_url, {"Authorization": f"Bearer {OTHER_KEY}"}).status_code == 200


def test_bench_url_sends_the_key_and_a_refusal_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(WORKLOAD_FILE)
    bench = ["bench", "--url", "URL", "--workload", "tiny.yaml", "--json"]
    with start_sim_server([MODEL, "--max-model-len", "4096"], env=environment(VLLM_API_KEY=KEY)) as server:
        bench[2] = server.base_url
        measured = autotune(tmp_path, *bench, check=False, timeout=120, env=environment(OPENAI_API_KEY=KEY))
        without = autotune(tmp_path, *bench, check=False, timeout=120, env=environment())
        wrong = autotune(tmp_path, *bench, check=False, timeout=120, env=environment(VLLM_API_KEY=OTHER_KEY))
    assert measured.returncode == 0, measured.stderr
    assert json.loads(measured.stdout)["completed"] == 6
    assert without.returncode == 2 and without.stdout == ""
    assert without.stderr.strip() == (
        f"autotune bench: error: the server at {server.base_url} refused the requests: 401 Unauthorized "
        f"({NEEDS_A_KEY})"
    )
    assert wrong.returncode == 2
    assert "401 Unauthorized (it does not accept the API key sent from VLLM_API_KEY or OPENAI_API_KEY)" in (
        wrong.stderr
    )
    for done in (measured, without, wrong):
        assert KEY not in done.stdout + done.stderr and OTHER_KEY not in done.stdout + done.stderr


def test_calibrate_url_refused_is_one_line(tmp_path: Path) -> None:
    with start_sim_server([MODEL, "--api-key", KEY], env=environment()) as server:
        done = autotune(tmp_path, "calibrate", "--url", server.base_url, "--gpu", "H100", "-o", "h100.yaml",
                        check=False, timeout=120, env=environment())  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"refused the requests: 401 Unauthorized ({NEEDS_A_KEY})" in done.stderr
    assert not (tmp_path / "h100.yaml").exists()


def test_a_trial_sends_vllm_api_key_to_the_server_it_launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)  # the launched server inherits it and requires it
    backend = ProcessBackend("H100", serve_cmd=SIM_SERVER, startup_timeout_s=60, benchmark_timeout_s=60)
    result = backend.evaluate(EngineConfig(model=MODEL, max_model_len=4096), WORKLOAD, trial_dir=tmp_path)
    assert result.ok, (result.failure, result.message)
    assert result.benchmark.completed == 6
    log = (tmp_path / "server.log").read_text()
    assert "api_key='***'" in log and KEY not in log + repr(result)


def test_the_key_a_launched_server_requires_is_read_as_vllm_reads_it() -> None:
    env = {"VLLM_API_KEY": OTHER_KEY}
    assert server_api_key(["vllm", "serve", "m"], env) == OTHER_KEY
    assert server_api_key(["vllm", "serve", "m"], {"VLLM_API_KEY": ""}) is None  # empty: no key
    assert server_api_key(["vllm", "serve", "m", "--api-key", KEY, "k2"], env) == KEY  # the flag wins
    assert server_api_key(["env", f"VLLM_API_KEY={KEY}", "vllm", "serve"], env) == KEY
    assert server_api_key(["vllm", "serve", "--api-key=a1b2c3", "--api-key", KEY], {}) == KEY  # the last


@pytest.mark.parametrize("given", ["--api-key=", "VLLM_API_KEY="])
def test_a_trial_sends_the_key_its_serve_command_gives_the_server(tmp_path: Path, given: str) -> None:
    """`--serve-cmd "vllm serve --api-key=KEY"` (or `env VLLM_API_KEY=KEY vllm serve`) with no key in
    autotune's environment: the trial sends the server its own key, and no log or result holds it."""
    serve_cmd = ("env", given + KEY, *SIM_SERVER) if given == "VLLM_API_KEY=" else (*SIM_SERVER, given + KEY)
    backend = ProcessBackend("H100", serve_cmd=serve_cmd, startup_timeout_s=60, benchmark_timeout_s=60)
    result = backend.evaluate(EngineConfig(model=MODEL, max_model_len=4096), WORKLOAD, trial_dir=tmp_path)
    assert result.ok, (result.failure, result.message)
    assert result.benchmark.completed == 6
    stored = repr(result) + (tmp_path / "server.log").read_text()
    assert KEY not in stored and "api_key='***'" in stored


def test_a_trial_refused_for_want_of_a_key_says_so(tmp_path: Path) -> None:
    """A wrapper that gives the server a key autotune cannot see (read from a file): one clear message."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    wrapper = (
        "import os, sys; from autotune.cli import main; "
        f"os.environ['VLLM_API_KEY'] = open({str(key_file)!r}).read(); "
        "sys.exit(main(['sim-server', *sys.argv[1:]]))"
    )
    backend = ProcessBackend(
        "H100", serve_cmd=(sys.executable, "-c", wrapper), startup_timeout_s=60, benchmark_timeout_s=60
    )
    result = backend.evaluate(EngineConfig(model=MODEL, max_model_len=4096), WORKLOAD, trial_dir=tmp_path)
    assert not result.ok
    assert "HTTP 401" in result.message and NEEDS_A_KEY in result.message, result.message
    assert KEY not in repr(result) + (tmp_path / "server.log").read_text()
