"""The sim-server's responses: pre-rendered SSE chunks and the streaming / plain answers.

After each engine step the engine loop calls each touched request's listener; a stream writes every
new token chunk of the step, coalesced into one chunked-body write, straight to its connection. A
client that reads too slowly pauses its own stream (transport flow control) rather than buffering.
A client that disconnects aborts its request, as in vLLM. Each generated token is the text " tok".
Chunks follow vLLM's current format: "stop_reason" and "usage" (null, or the running usage with
stream_options.continuous_usage_stats) on every chunk.
"""

from __future__ import annotations

import json
import time
from typing import Any

from autotune.sim.httpd import HttpConnection
from autotune.sim.service import Pending, SimService

TOKEN_TEXT = " tok"
TOKEN_JSON = json.dumps(TOKEN_TEXT)


class ChunkWriter:
    """Pre-rendered SSE chunks for one response (JSON built once, token chunks by concatenation)."""

    def __init__(self, model: str, chat: bool, state: Pending) -> None:
        self.model = model
        self.chat = chat
        self.state = state
        self.created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.id = ("chatcmpl-" if chat else "cmpl-") + state.rid
        self.head = json.dumps(
            {"id": self.id, "object": kind, "created": self.created, "model": model}, separators=(",", ":")
        )[:-1]
        text_key = '"delta":{"content":' if chat else '"text":'
        close = "}" if chat else ""
        self._token = f'data: {self.head},"choices":[{{"index":0,{text_key}{TOKEN_JSON}{close}'
        self.tail_open = ',"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}\n\n'

    def role_chunk(self) -> str:
        """The first chat chunk: the assistant role with empty content, as vLLM sends it."""
        return (
            f'data: {self.head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
            f'"logprobs":null,"finish_reason":null}}]}}\n\n'
        )

    def tokens(self, n: int, last: bool, continuous_usage: bool = False) -> str:
        """n token chunks; the last one carries the finish reason when `last`.

        With `continuous_usage` every chunk carries the usage so far (stream_options.continuous_usage_stats).
        """
        if continuous_usage:
            return "".join(self._usage_token(i, last and i == n) for i in range(1, n + 1))
        chunk = self._token + self.tail_open
        if not last:
            return chunk * n
        final = (
            f'{self._token},"logprobs":null,"finish_reason":"{self.state.finish_reason}",'
            '"stop_reason":null}],"usage":null}\n\n'
        )
        return chunk * (n - 1) + final

    def _usage_token(self, i: int, last: bool) -> str:
        """One token chunk with the usage after it (the i-th of the tokens not yet delivered)."""
        p, c = self.state.prompt_tokens, self.state.delivered + i
        usage = f'{{"prompt_tokens":{p},"total_tokens":{p + c},"completion_tokens":{c}}}'
        reason = f'"{self.state.finish_reason}"' if last else "null"
        return (
            f'{self._token},"logprobs":null,"finish_reason":{reason},"stop_reason":null}}],'
            f'"usage":{usage}}}\n\n'
        )

    def usage_chunk(self) -> str:
        """The `include_usage` chunk: no choices, the token counts."""
        usage = json.dumps(self.usage(), separators=(",", ":"))
        return f'data: {self.head},"choices":[],"usage":{usage}}}\n\n'

    def usage(self) -> dict[str, int]:
        """OpenAI usage block."""
        p, c = self.state.prompt_tokens, self.state.tokens
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}


class SseStream:
    """A streaming response: after each engine step the engine loop writes its new token chunks (coalesced
    into one chunked-body write) straight to the connection, and usage and [DONE] once it finishes."""

    def __init__(
        self,
        service: SimService,
        conn: HttpConnection,
        writer: ChunkWriter,
        include_usage: bool,
        continuous_usage: bool = False,
    ) -> None:
        self.service = service
        self.conn = conn
        self.writer = writer
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self._role_pending = writer.chat

    def on_tokens(self, state: Pending) -> None:
        """Write the tokens not written yet, then the end if the request finished (Pending.listener)."""
        if self.conn.paused:
            return  # a slow reader: `resume` writes them, together with those that come meanwhile
        ready = state.tokens - state.delivered
        parts: list[str] = []
        if ready:
            if self._role_pending:
                parts.append(self.writer.role_chunk())
                self._role_pending = False
            parts.append(self.writer.tokens(ready, state.finished, self.continuous_usage))
            state.delivered = state.tokens
        if state.finished:
            state.listener = None  # no cycle left (state -> stream -> writer -> state) for the GC to find
            if self.include_usage:
                parts.append(self.writer.usage_chunk())
            parts.append("data: [DONE]\n\n")
        if not parts:
            return
        if ready and state.first_sent is None:
            state.first_sent = time.perf_counter()  # just before the write: asyncio sends at once if it can
        self.conn.send_chunk("".join(parts).encode(), last=state.finished)

    def resume(self) -> None:
        """The client caught up: write what was held back."""
        self.on_tokens(self.writer.state)

    def lost(self) -> None:
        """The client disconnected mid-stream: abort the request, as vLLM does."""
        _abandon(self.service, self.writer.state)


class PlainAnswer:
    """A non-streaming response: its JSON body is written when the engine finishes the request."""

    def __init__(
        self, service: SimService, conn: HttpConnection, writer: ChunkWriter, headers: dict[str, str]
    ):
        self.service = service
        self.conn = conn
        self.writer = writer
        self.headers = headers

    def on_tokens(self, state: Pending) -> None:
        """Answer once the request finished (Pending.listener)."""
        if state.finished:
            state.listener = None
            state.delivered = state.tokens
            self.conn.respond_json(200, full_response(self.writer), self.headers)

    def resume(self) -> None:
        """Nothing is held back: the body is written whole."""

    def lost(self) -> None:
        """The client gave up waiting: abort the request (vLLM's 499, which nobody reads)."""
        _abandon(self.service, self.writer.state)


class NeverAnswered:
    """The answer of a hung engine's /health: none, until the client gives up."""

    def resume(self) -> None:
        """Nothing to write."""

    def lost(self) -> None:
        """Nothing to clean up."""


def _abandon(service: SimService, state: Pending) -> None:
    """Stop delivering to a response whose client left, and abort its request unless it finished."""
    state.listener = None
    if not state.finished:
        service.abort(state)


def full_response(writer: ChunkWriter) -> dict[str, Any]:
    """The non-streaming response body."""
    text = TOKEN_TEXT * writer.state.tokens
    reason = writer.state.finish_reason
    if writer.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                  "logprobs": None, "finish_reason": reason, "stop_reason": None}  # fmt: skip
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                  "prompt_logprobs": None}  # fmt: skip
        kind = "text_completion"
    return {"id": writer.id, "object": kind, "created": writer.created, "model": writer.model,
            "choices": [choice], "usage": writer.usage()}  # fmt: skip
