"""The agent's HTTP listener: ``/metrics`` (Prometheus text format, the default registry),
``/healthz`` (200 once the agent serves its node: its readiness; 503 before) and
``/usage-history`` (its recent window of the shares' use, JSON: node_agent/metrics/window.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log: Prometheus and the kubelet's probe call every few seconds."""


def serve(port: int, ready: Callable[[], bool], host: str = "",
          usage_history: Callable[[], dict[str, Any]] | None = None) -> None:
    """Serve /metrics, /healthz and (given ``usage_history``) /usage-history on ``port`` from a
    daemon thread."""
    metrics = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/usage-history" and usage_history is not None:
            start("200 OK", [("Content-Type", "application/json")])
            return [json.dumps(usage_history(), separators=(",", ":")).encode()]
        if environ.get("PATH_INFO") == "/healthz":
            ok = ready()
            start("200 OK" if ok else "503 Service Unavailable",
                  [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"not serving the node yet\n"]
        return metrics(environ, start)  # type: ignore[no-any-return]

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True, name="egpu-metrics").start()
