"""API keys as vLLM takes them: real `autotune sim-server` processes with `--api-key` or VLLM_API_KEY.

The server must refuse /v1 requests without one of its keys (401, vLLM's body) and leave /health and
/metrics open, and no key may appear in its log.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import httpx

from autotune.core.api_keys import CLIENT_KEY_VARS
from autotune.sim_server.process import start_sim_server

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KEY = "sk-autotune-test-5f2c9a71"
OTHER_KEY = "sk-rotated-key-0b81e4"


def environment(**keys: str) -> dict[str, str]:
    """This process's environment without any API key, plus `keys`."""
    return {**{k: v for k, v in os.environ.items() if k not in CLIENT_KEY_VARS}, **keys}


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
