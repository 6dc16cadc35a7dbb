"""CORS as vLLM's server answers it by default: Starlette's CORSMiddleware allowing every origin, method
and header without credentials (--allowed-origins, --allowed-methods, --allowed-headers all '["*"]',
--allow-credentials off: vllm/entrypoints/openai/cli_args.py; the middleware is added in
vllm/entrypoints/openai/api_server.py, inside the API-key check, so a 401 carries no CORS headers).

A request without an Origin header is left alone. An OPTIONS request with an Origin and an
Access-Control-Request-Method is a preflight, answered here and never routed; any other request with an
Origin is routed and its response says that every origin may read it.
"""

from __future__ import annotations

from collections.abc import Mapping

# What "*" in allow_methods stands for (starlette/middleware/cors.py ALL_METHODS)
ALL_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
MAX_AGE_S = 600  # CORSMiddleware's default max_age
ANY_ORIGIN = {"access-control-allow-origin": "*"}


def is_preflight(method: str, headers: Mapping[str, str]) -> bool:
    """Whether a request (lower-case header names) is a CORS preflight."""
    return method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers


def preflight(headers: Mapping[str, str]) -> tuple[int, bytes, dict[str, str]]:
    """(status, plain-text body, headers) of CORSMiddleware's answer to a preflight: every origin and
    header is allowed (the requested headers are mirrored back), a method outside ALL_METHODS is not."""
    fields = {
        **ANY_ORIGIN,
        "access-control-allow-methods": ", ".join(ALL_METHODS),
        "access-control-max-age": str(MAX_AGE_S),
    }
    if "access-control-request-headers" in headers:
        fields["access-control-allow-headers"] = headers["access-control-request-headers"]
    if headers["access-control-request-method"] not in ALL_METHODS:
        return 400, b"Disallowed CORS method", fields
    return 200, b"OK", fields


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The CORS headers of the response to a routed request (none without an Origin). With a cookie the
    origin is named, not "*", as CORSMiddleware does (a browser refuses "*" for a credentialed request)."""
    origin = headers.get("origin")
    if origin is None:
        return {}
    if "cookie" in headers:
        return {"access-control-allow-origin": origin, "vary": "Origin"}
    return dict(ANY_ORIGIN)
