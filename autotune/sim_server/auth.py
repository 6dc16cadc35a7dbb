"""API keys on the sim-server, as vLLM's API server checks them (AuthenticationMiddleware in
vllm/entrypoints/openai/api_server.py, 0.11): with keys set, a request whose path starts with /v1 needs
`Authorization: Bearer KEY` with one of them, else 401 `{"error": "Unauthorized"}` before any routing;
OPTIONS requests and every other path (/health, /metrics, /version) stay open. (Later vLLM
releases guard /v2, /inference and /cohere too; the sim-server serves none of them.)

The keys are `--api-key`'s (it takes several, for rotation), else VLLM_API_KEY's; empty ones count as
none. Only their SHA-256 digests are kept, and a presented key is compared with each in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence

from autotune.core.api_keys import SERVER_KEY_VAR

GUARDED_PREFIX = "/v1"
UNAUTHORIZED = {"error": "Unauthorized"}


def served_api_keys(flag_keys: Sequence[str] | None) -> list[str]:
    """The keys a server requires: `--api-key`'s when given (they take precedence, as in vLLM), else
    VLLM_API_KEY's; [] when authentication is off."""
    return [key for key in (flag_keys or [os.environ.get(SERVER_KEY_VAR, "")]) if key]


class ApiKeyCheck:
    """Whether a request may pass: holds the keys' digests only, never the keys."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = [_digest(key) for key in keys]

    def __bool__(self) -> bool:
        """True when keys are required."""
        return bool(self._digests)

    def allows(self, method: str, path: str, headers: Mapping[str, str]) -> bool:
        """True when the request needs no key (no keys set, OPTIONS, a path outside /v1) or bears one.

        `headers` has lower-case names (as autotune.sim_server.httpd parses them).
        """
        if not self._digests or method == "OPTIONS" or not path.startswith(GUARDED_PREFIX):
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        presented = _digest(token)
        # Every digest is compared (no early exit): the time taken says nothing about which key matched.
        matches = [hmac.compare_digest(presented, digest) for digest in self._digests]
        return any(matches)


def _digest(key: str) -> bytes:
    """Equal-length digests keep compare_digest from leaking a key's length."""
    return hashlib.sha256(key.encode("utf-8")).digest()
