"""sim-server request semantics as vLLM's OpenAI server has them: output lengths and finish reasons."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from autotune.sim_server.server import SimServerProcess, start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAX_MODEL_LEN = 1024


@pytest.fixture(scope="module")
def server() -> Iterator[SimServerProcess]:
    # A fast clock: the answers below run to hundreds of tokens.
    with start_sim_server([MODEL, "--max-model-len", str(MAX_MODEL_LEN), "--time-scale", "100"]) as proc:
        yield proc


def _post(server: SimServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json={"model": MODEL, **body}, timeout=30)


def test_chat_takes_max_tokens_when_max_completion_tokens_is_null(server: SimServerProcess) -> None:
    """vLLM reads `max_completion_tokens or max_tokens` (entrypoints/utils.py get_max_tokens): a client
    that sends both fields, one null, gets the other's length."""
    messages = [{"role": "user", "content": "hi"}]
    reply = _post(
        server, "/v1/chat/completions", {"messages": messages, "max_completion_tokens": None, "max_tokens": 3}
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["finish_reason"] == "length"


def test_an_answer_cut_by_the_context_limit_finishes_with_length(server: SimServerProcess) -> None:
    """Without max_tokens vLLM's limit is the context left (max_model_len - prompt, get_max_tokens) and
    a request stopped there finishes "length" (vllm/v1/core/sched/utils.py check_stop)."""
    cut = _post(server, "/v1/completions", {"prompt": [7] * 1000, "max_tokens": None}).json()
    assert cut["usage"]["completion_tokens"] == MAX_MODEL_LEN - 1000
    assert cut["choices"][0]["finish_reason"] == "length"
    # ignore_eos: no EOS ends the answer first, it runs to the context limit
    messages = [{"role": "user", "content": "hi"}]
    forced = _post(server, "/v1/chat/completions", {"messages": messages, "ignore_eos": True}).json()
    usage = forced["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN
    assert forced["choices"][0]["finish_reason"] == "length"
    # an answer that ends before the limit still stops on its own
    free = _post(server, "/v1/chat/completions", {"messages": messages}).json()
    assert free["choices"][0]["finish_reason"] == "stop"
    assert free["usage"]["completion_tokens"] < MAX_MODEL_LEN - free["usage"]["prompt_tokens"]


COMPLETIONS = "/v1/completions"


def test_an_empty_model_name_is_the_served_model(server: SimServerProcess) -> None:
    """vLLM serves its model to a request whose model is empty or null (serving_engine.py
    _is_model_supported)."""
    for model in ("", None):
        reply = _post(server, COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "model": model})
        assert reply.status_code == 200 and reply.json()["model"] == MODEL
