"""The admission webhook as a child process, for the benchmarks and the e2e tests
(bench/webhook.py, bench/admission_fuzz.py, bench/cert_rotation.py, tests/e2e).

``WebhookProcess(certs, port=None, extra_args=())`` runs ``python -m webhook.main`` over TLS
on 127.0.0.1 with ``certs/tls.crt`` and ``certs/tls.key``, its output in ``log`` (default
``certs/webhook.log``); ``start()`` waits until ``ready_path`` answers 200 to a client that
trusts ``cafile`` (default ``certs/ca.crt``); ``stop()`` terminates it (SIGKILL after the grace
period), ``kill()`` is a crash; ``start()`` again serves on the same port. (A subprocess,
supervised by devcluster.supervisor: devcluster imports no egpu part.)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from devcluster.net import HOST, free_port, http_ok, ssl_context
from devcluster.supervisor import STOP_GRACE_S, Child

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 30.0


class WebhookProcess:
    """One webhook on 127.0.0.1:``port``; see the module docstring."""

    def __init__(self, certs: Path, port: int | None = None, extra_args: Sequence[str] = (),
                 log: Path | None = None, cafile: Path | None = None,
                 log_level: str = "WARNING", ready_path: str = "/healthz") -> None:
        self.certs = certs
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)
        self.log = log or certs / "webhook.log"
        self.cafile = cafile or certs / "ca.crt"
        self.ready_path = ready_path
        self.context = ssl_context(self.cafile)
        self.process = Child("webhook", [
            sys.executable, "-m", "webhook.main", "--cert", str(certs / "tls.crt"),
            "--key", str(certs / "tls.key"), "--host", HOST, "--port", str(self.port),
            "--log-level", log_level, *self.extra_args], self.log, cwd=REPO)

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has ended (None while it runs)."""
        return self.process.returncode

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start it and wait until ``ready_path`` answers 200. Raises DevClusterError
        (devcluster.supervisor.ProcessFailed, quoting its log) when it exits or times out."""
        probe = f"{self.url}{self.ready_path}"
        self.process.start(lambda: http_ok(probe, self.context, timeout=1.0), f"GET {probe}",
                           timeout_s)

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process.alive()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``."""
        self.process.stop(grace_s)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.process.kill()
