"""The agent's HTTP listener: ``/metrics`` (Prometheus text format, the default registry) and
``/healthz`` (200 once the agent serves its node: its readiness; 503 before)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log: Prometheus and the kubelet's probe call every few seconds."""


def serve(port: int, ready: Callable[[], bool], host: str = "") -> None:
    """Serve /metrics and /healthz on ``port`` from a daemon thread."""
    metrics = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            ok = ready()
            start("200 OK" if ok else "503 Service Unavailable",
                  [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"not serving the node yet\n"]
        return metrics(environ, start)  # type: ignore[no-any-return]

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True, name="egpu-metrics").start()
