"""egpu-kube-scheduler as a child process beside the dev cluster's kube-scheduler, for tests and
benchmarks: kube-scheduler with egpu's plugin, EgpuShares (kube-scheduler/plugin), serving one
profile of its own.

``PluginSchedulerProcess(kubeconfig, workdir, scheduler_name, egpu_config)`` builds the binary
from this checkout when its sources changed (``devcluster.build.plugin_scheduler``) and writes
its config (``devcluster.cluster.plugin_scheduler_config``: leader election off, so it runs
beside the dev cluster's scheduler); ``start()`` runs it on 127.0.0.1:<free port> and waits for
/healthz; ``kill()`` sends SIGKILL (a crash); ``stop()`` terminates it. Pods that name
``scheduler_name`` are its own. It runs with the dev cluster's kube-scheduler's environment
(GOGC) and feature gates, so that the two compare. ``gate_holds()`` counts the pods its bind
gate has held, from its log.
"""

from __future__ import annotations

from pathlib import Path

from devcluster import build
from devcluster.cluster import plugin_scheduler_config, scheduler_env, scheduler_feature_gates
from devcluster.net import HOST, free_port, http_ok, insecure_context
from devcluster.supervisor import Child

GATE_HOLD_LOG = '"egpu bind gate held the pod"'  # kube-scheduler/plugin's log line per hold
LOG_VERBOSITY = 1  # kube-scheduler --v: the plugin's gate holds and refusals, no per-pod trace


def plugin_scheduler_command(binary: Path, config: Path, kubeconfig: str, port: int
                             ) -> list[str]:
    """egpu-kube-scheduler's command line beside the dev cluster: ``config`` (written by
    ``devcluster.cluster.plugin_scheduler_config``), the dev cluster's ``kubeconfig`` for its
    delegated authentication and authorization, /healthz and /metrics on HTTPS
    127.0.0.1:``port``, and the dev cluster's feature gates."""
    return [str(binary), f"--config={config}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", f"--bind-address={HOST}",
            f"--secure-port={port}", f"--v={LOG_VERBOSITY}", *scheduler_feature_gates()]


def healthz_url(port: int) -> str:
    """Its /healthz (HTTPS, a self-signed serving certificate: probe without verification)."""
    return f"https://{HOST}:{port}/healthz"


def healthy(port: int) -> bool:
    """Whether /healthz on ``port`` answers 200 (False while it is not listening yet)."""
    return http_ok(healthz_url(port), insecure_context())


class PluginSchedulerProcess:
    """One egpu-kube-scheduler, logging to ``workdir``/egpu-kube-scheduler.log; see the module
    docstring."""

    def __init__(self, kubeconfig: str, workdir: Path, scheduler_name: str,
                 egpu_config: Path | None = None) -> None:
        binary = build.plugin_scheduler()
        config = workdir / "egpu-kube-scheduler-config.json"
        config.write_text(plugin_scheduler_config(kubeconfig, scheduler_name, egpu_config))
        self.port = free_port()
        self.log = workdir / "egpu-kube-scheduler.log"
        self.process = Child(
            "egpu-kube-scheduler", plugin_scheduler_command(binary, config, kubeconfig, self.port),
            self.log, env=scheduler_env())  # as the dev cluster's kube-scheduler runs (GOGC, gates)

    def start(self, timeout_s: float = 60) -> None:
        """Start it and wait for /healthz. Raises DevClusterError (quoting its log) when it
        exits or times out."""
        self.process.start(lambda: healthy(self.port), f"GET {healthz_url(self.port)}",
                           timeout_s, 0.25)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.process.kill()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        self.process.stop()

    def gate_holds(self) -> int:
        """How many times its bind gate has held a pod so far (each start's log included)."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return 0
        return text.count(GATE_HOLD_LOG)
