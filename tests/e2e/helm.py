"""What the Helm modules on the real node share (test_real_node_helm.py,
test_real_node_helm_uninstall.py and test_real_node_helm_uninstalled.py, in one lane with its
own real node: tests/lanes.py): ``helm`` with a private home, ``install``/``uninstall`` of
charts/egpu with the local egpu image and the webhook's caBundle (nothing else unless asked),
and ``UninstallUnderWay``: a ``helm uninstall --wait`` that runs while other tests do.
"""

from __future__ import annotations

import base64
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devcluster import build as devbuild
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

CHART = inst.REPO / "charts" / "egpu"
RELEASE = "egpu"
HELM_TIMEOUT_S = 300
UNINSTALL_TIMEOUT = "10m"  # docs/operating.md: the kubelet keeps a stopped plugin's capacity 5 min
UNINSTALL_TIMEOUT_S = 630


def _helm_argv_env(cluster: RealCluster, home: Path, *args: str
                   ) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "HELM_CACHE_HOME": str(home / "c"),
           "HELM_CONFIG_HOME": str(home / "f"), "HELM_DATA_HOME": str(home / "d")}
    return [str(devbuild.binary_path("helm")), *args], env


def helm(cluster: RealCluster, home: Path, *args: str) -> str:
    """``helm ARGS`` against the cluster (HELM_*_HOME under ``home``); its stdout. Raises
    AssertionError with helm's output when it fails."""
    argv, env = _helm_argv_env(cluster, home, *args)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                          timeout=UNINSTALL_TIMEOUT_S if args[:1] == ("uninstall",)
                          else HELM_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {proc.stdout}{proc.stderr}")
    return proc.stdout


def install(cluster: RealCluster, work: Path, *sets: str) -> None:
    """``helm install`` of the chart (after removing a kustomize install, if any), every part
    Ready, the share namespace there. ``sets``: more ``--set`` values."""
    kustomize = inst.kustomization(work / "kustomize")
    cluster.kubectl("delete", "-k", str(kustomize), "--ignore-not-found", "--wait=true",
                    "--timeout=180s", timeout=200)
    ca = inst.create_webhook_tls(cluster, work)
    more = [arg for value in sets for arg in ("--set", value)]
    helm(cluster, work, "install", RELEASE, str(CHART), "--namespace", inst.NAMESPACE,
         "--set", "namespace.create=false",
         *(arg for part, image in inst.helm_image_values().items() for key, value in image.items()
           for arg in ("--set", f"images.{part}.{key}={value}")),
         "--set", f"webhook.caBundle={base64.b64encode(ca.read_bytes()).decode()}", *more)
    inst.wait_installed(cluster)
    cluster.ensure_namespace(inst.SHARE_NS)


def uninstall_if_installed(cluster: RealCluster, work: Path) -> None:
    """The module's pods deleted, then ``helm uninstall --wait`` if the release is there (a
    failed uninstall raises: the hook Job's bug shows)."""
    # kubectl's own timeout, so that a slow deletion is reported by the next module's checks
    cluster.kubectl("-n", inst.SHARE_NS, "delete", "pods", "-l", "egpu-e2e=real-node",
                    "--wait=true", "--timeout=110s", check=False, timeout=130)
    if RELEASE in helm(cluster, work, "list", "--namespace", inst.NAMESPACE, "-q").split():
        helm(cluster, work, "uninstall", RELEASE, "--namespace", inst.NAMESPACE, "--wait",
             "--timeout", UNINSTALL_TIMEOUT)


EGPU_NODE_FOLDERS = ("/var/run/egpu", "/var/run/egpu-node", "/usr/local/egpu")
UNINSTALL_ARGS = ("uninstall", RELEASE, "--namespace", inst.NAMESPACE, "--wait", "--timeout",
                  UNINSTALL_TIMEOUT)


@dataclass
class UninstallUnderWay:
    """docs/operating.md's ``helm uninstall --wait``, begun by one test and checked by a later
    one, so that the 5 min its hook Job waits for the kubelet (to drop the stopped device
    plugin's capacity) overlap other tests: test_real_node_helm_uninstall.py begins it,
    test_real_node_helm_uninstalled.py checks what it left (tests/lanes.py runs that module
    last in a serial run). ``survivor_uid``: the share pod the first test started, which the
    uninstall must leave running."""

    cluster: RealCluster
    work: Path
    survivor_uid: str = ""
    process: subprocess.Popen[str] | None = None
    checked: bool = False  # a test read ``outcome()``

    def begin(self) -> None:
        """Start ``helm uninstall`` in the background (its output in ``work/uninstall.log``)."""
        argv, env = _helm_argv_env(self.cluster, self.work, *UNINSTALL_ARGS)
        with (self.work / "uninstall.log").open("w") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            text=True, env=env)

    def outcome(self) -> tuple[int, str]:
        """Wait for the uninstall (UNINSTALL_TIMEOUT_S from this call at most, then it is
        killed: helm's own timeout is shorter); its exit status and output. Raises
        AssertionError when it never began."""
        if self.process is None:
            raise AssertionError("helm uninstall never began: test_real_node_helm_uninstall.py "
                                 "failed or did not run before it")
        self.checked = True
        try:
            self.process.wait(timeout=UNINSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.process.returncode, (self.work / "uninstall.log").read_text()

    def end(self) -> None:
        """At the session's end: an uninstall that no test checked (the begin module run
        without the checker) is waited for and fails the teardown when it failed; what a
        failed test left is removed (``uninstall_if_installed``)."""
        try:
            if self.process is not None and not self.checked:
                status, output = self.outcome()
                if status != 0:
                    raise AssertionError(f"helm uninstall failed ({status}): {output}")
        finally:
            uninstall_if_installed(self.cluster, self.work)
