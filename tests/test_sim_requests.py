"""sim-server request semantics as vLLM's OpenAI server has them: output lengths and finish reasons."""

from __future__ import annotations

import json
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
    # min_tokens holds EOS back (MinTokensLogitsProcessor, vllm/v1/sample/logits_processor/builtin.py)
    held = _post(server, "/v1/chat/completions", {"messages": messages, "min_tokens": 300}).json()
    assert held["usage"]["completion_tokens"] == 300 and held["choices"][0]["finish_reason"] == "stop"
    # an answer that ends before the limit still stops on its own
    free = _post(server, "/v1/chat/completions", {"messages": messages}).json()
    assert free["choices"][0]["finish_reason"] == "stop"
    assert free["usage"]["completion_tokens"] < MAX_MODEL_LEN - free["usage"]["prompt_tokens"]


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.mark.parametrize(
    ("path", "fields", "message"),
    [
        (COMPLETIONS, {"n": 2, "best_of": 1},
         "best_of must be greater than or equal to n, got n=2 and best_of=1."),
        (CHAT, {"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.0."),
        (COMPLETIONS, {"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2], got -2.5."),
        (COMPLETIONS, {"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0.0."),
        (COMPLETIONS, {"temperature": -1}, "temperature must be non-negative, got -1.0."),
        (COMPLETIONS, {"top_p": 0}, "top_p must be in (0, 1], got 0.0."),
        (CHAT, {"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        (COMPLETIONS, {"top_k": -2}, "top_k must be 0 (disable), or at least 1, got -2."),
        (COMPLETIONS, {"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
        (COMPLETIONS, {"max_tokens": 0}, "max_tokens must be at least 1, got 0."),
        (COMPLETIONS, {"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1."),
        (COMPLETIONS, {"min_tokens": 5, "max_tokens": 3},
         "min_tokens must be less than or equal to max_tokens=3, got 5."),
        (COMPLETIONS, {"min_tokens": 17}, "min_tokens must be less than or equal to max_tokens=16, got 17."),
        # without max_tokens the limit is the context left: 1024 - 1000
        (COMPLETIONS, {"prompt": [7] * 1000, "max_tokens": None, "min_tokens": 25},
         "min_tokens must be less than or equal to max_tokens=24, got 25."),
        (COMPLETIONS, {"logprobs": 21},
         "Requested sample logprobs of 21, which is greater than max allowed: 20"),
        (CHAT, {"logprobs": True, "top_logprobs": 21},
         "Requested sample logprobs of 21, which is greater than max allowed: 20"),
        (COMPLETIONS, {"best_of": 2}, "vLLM V1 does not yet support best_of."),
        # the request model's own checks (protocol.py check_logprobs), before any other
        (COMPLETIONS, {"logprobs": -1}, "`logprobs` must be a positive value."),
        (CHAT, {"logprobs": True, "top_logprobs": -3}, "`top_logprobs` must be a positive value or -1."),
        (CHAT, {"top_logprobs": 2}, "when using `top_logprobs`, `logprobs` must be set to true."),
        (COMPLETIONS, {"prompt_logprobs": -5}, "`prompt_logprobs` must be a positive value or -1."),
        (COMPLETIONS, {"prompt_logprobs": 1, "stream": True},
         "`prompt_logprobs` are not available when `stream=True`."),
        (COMPLETIONS, {"stop": ["x", ""]}, "stop cannot contain an empty string."),
        (CHAT, {"stop": ""}, "stop cannot contain an empty string."),
        (COMPLETIONS, {"n": 2, "temperature": 0}, "n must be 1 when using greedy sampling, got 2."),
        (COMPLETIONS, {"suffix": "x"}, "suffix is not currently supported"),
    ],
)  # fmt: skip
def test_sampling_parameters_vllm_refuses_get_its_400(
    server: SimServerProcess, path: str, fields: dict, message: str
) -> None:
    """vLLM's checks of the sampling parameters (SamplingParams._verify_args, vllm/sampling_params.py;
    then the V1 engine's vllm/v1/engine/processor.py), with their messages."""
    prompt = {"messages": [{"role": "user", "content": "hi"}]} if path == CHAT else {"prompt": "hi"}
    reply = _post(server, path, {**prompt, **fields})
    assert reply.status_code == 400
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    assert reply.json()["error"] == error


def test_a_streamed_request_the_engine_refuses_gets_the_error_as_an_event(server: SimServerProcess) -> None:
    """The V1 engine checks logprobs when the request reaches it, after a streamed response began:
    vLLM streams the error, then [DONE] (the stream generators of serving_completion.py)."""
    body = {"model": MODEL, "prompt": "hi", "logprobs": 21, "stream": True}
    with httpx.stream("POST", server.base_url + COMPLETIONS, json=body, timeout=30) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[1:] == ["[DONE]"]
    error = json.loads(events[0])["error"]
    assert error["message"] == "Requested sample logprobs of 21, which is greater than max allowed: 20"
    assert error["code"] == 400


def test_an_empty_model_name_is_the_served_model(server: SimServerProcess) -> None:
    """vLLM serves its model to a request whose model is empty or null (serving_engine.py
    _is_model_supported)."""
    for model in ("", None):
        reply = _post(server, COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "model": model})
        assert reply.status_code == 200 and reply.json()["model"] == MODEL


def test_several_served_names_are_each_served_and_listed() -> None:
    """`--served-model-name a b`, as vLLM takes it: either name is served, the first is the one answers
    carry, /v1/models lists both, and the model's path is no longer a name."""
    with start_sim_server([MODEL, "--max-model-len", "1024", "--served-model-name", "a", "b"]) as proc:
        listed = httpx.get(proc.base_url + "/v1/models", timeout=30).json()["data"]
        assert [card["id"] for card in listed] == ["a", "b"] and listed[1]["root"] == MODEL
        for name in ("a", "b"):
            reply = _post(proc, COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "model": name})
            assert reply.status_code == 200 and reply.json()["model"] == "a"
        assert _post(proc, COMPLETIONS, {"prompt": "hi", "max_tokens": 2}).status_code == 404


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_body_that_is_not_declared_json_is_refused_as_vllm_refuses_it(
    server: SimServerProcess, content_type: str | None
) -> None:
    """vLLM's validate_json_request: curl's default form type, or none, gets a 400 before the body is
    read; a client that forgets the header fails there too, not only on real vLLM."""
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    headers = {"content-type": content_type} if content_type else {}
    reply = httpx.post(server.base_url + COMPLETIONS, content=body, headers=headers, timeout=30)
    assert reply.status_code == 400
    assert "Only 'application/json' is allowed" in reply.json()["error"]["message"]
    charset = {"content-type": "Application/JSON; charset=utf-8"}
    assert httpx.post(server.base_url + COMPLETIONS, content=body, headers=charset, timeout=30).is_success


@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_of_prompts_is_one_request_each_in_one_response(
    server: SimServerProcess, stream: bool
) -> None:
    """vLLM takes `prompt` as a list of strings or of token-id lists (clients such as lm-eval batch
    so): one choice per prompt and n, index = prompt x n + choice, each prompt counted once in the
    usage. It was a 400 here."""
    body = {"prompt": [[1, 2, 3], [4, 5, 6, 7, 8]], "max_tokens": 3, "n": 2}
    if not stream:
        reply = _post(server, COMPLETIONS, body)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
        assert answer["usage"] == {"prompt_tokens": 8, "total_tokens": 20, "completion_tokens": 12}
    else:
        body |= {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", server.base_url + COMPLETIONS, json=body, timeout=30) as reply:
            lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(line) for line in lines[:-1]]
        counts: dict[int, int] = {}
        for chunk in chunks:
            for choice in chunk["choices"]:
                counts[choice["index"]] = counts.get(choice["index"], 0) + 1
        assert counts == {0: 3, 1: 3, 2: 3, 3: 3} and len({c["id"] for c in chunks}) == 1
        assert chunks[-1]["usage"]["prompt_tokens"] == 8
    texts = _post(server, COMPLETIONS, {"prompt": ["a b", "c d", "e"], "max_tokens": 1}).json()["choices"]
    assert len(texts) == 3
    for mixed in (["a", [1]], [[1], "a"], []):
        assert _post(server, COMPLETIONS, {"prompt": mixed}).status_code == 400
    long_second = {"prompt": [[1], [7] * MAX_MODEL_LEN], "max_tokens": 1}  # one prompt too long: all refused
    assert "maximum context length" in _post(server, COMPLETIONS, long_second).json()["error"]["message"]
