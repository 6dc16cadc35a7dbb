"""sim-server as a real subprocess on 127.0.0.1: real clients, vLLM's formats, metrics and startup errors."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from autotune.sim_server.server import SimServerProcess, start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def server() -> Iterator[SimServerProcess]:
    with start_sim_server([MODEL, "--max-model-len", "4096"]) as proc:
        yield proc


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def _metrics(server: SimServerProcess) -> str:
    return httpx.get(server.base_url + "/metrics").text


def _abort_count(server: SimServerProcess) -> float:
    # prometheus_client (vLLM's exporter too) writes labels sorted by name
    pattern = r'^vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)$'
    match = re.search(pattern, _metrics(server), re.MULTILINE)
    assert match, "no abort reason in vllm:request_success_total"
    return float(match.group(1))


def _open_request(server: SimServerProcess, body: dict) -> socket.socket:
    """A raw HTTP/1.1 POST to /v1/completions on its own connection (the test closes it at will)."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + payload)
    return sock


def _read_until(sock: socket.socket, marker: bytes) -> None:
    seen = b""
    while marker not in seen:
        data = sock.recv(4096)
        assert data, "the server closed the stream"
        seen += data


def _wait_idle(server: SimServerProcess, timeout_s: float) -> str:
    """/metrics once no request is running or waiting; fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = _metrics(server)
        if _metric(text, "vllm:num_requests_running") == _metric(text, "vllm:num_requests_waiting") == 0:
            return text
        assert time.monotonic() < deadline, "requests kept running after their clients disconnected"
        time.sleep(0.05)


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
    body = response.json()["error"]  # vLLM >= 0.10.1 nests the error
    assert body["type"] == "BadRequestError" and body["code"] == 400 and body["param"] is None
    assert body["message"] == (  # vLLM 0.10.2 on: the completion's budget is named, not the total
        "'max_tokens' or 'max_completion_tokens' is too large: 200. This model's maximum context length is "
        "4096 tokens and your request has 4000 input tokens (200 > 4096 - 4000)."
    )
    prompt = httpx.post(
        server.base_url + "/v1/completions", json={"model": MODEL, "prompt": [5] * 4096, "max_tokens": 1}
    )
    assert prompt.status_code == 400 and prompt.json()["error"]["message"] == (
        "This model's maximum context length is 4096 tokens. However, your request has 4096 input tokens. "
        "Please reduce the length of the input messages."
    )
    negative = httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, "prompt": [-1, 5]})
    assert negative.json()["error"]["message"] == "Token id -1 is out of vocabulary"
    missing = httpx.post(server.base_url + "/v1/completions", json={"model": "nope", "prompt": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"


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


def test_v1_request_histograms_follow_each_finished_request(server: SimServerProcess) -> None:
    """The histograms vLLM's Grafana dashboards read, with vllm/v1/metrics/loggers.py's names and buckets
    and vllm/v1/metrics/stats.py's definitions: per finished request its token counts and the phases
    from its scheduling to its last token; per engine step its prompt plus generated tokens."""
    names = ("vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:iteration_tokens_total",
             "vllm:time_per_output_token_seconds", "vllm:request_time_per_output_token_seconds",
             "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds",
             "vllm:request_decode_time_seconds")  # fmt: skip
    before = _metrics(server)
    body = {"model": MODEL, "prompt": [7] * 50, "max_tokens": 4, "ignore_eos": True}
    httpx.post(server.base_url + "/v1/completions", json=body, timeout=10).raise_for_status()
    after = _wait_idle(server, 10)

    def delta(name: str) -> float:
        return _metric(after, name) - _metric(before, name)

    assert {name: delta(name + "_count") for name in names} == {
        "vllm:request_prompt_tokens": 1,
        "vllm:request_generation_tokens": 1,
        "vllm:iteration_tokens_total": 4,  # the prefill step and three decode steps
        "vllm:time_per_output_token_seconds": 3,  # the deprecated twin of inter_token_latency
        "vllm:request_time_per_output_token_seconds": 1,
        "vllm:request_inference_time_seconds": 1,
        "vllm:request_prefill_time_seconds": 1,
        "vllm:request_decode_time_seconds": 1,
    }
    assert delta("vllm:request_prompt_tokens_sum") == 50 and delta("vllm:request_generation_tokens_sum") == 4
    assert delta("vllm:iteration_tokens_total_sum") == 50 + 4  # the prompt counts in its first token's step
    phases = [delta(f"vllm:request_{phase}_time_seconds_sum") for phase in ("prefill", "decode", "inference")]
    assert min(phases[:2]) > 0 and phases[2] == pytest.approx(phases[0] + phases[1])
    tpot = delta("vllm:request_time_per_output_token_seconds_sum")
    assert tpot == pytest.approx(phases[1] / 3)
    # 1-2-5 token buckets up to max_model_len (build_1_2_5_buckets), fixed step buckets up to 16384
    assert re.search(r'^vllm:request_prompt_tokens_bucket\{[^}]*le="2000.0"', after, re.MULTILINE)
    assert not re.search(r'^vllm:request_prompt_tokens_bucket\{[^}]*le="5000.0"', after, re.MULTILINE)
    assert re.search(r'^vllm:iteration_tokens_total_bucket\{[^}]*le="16384.0"', after, re.MULTILINE)


def test_the_request_parameter_histograms_count_each_request_once(server: SimServerProcess) -> None:
    """vLLM's request_params_max_tokens (per choice), request_params_n and
    request_max_num_generation_tokens (per request, once its last choice ended:
    vllm/v1/engine/parallel_sampling.py), with its buckets (vllm/v1/metrics/loggers.py)."""
    names = (
        "vllm:request_params_max_tokens",
        "vllm:request_params_n",
        "vllm:request_max_num_generation_tokens",
    )
    before = _metrics(server)
    body = {"model": MODEL, "prompt": [7] * 20, "max_tokens": 5, "ignore_eos": True, "n": 3}
    httpx.post(server.base_url + "/v1/completions", json=body, timeout=10).raise_for_status()
    after = _wait_idle(server, 10)

    def delta(name: str) -> float:
        return _metric(after, name) - _metric(before, name)

    assert [delta(f"{name}_count") for name in names] == [3, 1, 1]
    assert [delta(f"{name}_sum") for name in names] == [15, 3, 5]
    assert re.search(r'^vllm:request_params_n_bucket\{[^}]*le="20.0"', after, re.MULTILINE)


def test_ttft_and_e2e_metrics_count_from_the_requests_arrival_on_the_engines_clock() -> None:
    """vLLM's TTFT and e2e histograms run from the request's arrival_time to the step that produced the
    token (vllm/v1/metrics/stats.py IterationStats): here from its send time on the simulated clock,
    as the engine's own records, not from whenever this process got round to its handler. A fast clock
    (--time-scale 50) would multiply any wall-clock lag by 50."""
    args = [MODEL, "--max-model-len", "4096", "--time-scale", "50", "--debug-timings"]
    with start_sim_server(args) as proc:
        body = {"model": MODEL, "prompt": [7] * 3000, "max_tokens": 1}
        for _ in range(5):
            httpx.post(proc.base_url + "/v1/completions", json=body, timeout=10).raise_for_status()
        rows = httpx.get(proc.base_url + "/debug/requests").json()["requests"]
        text = _metrics(proc)
    engine = sum(row["engine_ttft"] for row in rows)  # send -> first token delivered, simulated
    for name in ("vllm:time_to_first_token_seconds_sum", "vllm:e2e_request_latency_seconds_sum"):
        # the steps' ends: before the API server's delivery of their tokens
        assert engine - 0.005 * len(rows) <= _metric(text, name) <= engine, name


def test_prefix_caching_hits_for_shared_token_prefixes(server: SimServerProcess) -> None:
    before = _metric(httpx.get(server.base_url + "/metrics").text, "vllm:prefix_cache_hits_total")
    shared = list(range(2000, 2256))  # 16 full blocks
    for tail in (3000, 4000):
        body = {"model": MODEL, "prompt": shared + list(range(tail, tail + 40)), "max_tokens": 2}
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=10).raise_for_status()
    after = _metric(httpx.get(server.base_url + "/metrics").text, "vllm:prefix_cache_hits_total")
    assert after - before >= 256


def test_the_startup_log_lists_only_the_args_that_differ_from_vllms_defaults(
    server: SimServerProcess,
) -> None:
    line = next(line for line in server.log().splitlines() if "non-default args:" in line)
    assert "non-default args: {'max_model_len': 4096} model=" in line  # not block_size=16 and the like


@pytest.mark.parametrize(
    "token", [[], ["--hf-token", "hf_notarealtoken123"], ["--hf-token"]], ids=["none", "value", "alone"]
)
def test_as_vllm_serve_the_positional_model_wins_and_an_hf_token_is_accepted_unlogged(
    token: list[str],
) -> None:
    """`vllm serve M --model N` serves M (vllm/entrypoints/cli/serve.py: model_tag overrides --model);
    --hf-token (alone: the cached login's) is vLLM's, and a serve command may carry it."""
    args = [MODEL, "--model", "Qwen/Qwen2.5-7B-Instruct", *token, "--max-model-len", "4096"]
    with start_sim_server(args) as proc:
        card = httpx.get(proc.base_url + "/v1/models").json()["data"][0]
        log = proc.log()
    assert card["id"] == MODEL
    assert "hf_notarealtoken123" not in log


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


def test_allow_long_max_model_len_turns_the_context_check_into_a_warning() -> None:
    """VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets a max_model_len past the model's context start, with vLLM's
    warning (vllm/config/model.py _get_and_verify_max_len); unset, startup fails saying to set it."""
    args = ["Qwen/Qwen3-0.6B", "--max-model-len", "50000"]
    cmd = [sys.executable, "-m", "autotune.commands.sim_server", *args, "--port", "0"]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1
    assert "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. " in (
        refused.stderr
    )
    env = {**os.environ, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    with start_sim_server(args, env=env) as proc:
        assert httpx.get(proc.base_url + "/v1/models").json()["data"][0]["max_model_len"] == 50000
        warning = next(line for line in proc.log().splitlines() if line.startswith("WARNING"))
    assert "User-specified max_model_len (50000) is greater than the derived max_model_len" in warning
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution." in warning


def test_max_concurrency_counts_whole_blocks_per_request() -> None:
    """vLLM's "Maximum concurrency" is num_blocks / cdiv(max_model_len, block_size)
    (get_max_concurrency_for_kv_cache_config, vllm/v1/core/kv_cache_utils.py): a request's last block is
    whole even when max_model_len is not a multiple of the block size."""
    with start_sim_server([MODEL, "--max-model-len", "1000"]) as proc:
        log = proc.log()
    blocks = int(re.search(r"# GPU blocks: (\d+)", log).group(1))  # type: ignore[union-attr]
    said = re.search(r"Maximum concurrency for 1,000 tokens per request: (\S+)x", log).group(1)  # type: ignore[union-attr]
    assert said == f"{blocks / 63:.2f}"  # 1000 tokens take 63 blocks of 16


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


def test_disconnected_clients_abort_their_requests(server: SimServerProcess) -> None:
    aborts = _abort_count(server)
    body = {"model": MODEL, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    # 48 streams of 3000 tokens: a minute of decoding if nobody aborted them.
    streams = [_open_request(server, body | {"prompt": list(range(i, i + 600))}) for i in range(48)]
    for sock in streams:
        _read_until(sock, b"data: ")  # the first token chunk: the request is in the batch
    busy = _metrics(server)
    assert _metric(busy, "vllm:num_requests_running") + _metric(busy, "vllm:num_requests_waiting") == 48
    assert _metric(busy, "vllm:kv_cache_usage_perc") > 0.05
    start = time.monotonic()
    for sock in streams:
        sock.close()
    idle = _wait_idle(server, timeout_s=3.0)
    print(f"48 streams aborted; server idle {time.monotonic() - start:.3f} s after the clients closed")
    assert _metric(idle, "vllm:kv_cache_usage_perc") < _metric(busy, "vllm:kv_cache_usage_perc")
    assert _abort_count(server) - aborts == 48
    # A plain (non-streaming) request whose client gives up is aborted too.
    sock = _open_request(server, body | {"stream": False, "prompt": list(range(100, 700))})
    deadline = time.monotonic() + 3
    while _metric(_metrics(server), "vllm:num_requests_running") == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sock.close()
    _wait_idle(server, timeout_s=3.0)
    assert _abort_count(server) - aborts == 49
