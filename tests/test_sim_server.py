"""sim-server as a real subprocess on 127.0.0.1: real clients, vLLM's formats, metrics and startup errors."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from autotune.sim.server import SimServerProcess, start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def server() -> Iterator[SimServerProcess]:
    with start_sim_server([MODEL, "--max-model-len", "4096"]) as proc:
        yield proc


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_openai_sdk_streams_a_completion_with_exact_tokens(server: SimServerProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="EMPTY")
    stream = client.completions.create(
        model=MODEL,
        prompt=list(range(1000, 1100)),
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 7
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 100
    assert chunks[-1].usage.completion_tokens == 7


def test_openai_sdk_streams_a_chat_completion(server: SimServerProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="EMPTY")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something about KV caches."}],
        max_completion_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert sum(1 for d in deltas if d.content) == 5
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    # Non-streaming too.
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert reply.choices[0].finish_reason == "length"


def test_models_and_version(server: SimServerProcess) -> None:
    models = httpx.get(server.base_url + "/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == MODEL and card["owned_by"] == "vllm" and card["max_model_len"] == 4096
    assert "version" in httpx.get(server.base_url + "/version").json()


def test_validation_errors_look_like_vllm(server: SimServerProcess) -> None:
    response = httpx.post(
        server.base_url + "/v1/completions", json={"model": MODEL, "prompt": [5] * 4000, "max_tokens": 200}
    )
    assert response.status_code == 400
    body = response.json()
    assert body["object"] == "error" and body["type"] == "BadRequestError" and body["code"] == 400
    assert body["message"].startswith("This model's maximum context length is 4096 tokens.")
    assert "(4000 in the messages, 200 in the completion)" in body["message"]
    missing = httpx.post(server.base_url + "/v1/completions", json={"model": "nope", "prompt": "x"})
    assert missing.status_code == 404 and missing.json()["type"] == "NotFoundError"


def test_metrics_have_vllm_names_and_move(server: SimServerProcess) -> None:
    before = httpx.get(server.base_url + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
    ):
        _metric(before, name)
    info = re.search(r"^vllm:cache_config_info\{(.*)\} 1.0$", before, re.MULTILINE)
    assert info and 'block_size="16"' in info.group(1) and re.search(r'num_gpu_blocks="\d+"', info.group(1))
    assert 'le="2560.0"' in before  # vLLM's TTFT buckets
    httpx.post(
        server.base_url + "/v1/completions",
        json={"model": MODEL, "prompt": [7] * 50, "max_tokens": 4, "ignore_eos": True},
        timeout=10,
    ).raise_for_status()
    after = httpx.get(server.base_url + "/metrics").text
    for name, delta in (
        ("vllm:prompt_tokens_total", 50),
        ("vllm:generation_tokens_total", 4),
        ("vllm:time_to_first_token_seconds_count", 1),
        ("vllm:inter_token_latency_seconds_count", 3),
        ("vllm:e2e_request_latency_seconds_count", 1),
    ):
        assert _metric(after, name) - _metric(before, name) >= delta, name
    assert _metric(after, "vllm:time_to_first_token_seconds_sum") > _metric(
        before, "vllm:time_to_first_token_seconds_sum"
    )


def test_prefix_caching_hits_for_shared_token_prefixes(server: SimServerProcess) -> None:
    before = _metric(httpx.get(server.base_url + "/metrics").text, "vllm:prefix_cache_hits_total")
    shared = list(range(2000, 2256))  # 16 full blocks
    for tail in (3000, 4000):
        body = {"model": MODEL, "prompt": shared + list(range(tail, tail + 40)), "max_tokens": 2}
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=10).raise_for_status()
    after = _metric(httpx.get(server.base_url + "/metrics").text, "vllm:prefix_cache_hits_total")
    assert after - before >= 256


def test_invalid_config_exits_nonzero_with_vllms_message() -> None:
    args = [
        MODEL,
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "2048",
        "--max-model-len",
        "8192",
    ]
    cmd = [sys.executable, "-m", "autotune.commands.sim_server", *args, "--port", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "max_num_batched_tokens (2048) is smaller than max_model_len (8192)." in done.stderr
    assert "Application startup complete" not in done.stderr


def test_startup_delay_refuses_connections_until_ready() -> None:
    with start_sim_server([MODEL, "--startup-delay", "1.0"], wait_ready=False) as proc:
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):
            httpx.get(proc.base_url + "/health", timeout=1.0)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(proc.base_url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.ConnectError:
                time.sleep(0.05)
        else:
            pytest.fail("sim-server never became healthy")
        assert "GPU KV cache size:" in proc.log() and "# GPU blocks:" in proc.log()
