"""The egpu scheduler extender as a child process, for tests and benchmarks on the dev cluster.

``ExtenderProcess(kubeconfig, config, log)`` picks a free port on 127.0.0.1; ``start()`` runs
``python -m scheduler.main`` there and waits for ``/healthz``; ``kill()`` sends SIGKILL (a
crash: nothing of its memory survives); ``stop()`` terminates it. Point the dev cluster's
kube-scheduler at ``url`` with ``devcluster.set_extender``. (A subprocess: devcluster imports
no egpu part.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from devcluster.cluster import DevClusterError, free_port

REPO = Path(__file__).resolve().parents[1]


class ExtenderProcess:
    """One extender on 127.0.0.1:<free port>, logging to ``log``; see the module docstring.
    As deployed: the verbs on ``port``, /metrics and /healthz only on ``metrics_port``."""

    def __init__(self, kubeconfig: str, config: Path, log: Path) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.kubeconfig, self.config, self.log = kubeconfig, config, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, the extender's urlPrefix."""
        return f"http://127.0.0.1:{self.port}"

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise DevClusterError(f"extender exited ({self.proc.returncode}):\n"
                                  + self.log.read_text()[-3000:])
        try:
            healthz = f"http://127.0.0.1:{self.metrics_port}/healthz"  # the readiness probe's
            with urllib.request.urlopen(healthz, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def start(self, timeout_s: float = 120) -> None:
        """Start it and wait for /healthz. Raises DevClusterError when it exits or times out."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scheduler.main", "--kubeconfig", self.kubeconfig,
                 "--host", "127.0.0.1", "--port", str(self.port),
                 "--metrics-host", "127.0.0.1", "--metrics-port", str(self.metrics_port),
                 "--config", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if time.monotonic() > deadline:
                raise DevClusterError(
                    f"extender not healthy after {timeout_s:.0f}s; see {self.log}")
            time.sleep(0.25)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
