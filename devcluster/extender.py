"""The egpu scheduler extender as a child process, for tests and benchmarks on the dev cluster.

``ExtenderProcess(kubeconfig, config, log)`` picks a free port on 127.0.0.1; ``start()`` runs
``python -m scheduler.main`` there and waits for ``/healthz``; ``kill()`` sends SIGKILL (a
crash: nothing of its memory survives); ``stop()`` terminates it. Point the dev cluster's
kube-scheduler at ``url`` with ``devcluster.set_extender``. (A subprocess, supervised by
devcluster.supervisor: devcluster imports no egpu part.)
"""

from __future__ import annotations

import sys
from pathlib import Path

from devcluster.net import HOST, free_port, http_ok
from devcluster.supervisor import Child

REPO = Path(__file__).resolve().parents[1]


class ExtenderProcess:
    """One extender on 127.0.0.1:<free port>, logging to ``log``; see the module docstring.
    As deployed: the verbs on ``port``, /metrics and /healthz only on ``metrics_port``."""

    def __init__(self, kubeconfig: str, config: Path, log: Path) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.kubeconfig, self.config, self.log = kubeconfig, config, log
        self.process = Child("extender", [
            sys.executable, "-m", "scheduler.main", "--kubeconfig", kubeconfig,
            "--host", HOST, "--port", str(self.port),
            "--metrics-host", HOST, "--metrics-port", str(self.metrics_port),
            "--config", str(config)], log, cwd=REPO)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, the extender's urlPrefix."""
        return f"http://{HOST}:{self.port}"

    def start(self, timeout_s: float = 120) -> None:
        """Start it and wait for /healthz (the readiness probe's, on the metrics port).
        Raises DevClusterError (quoting its log) when it exits or times out."""
        healthz = f"http://{HOST}:{self.metrics_port}/healthz"
        self.process.start(lambda: http_ok(healthz), f"GET {healthz}", timeout_s, 0.25)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.process.kill()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        self.process.stop()
