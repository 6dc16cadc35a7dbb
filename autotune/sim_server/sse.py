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
from collections.abc import Sequence
from typing import Any

from autotune.sim_server.httpd import HttpConnection
from autotune.sim_server.service import Pending, SimService

TOKEN_TEXT = " tok"
TOKEN_JSON = json.dumps(TOKEN_TEXT)


class ChunkWriter:
    """Pre-rendered SSE chunks for one choice of a response (JSON built once, token chunks by concatenation).

    `state` is the engine request behind choice `index`; the choices of one response share `response_id`
    and `created` (n > 1)."""

    def __init__(
        self,
        model: str,
        chat: bool,
        state: Pending,
        index: int = 0,
        response_id: str | None = None,
        created: int | None = None,
    ) -> None:
        self.model = model
        self.chat = chat
        self.state = state
        self.index = index
        self.created = int(time.time()) if created is None else created
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.id = response_id or response_id_of(chat, state.rid)
        self.head = json.dumps(
            {"id": self.id, "object": kind, "created": self.created, "model": model}, separators=(",", ":")
        )[:-1]
        text_key = '"delta":{"content":' if chat else '"text":'
        close = "}" if chat else ""
        self._token = f'data: {self.head},"choices":[{{"index":{index},{text_key}{TOKEN_JSON}{close}'
        self.tail_open = ',"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}\n\n'
        self.role_pending = chat  # chat streams open each choice with the assistant role

    def role_chunk(self) -> str:
        """The first chat chunk of a choice: the assistant role with empty content, as vLLM sends it."""
        self.role_pending = False
        delta = '"delta":{"role":"assistant","content":""}'
        return (
            f'data: {self.head},"choices":[{{"index":{self.index},{delta},'
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

    def usage_chunk(self, usage: dict[str, int]) -> str:
        """The `include_usage` chunk: no choices, the token counts."""
        return f'data: {self.head},"choices":[],"usage":{json.dumps(usage, separators=(",", ":"))}}}\n\n'


def response_id_of(chat: bool, rid: str) -> str:
    """The id of a response to request `rid`, prefixed as vLLM prefixes it (serving_completion.py)."""
    return ("chatcmpl-" if chat else "cmpl-") + rid


def usage_of(states: Sequence[Pending]) -> dict[str, int]:
    """OpenAI usage block of a response: each prompt once (a batch's several), the completion tokens of
    every choice."""
    p = sum(s.prompt_tokens for s in states if not s.further_choice)
    c = sum(s.tokens for s in states)
    return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}


class SseStream:
    """A streaming response: after each engine step the engine loop writes its new token chunks (coalesced
    into one chunked-body write) straight to the connection, and usage and [DONE] once every choice ended."""

    def __init__(
        self,
        service: SimService,
        conn: HttpConnection,
        writers: Sequence[ChunkWriter],
        include_usage: bool,
        continuous_usage: bool = False,
    ) -> None:
        self.service = service
        self.conn = conn
        self.writers = {w.state.key: w for w in writers}
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self._open = len(self.writers)  # choices not finished yet

    def on_tokens(self, state: Pending) -> None:
        """Write the choice's tokens not written yet, then the end once all finished (Pending.listener)."""
        if self.conn.paused or state.listener is None:
            return  # a slow reader: `resume` writes them, together with those that come meanwhile
        writer = self.writers[state.key]
        ready = state.tokens - state.delivered
        parts: list[str] = []
        if ready:
            if writer.role_pending:
                parts.append(writer.role_chunk())
            parts.append(writer.tokens(ready, state.finished, self.continuous_usage))
            state.delivered = state.tokens
        if state.finished:
            state.listener = None  # no cycle left (state -> stream -> writer -> state) for the GC to find
            self._open -= 1
            if not self._open:
                if self.include_usage:
                    parts.append(writer.usage_chunk(usage_of([w.state for w in self.writers.values()])))
                parts.append("data: [DONE]\n\n")
        if not parts:
            return
        if ready and state.first_sent is None:
            state.first_sent = time.perf_counter()  # just before the write: asyncio sends at once if it can
        self.conn.send_chunk("".join(parts).encode(), last=not self._open)

    def resume(self) -> None:
        """The client caught up: write what was held back."""
        for writer in list(self.writers.values()):
            self.on_tokens(writer.state)

    def lost(self) -> None:
        """The client disconnected mid-stream: abort the requests, as vLLM does."""
        self.service.abort([w.state for w in self.writers.values()])


class PlainAnswer:
    """A non-streaming response: its JSON body is written when the engine finished every choice."""

    def __init__(
        self,
        service: SimService,
        conn: HttpConnection,
        writers: Sequence[ChunkWriter],
        headers: dict[str, str],
    ):
        self.service = service
        self.conn = conn
        self.writers = list(writers)
        self.headers = headers

    def on_tokens(self, state: Pending) -> None:
        """Answer once every choice finished (Pending.listener)."""
        if state.finished:
            state.listener = None
            state.delivered = state.tokens
            if all(w.state.listener is None for w in self.writers):  # the last choice: answer once
                self.conn.respond_json(200, full_response(self.writers), self.headers)

    def resume(self) -> None:
        """Nothing is held back: the body is written whole."""

    def lost(self) -> None:
        """The client gave up waiting: abort the requests (vLLM's 499, which nobody reads)."""
        self.service.abort([w.state for w in self.writers])


class NothingPending:
    """An exchange with nothing left to write: a hung engine's /health (no answer, until the client gives
    up), or a response written whole at once."""

    def resume(self) -> None:
        """Nothing to write."""

    def lost(self) -> None:
        """Nothing to clean up."""


def full_response(writers: Sequence[ChunkWriter]) -> dict[str, Any]:
    """The non-streaming response body: one choice per writer."""
    first = writers[0]
    choices = []
    for w in writers:
        text, reason = TOKEN_TEXT * w.state.tokens, w.state.finish_reason
        choice: dict[str, Any] = {"index": w.index}
        if first.chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=reason, stop_reason=None)
        if not first.chat:
            choice["prompt_logprobs"] = None
        choices.append(choice)
    kind = "chat.completion" if first.chat else "text_completion"
    return {"id": first.id, "object": kind, "created": first.created, "model": first.model,
            "choices": choices, "usage": usage_of([w.state for w in writers])}  # fmt: skip
