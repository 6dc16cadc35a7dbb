"""The sim-server against hostile clients (a real server process, real HTTP): a fan-out vLLM refuses,
a client that leaves a huge request, malformed bodies answered 400 with vLLM's JSON and no traceback
in the log; and `bench --url` options that would be silently ignored."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from errors import assert_rejected

from autotune.sim_server.server import SimServerProcess, start_sim_server

MODEL = "Qwen/Qwen3-0.6B"
# Bodies vLLM answers with 400 (a pydantic validation error or its own checks): never a 500.
MALFORMED: list[tuple[str, dict[str, Any]]] = [
    ("completions", {"prompt": "hi", "stream": True, "stream_options": [1]}),
    ("completions", {"prompt": "hi", "stream": True, "stream_options": "yes"}),
    ("completions", {"prompt": "hi", "stream": True, "stream_options": {"include_usage": "x"}}),
    ("completions", {"prompt": "hi", "stream_options": {"include_usage": True}}),  # without stream
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "stream_options": 3, "stream": True},
    ),
    ("completions", {"prompt": "hi", "n": 100_000}),
]


@pytest.fixture(scope="module")
def server() -> Iterator[SimServerProcess]:
    with start_sim_server([MODEL]) as process:
        yield process


def _post(server: SimServerProcess, path: str, body: dict[str, Any], timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/{path}", json=body, timeout=timeout)


@pytest.mark.parametrize(("path", "body"), MALFORMED)
def test_a_malformed_request_is_a_400_with_vllms_error_json(
    server: SimServerProcess, path: str, body: dict[str, Any]
) -> None:
    response = _post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]
    assert "Traceback" not in server.log()


def test_n_above_vllms_limit_says_so(server: SimServerProcess) -> None:
    response = _post(server, "completions", {"prompt": "hi", "n": 16_385, "max_tokens": 1})
    message = response.json()["error"]["message"]
    assert message.startswith("n must be at most 16384, got 16385") and "VLLM_MAX_N_SEQUENCES" in message


def test_a_client_that_leaves_a_huge_fan_out_does_not_hold_the_server(server: SimServerProcess) -> None:
    with pytest.raises(httpx.ReadTimeout):  # 16,384 choices of 2,000 tokens: the client gives up
        _post(server, "completions", {"prompt": "hello world", "n": 16_384, "max_tokens": 2000}, timeout=1.0)
    started = time.monotonic()
    response = _post(server, "completions", {"prompt": "hi", "max_tokens": 4}, timeout=60)
    assert response.status_code == 200 and time.monotonic() - started < 5  # not after the 16,384
    metrics = httpx.get(f"{server.base_url}/metrics").text
    running = next(line for line in metrics.splitlines() if line.startswith("vllm:num_requests_running"))
    assert running.endswith(" 0.0"), running  # every choice was aborted with the client
    assert "Traceback" not in server.log()


@pytest.mark.parametrize(
    "extra",
    [
        ["--set", "max_num_seqs=8"],
        ["--backend", "docker"],
        ["--backend", "sim"],
        ["--space", "small"],
        ["--noise"],
    ],
    ids=["set", "backend", "backend-sim", "space", "noise"],
)
def test_bench_url_refuses_options_that_launch_a_server(
    server: SimServerProcess,
    extra: list[str],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = assert_rejected(["bench", "--url", server.base_url, *extra], {}, tmp_path, capfd, monkeypatch)
    assert f"{extra[0]} cannot be used with --url" in line
