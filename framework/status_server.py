"""A node's HTTP status endpoint (``reorg worker --metrics-port``):

    GET /metrics   Prometheus text of this process (``framework.metrics``)
    GET /healthz   200 {"status": "ok", ...} while the node's database answers
                   and its heartbeat is fresh; 503 {"status": "unhealthy",
                   "reason": ...} otherwise (one line: what is wrong)

The server binds when made, so a port in use fails ``reorg worker`` at once;
it answers from a daemon thread. The health check is the node's
(``Node.health``), set once the node exists: until then /healthz says
"starting" (503).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from framework import metrics
from framework.errors import one_line
from framework.redact import redact

log = logging.getLogger("reorg.status")

# (healthy, body): what /healthz answers.
HealthCheck = Callable[[], tuple[bool, dict[str, Any]]]


def _starting() -> tuple[bool, dict[str, Any]]:
    return False, {"status": "unhealthy", "reason": "starting: the node has not started yet"}


class StatusServer:
    def __init__(self, host: str, port: int) -> None:
        if metrics.prom is None:
            raise RuntimeError("--metrics-port needs prometheus_client: "
                               "pip install prometheus-client")
        self.health: HealthCheck = _starting
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        threading.Thread(target=self._server.serve_forever, name="status-server",
                         daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(server: StatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                prom = metrics.prom
                self._send(200, prom.CONTENT_TYPE_LATEST, prom.generate_latest(prom.REGISTRY))
            elif path == "/healthz":
                try:
                    healthy, body = server.health()
                except Exception as exc:  # the check itself broke: say so, unhealthy
                    healthy, body = False, {"status": "unhealthy",
                                            "reason": redact(f"health check failed: {one_line(exc)}")}
                self._send(200 if healthy else 503, "application/json",
                           json.dumps(body).encode() + b"\n")
            else:
                self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("%s " + format, self.address_string(), *args)

    return Handler
