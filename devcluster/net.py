"""Local endpoints: free ports on 127.0.0.1 and plain HTTP(S) GETs, the readiness probes of
the processes the dev cluster, the demo, the benchmarks and the tests start."""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ssl_context(ca: Path | str, cert: Path | str | None = None,
                key: Path | str | None = None) -> ssl.SSLContext:
    """A client context that trusts ``ca`` (and presents ``cert``/``key`` when given)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert and key:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def insecure_context() -> ssl.SSLContext:
    """A client context that verifies nothing (the control plane's self-signed /healthz)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_get(url: str, context: ssl.SSLContext | None = None,
             timeout: float = 3.0) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error status is returned, not raised. Raises OSError
    when nothing answers (refused, TLS, timeout)."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def http_ok(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    """Whether a GET of ``url`` answers 200 (False when nothing answers)."""
    try:
        return http_get(url, context, timeout)[0] == 200
    except (OSError, http.client.HTTPException):
        return False
