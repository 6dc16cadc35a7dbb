"""The HTTP/1.1 messages of sim-server's server (autotune/sim_server/httpd.py): a parsed request, the
limits a request must keep, and the bytes of responses (status line and headers, chunks, JSON bodies,
the errors that close a connection: 400 for bytes that are not HTTP, vLLM's JSON error for 413/408)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

MAX_BODY_BYTES = 16 * 1024**2  # a 128k-token prompt as JSON token ids is ~1 MiB
READ_TIMEOUT_S = 30.0  # from a request's first byte to its last


@dataclass(frozen=True)
class HttpLimits:
    """What one request may cost the server before it is refused."""

    max_body_bytes: int = MAX_BODY_BYTES
    read_timeout_s: float = READ_TIMEOUT_S


@dataclass
class HttpRequest:
    """One parsed request, body included."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    read_at: float  # perf_counter when its first bytes were read off the socket
    keep_alive: bool


@functools.cache
def reason(status: int) -> str:
    """The reason phrase ("OK", "Not Found"; "" for codes outside the standard, like 499)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def response_head(status: int, fields: dict[str, str], close: bool) -> bytes:
    """The status line and headers (with `connection: close` when the connection's last response)."""
    lines = [f"HTTP/1.1 {status} {reason(status)}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in fields.items()]
    if close:
        lines.append("connection: close\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def chunk(data: bytes, last: bool) -> bytes:
    """One chunk of a chunked body ('' writes none); `last` also ends the body."""
    frame = b"%x\r\n%s\r\n" % (len(data), data) if data else b""
    return frame + b"0\r\n\r\n" if last else frame


def json_body(content: Any) -> bytes:
    """A JSON body, compact as Starlette's JSONResponse renders it."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def bad_request(exc: Exception) -> bytes:
    """The whole plain 400 answer to bytes that are not HTTP (the connection then closes)."""
    body = f"Invalid HTTP request: {exc}".encode()
    return (
        b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )


def refusal(status: int, message: str) -> bytes:
    """The whole answer to a request that cannot be read (413, 408): vLLM's JSON error, then close."""
    error = {
        "error": {
            "message": message,
            "type": reason(status).replace(" ", ""),
            "param": None,
            "code": status,
        }
    }
    body = json.dumps(error, separators=(",", ":")).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, reason(status).encode(), len(body), body)
    )
