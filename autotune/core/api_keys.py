"""The API key autotune's clients send to a server's OpenAI routes, and what they say when it is refused.

`vllm serve --api-key KEY` (or VLLM_API_KEY in its environment) makes vLLM answer 401 to a /v1 request
without `Authorization: Bearer KEY`. To a server it launched, autotune sends the key that server was given
(its command's `--api-key`, else its VLLM_API_KEY); to any other, VLLM_API_KEY, else OPENAI_API_KEY, the
one `vllm bench serve` sends. The value never reaches a message: a refusal names the variables, not the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

SERVER_KEY_VAR = "VLLM_API_KEY"
CLIENT_KEY_VARS = (SERVER_KEY_VAR, "OPENAI_API_KEY")  # in the order they are looked up
REFUSED_STATUSES = frozenset({401, 403})  # vLLM answers 401; a proxy in front of it may answer 403


def client_api_key() -> str | None:
    """The key to send: this process's VLLM_API_KEY, else OPENAI_API_KEY; None if neither is set (an
    empty value counts as unset, as vLLM ignores an empty key)."""
    return next((os.environ[name] for name in CLIENT_KEY_VARS if os.environ.get(name)), None)


def server_api_key(args: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key a server launched with `args` in `env` requires, as vLLM reads it: the last `--api-key`
    flag's first value (the flag wins over the environment), else a `VLLM_API_KEY=...` assignment in the
    command (`env VLLM_API_KEY=... vllm serve`), else `env`'s VLLM_API_KEY; None when none is set."""
    flag, assigned = None, None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == "--api-key":
            flag = value if eq else (args[i + 1] if i + 1 < len(args) else None)
        elif name == SERVER_KEY_VAR and eq:
            assigned = value
    return flag or assigned or env.get(SERVER_KEY_VAR) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The Authorization header carrying `api_key` ({} without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def refusal_hint(key_sent: bool) -> str:
    """Why a server refuses requests with 401/403, in words a user can act on (never the key itself)."""
    if key_sent:
        names = " or ".join(CLIENT_KEY_VARS)
        return f"it does not accept the API key sent from {names}"
    return f"it needs an API key: set {' or '.join(CLIENT_KEY_VARS)}"


def refusal_message(where: str, status: int, reason: str, key_sent: bool) -> str:
    """One line for a server (`where`, its URL with any password masked) that refused autotune's requests."""
    return f"the server at {where} refused the requests: {status} {reason} ({refusal_hint(key_sent)})"
