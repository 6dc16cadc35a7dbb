"""optuna-dashboard on a study's storage, served from a thread on 127.0.0.1 (a free port by default)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

HOST = "127.0.0.1"


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """The dashboard's page loads several API calls at once; one thread each keeps it responsive."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr: it would break the run's progress line."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
        return


@dataclass
class DashboardServer:
    """A running dashboard; `stop()` shuts it down."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        """Where to point a browser."""
        return f"http://{HOST}:{self.server.server_port}/dashboard/"

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self.server.server_port

    def stop(self) -> None:
        """Stop serving and free the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_dashboard(storage: str, port: int = 0) -> DashboardServer:
    """Serve optuna-dashboard for `storage` (an SQLAlchemy URL) in a daemon thread; port 0 = a free one."""
    import optuna_dashboard

    app = optuna_dashboard.wsgi(storage)
    server = make_server(HOST, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="optuna-dashboard", daemon=True)
    thread.start()
    return DashboardServer(server=server, thread=thread)
