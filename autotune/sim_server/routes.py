"""The sim-server's routes: vLLM's OpenAI-compatible endpoints over autotune.sim_server.httpd.

/v1/completions and /v1/chat/completions (streaming and plain), /health (and /ping), /v1/models,
/version and /metrics (vLLM's metric names); unknown paths and methods answer FastAPI's JSON 404 / 405, as
vLLM's server does. With API keys (--api-key, VLLM_API_KEY), a /v1 request without one gets 401 before
any of that (autotune.sim_server.auth).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from autotune.core.config import VLLM_RELEASE
from autotune.sim_server import cors
from autotune.sim_server.auth import UNAUTHORIZED
from autotune.sim_server.exposition import METRICS_CONTENT_TYPE, render_metrics
from autotune.sim_server.http_messages import HttpRequest
from autotune.sim_server.httpd import HttpConnection
from autotune.sim_server.parsing import BadRequest, error_body
from autotune.sim_server.service import SimService
from autotune.sim_server.sse import ChunkWriter, NothingPending, PlainAnswer, SseStream, response_id_of

VLLM_VERSION = f"{VLLM_RELEASE}+autotune.sim"  # the vLLM version whose behaviour the simulator follows
SSE = "text/event-stream; charset=utf-8"
Endpoint = Callable[[HttpConnection, HttpRequest], None]


class SimRoutes:
    """vLLM's routes. Each request is answered (or handed to the engine) as soon as httpd dispatches it."""

    def __init__(self, service: SimService) -> None:
        self.service = service
        gets: dict[str, Endpoint] = {
            "/health": self.health,
            "/v1/models": self.models,
            "/version": self.version,
            "/metrics": self.metrics,
        }
        if service.options.debug_timings:
            gets["/debug/requests"] = self.debug_requests
        self._routes: dict[str, tuple[tuple[str, ...], Endpoint]] = {
            path: (("GET", "HEAD"), endpoint) for path, endpoint in gets.items()
        }
        # vLLM's /ping (for SageMaker) is its /health, on GET and POST (vllm/entrypoints/openai/api_server.py)
        self._routes["/ping"] = (("GET", "POST"), self.health)
        self._routes["/v1/completions"] = (("POST",), self.completions)
        self._routes["/v1/chat/completions"] = (("POST",), self.chat_completions)

    def handle(self, conn: HttpConnection, request: HttpRequest) -> None:
        """Route one request: 401 without a required API key (vLLM checks it before routing, so an
        unknown /v1 path gets 401 too), then CORS (a preflight is answered, autotune.sim_server.cors),
        404 for an unknown path, 405 for a method the path does not take."""
        if not self.service.options.api_keys.allows(request.method, request.path, request.headers):
            conn.respond_json(401, UNAUTHORIZED)
            return
        if cors.is_preflight(request.method, request.headers):
            status, body, fields = cors.preflight(request.headers)
            conn.respond(status, body, "text/plain; charset=utf-8", fields)
            return
        conn.response_fields = cors.response_headers(request.headers)
        route = self._routes.get(request.path)
        if route is None:
            conn.respond_json(404, {"detail": "Not Found"})  # FastAPI's answer, as vLLM's server gives
            return
        methods, endpoint = route
        if request.method not in methods:
            conn.respond_json(405, {"detail": "Method Not Allowed"}, {"allow": ", ".join(methods)})
            return
        endpoint(conn, request)

    def completions(self, conn: HttpConnection, request: HttpRequest) -> None:
        """POST /v1/completions."""
        self._completion(conn, request, chat=False)

    def chat_completions(self, conn: HttpConnection, request: HttpRequest) -> None:
        """POST /v1/chat/completions."""
        self._completion(conn, request, chat=True)

    def _completion(self, conn: HttpConnection, request: HttpRequest, chat: bool) -> None:
        """Validate, submit to the engine, and attach the response the engine loop will write to."""
        received = time.perf_counter()
        service = self.service
        # vLLM's validate_json_request (vllm/entrypoints/openai/api_server.py): a form or text body is
        # refused before it is read, whatever it holds
        media_type = request.headers.get("content-type", "").lower().split(";", 1)[0].strip()
        if media_type != "application/json":
            message = "[\"Unsupported Media Type: Only 'application/json' is allowed\"]"
            conn.respond_json(400, error_body(message, 400, "Bad Request"))
            return
        try:
            body = json.loads(request.body)
        except ValueError as exc:
            conn.respond_json(400, error_body(f"Invalid JSON body: {exc}"))
            return
        except RecursionError:
            conn.respond_json(400, error_body("Invalid JSON body: nested too deeply"))
            return
        try:
            batch = service.parse(body, chat)
        except BadRequest as exc:
            error = error_body(str(exc), exc.status, exc.kind)
            if exc.in_stream:
                # as the stream generators of vLLM's serving_completion.py / serving_chat.py end: the error
                # (create_streaming_error_response, json.dumps' spacing), then [DONE]
                conn.start_stream(SSE, {}, NothingPending())
                conn.send_chunk(f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode(), last=True)
            else:
                conn.respond_json(exc.status, error)
            return
        # a batch's prompts: one request each, their choices in order (index = prompt x n + choice), the
        # client's id suffixed by the prompt's position as vLLM's serving_completion.py does
        rid = request.headers.get("x-request-id")
        states = []
        for i, parsed in enumerate(batch):
            own = rid if rid is None or len(batch) == 1 else f"{rid}-{i}"
            states += service.submit_choices(parsed, own, request.read_at)
        first, parsed = states[0], batch[0]
        response_id = None if rid is None or len(batch) == 1 else response_id_of(chat, rid)
        writers = [ChunkWriter(service.model_name, chat, first, response_id=response_id)]
        for index, state in enumerate(states[1:], start=1):  # choices share the id and time
            writers.append(
                ChunkWriter(service.model_name, chat, state, index, writers[0].id, writers[0].created)
            )
        for state in states:
            state.received = received
            state.read = request.read_at
        headers = {"x-request-id": rid or first.rid}
        response: SseStream | PlainAnswer
        if parsed.stream:
            response = SseStream(service, conn, writers, parsed.include_usage, parsed.continuous_usage)
            conn.start_stream(SSE, headers, response)
        else:
            response = PlainAnswer(service, conn, writers, headers)
            conn.hold(response)
        for state in states:
            state.listener = response.on_tokens

    def health(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /health (and /ping): 200, or no answer at all while the engine is hung (as a stuck vLLM)."""
        if self.service.hung:
            conn.hold(NothingPending())
            return
        conn.respond(200)

    def models(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /v1/models: a card per served name (vllm/entrypoints/openai/serving_models.py)."""
        service = self.service
        cards = [
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": service.engine.config.model,
                "parent": None,
                "max_model_len": service.max_model_len,
                "permission": [],
            }
            for name in service.parser.names
        ]
        conn.respond_json(200, {"object": "list", "data": cards})

    def version(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /version."""
        conn.respond_json(200, {"version": VLLM_VERSION})

    def metrics(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /metrics: Prometheus text with vLLM's metric names."""
        conn.respond(200, render_metrics(self.service.registry), METRICS_CONTENT_TYPE)

    def debug_requests(self, conn: HttpConnection, _: HttpRequest) -> None:
        """GET /debug/requests (--debug-timings): exact server-side timings of finished requests."""
        conn.respond_json(200, {"requests": self.service.debug_rows()})
