"""sim-server protocol details clients rely on (OpenAI SDK, aiperf) and the closed loop over HTTP."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from autotune.core.config import EngineConfig
from autotune.measure.loadgen import run_load_sync
from autotune.sim.replay import simulate
from autotune.sim_server.server import SimServerProcess, start_sim_server
from autotune.workloads.spec import Request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def server() -> Iterator[SimServerProcess]:
    with start_sim_server([MODEL, "--max-model-len", "4096"]) as proc:
        yield proc


def _stream(server: SimServerProcess, **options: object) -> list[dict]:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 3, "stream": True, **options}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_stream_chunks_carry_stop_reason_and_usage_null(server: SimServerProcess) -> None:
    chunks = _stream(server)
    assert len(chunks) == 3
    assert all(c["usage"] is None and c["choices"][0]["stop_reason"] is None for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_continuous_usage_stats_on_every_chunk(server: SimServerProcess) -> None:
    chunks = _stream(server, stream_options={"include_usage": True, "continuous_usage_stats": True})
    counted = [c["usage"]["completion_tokens"] for c in chunks]
    assert counted == [1, 2, 3, 3]  # three token chunks, then the usage-only chunk
    assert chunks[-1]["choices"] == []


@pytest.mark.parametrize(
    ("options", "usage_chunk", "per_chunk"),
    [
        ({}, True, False),  # StreamOptions.include_usage defaults to true
        ({"continuous_usage_stats": True}, True, True),
        ({"include_usage": False, "continuous_usage_stats": True}, False, False),
        ({"include_usage": None}, False, False),
    ],
)
def test_stream_options_default_as_vllm_reads_them(
    server: SimServerProcess, options: dict, usage_chunk: bool, per_chunk: bool
) -> None:
    chunks = _stream(server, stream_options=options)
    tokens = [c for c in chunks if c["choices"]]
    assert (chunks[-1]["choices"] == []) == usage_chunk and len(tokens) == 3
    assert all((c["usage"] is not None) == per_chunk for c in tokens)


def test_bad_requests_answer_nested_json_errors(server: SimServerProcess) -> None:
    url = server.base_url + "/v1/completions"
    cold = httpx.post(url, json={"model": MODEL, "prompt": "x", "temperature": -1})
    assert cold.status_code == 400 and "temperature" in cold.json()["error"]["message"]
    nested = b"[" * 100_000 + b"]" * 100_000
    deep = httpx.post(url, content=nested, headers={"content-type": "application/json"})
    assert deep.status_code == 400 and deep.json()["error"]["type"] == "BadRequestError"
    unknown = httpx.get(server.base_url + "/v1/nope")
    assert unknown.status_code == 404 and unknown.json() == {"detail": "Not Found"}


def test_closed_loop_in_process_and_over_http_agree_at_concurrency_32() -> None:
    """The same engine driven in-process and over HTTP at fixed concurrency: a finished request's
    successor is admitted at the same point, so mean TTFT agrees within 10%.

    Compared on the engine's clock (the server's /debug/requests "engine_ttft": send -> first token in
    simulated time), which is what admission decides; wall-clock TTFT adds the client's and the
    server's CPU lag, which on a loaded machine is larger than the effect under test."""
    rng = np.random.default_rng(3)
    prompts, outputs = rng.integers(50, 300, 160), rng.integers(20, 120, 160)
    requests = [Request(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]
    with start_sim_server([MODEL, "--max-model-len", "4096", "--debug-timings"]) as proc:
        over_http = run_load_sync(proc.base_url, MODEL, requests, max_concurrency=32)
        rows = httpx.get(proc.base_url + "/debug/requests").json()["requests"]
    assert len(rows) == len(requests) and all(r.success for r in over_http.records)
    in_process = simulate(EngineConfig(model=MODEL, max_model_len=4096), "H100", requests, max_concurrency=32)
    http_ttft = np.mean([row["engine_ttft"] for row in rows])
    sim_ttft = np.mean([r.ttft for r in in_process.records])
    assert sim_ttft == pytest.approx(http_ttft, rel=0.10), (sim_ttft, http_ttft)


@pytest.fixture(scope="module")
def strict_server() -> Iterator[SimServerProcess]:
    args = [MODEL, "--max-model-len", "4096", "--max-request-bytes", "2000", "--request-read-timeout", "0.5"]
    with start_sim_server(args) as proc:
        yield proc


def _raw(server: SimServerProcess, data: bytes, wait_s: float = 3.0) -> bytes:
    """Send `data` and read until the server closes the connection (or `wait_s` passes)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait_s) as sock:
        sock.sendall(data)
        seen = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                seen += chunk
    return seen


def _json_body(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def test_oversized_body_gets_413_json(strict_server: SimServerProcess) -> None:
    big = httpx.post(strict_server.base_url + "/v1/completions", json={"model": MODEL, "prompt": [5] * 1000})
    assert big.status_code == 413 and big.json()["error"]["code"] == 413
    ok = httpx.post(strict_server.base_url + "/v1/completions", json={"prompt": [5] * 10, "max_tokens": 2})
    assert ok.status_code == 200  # the limit is on size only


def test_chunked_oversized_body_gets_413(strict_server: SimServerProcess) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"x" * 1500
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    response = _raw(strict_server, head + frame + frame)
    assert response.startswith(b"HTTP/1.1 413 ") and _json_body(response)["error"]["code"] == 413


def test_half_sent_request_times_out_with_408(strict_server: SimServerProcess) -> None:
    half = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt":'
    start = time.monotonic()
    response = _raw(strict_server, half, wait_s=5.0)
    assert response.startswith(b"HTTP/1.1 408 ") and _json_body(response)["error"]["code"] == 408
    assert time.monotonic() - start < 4.0  # closed by the server, not by our own timeout


def test_n_choices_share_the_prompt_and_stream_with_their_index(server: SimServerProcess) -> None:
    """vLLM samples n > 1 choices in parallel (one request each, the prompt's KV shared)."""
    url = server.base_url + "/v1/completions"
    plain = httpx.post(url, json={"model": MODEL, "prompt": [7] * 64, "max_tokens": 3, "n": 3}).json()
    assert [c["index"] for c in plain["choices"]] == [0, 1, 2]
    assert plain["usage"] == {"prompt_tokens": 64, "total_tokens": 73, "completion_tokens": 9}
    chunks = _stream(server, n=2, max_tokens=3, stream_options={"include_usage": True})
    token_chunks = [c for c in chunks if c["choices"]]
    assert sorted(c["choices"][0]["index"] for c in token_chunks) == [0, 0, 0, 1, 1, 1]
    assert len({c["id"] for c in chunks}) == 1 and chunks[-1]["usage"]["completion_tokens"] == 6
    zero = httpx.post(url, json={"model": MODEL, "prompt": "x", "n": 0})
    assert zero.status_code == 400 and "n must be at least 1" in zero.json()["error"]["message"]


def test_ping_answers_as_health_on_get_and_post(server: SimServerProcess) -> None:
    """vLLM's /ping (GET and POST, for SageMaker) is its /health (vllm/entrypoints/openai/api_server.py)."""
    for method in ("GET", "POST"):
        response = httpx.request(method, server.base_url + "/ping")
        assert response.status_code == 200 and response.content == b""


def test_cors_allows_every_origin_as_vllms_default(server: SimServerProcess) -> None:
    """vLLM's server runs Starlette's CORSMiddleware allowing every origin, method and header by default
    (--allowed-origins '["*"]', vllm/entrypoints/openai/cli_args.py): a preflight is answered, and a
    response to a request with an Origin says any origin may read it."""
    url = server.base_url + "/v1/completions"
    asked = {"origin": "http://ui.example", "access-control-request-method": "POST",
             "access-control-request-headers": "content-type,authorization"}  # fmt: skip
    preflight = httpx.options(url, headers=asked)
    assert preflight.status_code == 200 and preflight.text == "OK"
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert preflight.headers["access-control-allow-methods"] == "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
    assert preflight.headers["access-control-allow-headers"] == "content-type,authorization"
    assert preflight.headers["access-control-max-age"] == "600"
    origin = {"origin": "http://ui.example"}
    body = {"prompt": "hi", "max_tokens": 1}
    assert httpx.post(url, json=body, headers=origin).headers["access-control-allow-origin"] == "*"
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=origin) as streamed:
        assert streamed.headers["access-control-allow-origin"] == "*"
    assert httpx.get(server.base_url + "/nope", headers=origin).headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-origin" not in httpx.post(url, json=body).headers  # no Origin: no CORS
