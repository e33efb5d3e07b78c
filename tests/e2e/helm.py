"""What the Helm modules on the real node share (test_real_node_helm.py,
test_real_node_helm_uninstall.py, one after the other in one lane with its own real node:
tests/lanes.py): ``helm`` with a private home, and ``install``/``uninstall`` of charts/egpu
with the local egpu image and the webhook's caBundle (nothing else unless asked).
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

from devcluster import build as devbuild
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

CHART = inst.REPO / "charts" / "egpu"
RELEASE = "egpu"
HELM_TIMEOUT_S = 300
UNINSTALL_TIMEOUT = "10m"  # docs/operating.md: the kubelet keeps a stopped plugin's capacity 5 min
UNINSTALL_TIMEOUT_S = 630


def helm(cluster: RealCluster, home: Path, *args: str) -> str:
    """``helm ARGS`` against the cluster (HELM_*_HOME under ``home``); its stdout. Raises
    AssertionError with helm's output when it fails."""
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "HELM_CACHE_HOME": str(home / "c"),
           "HELM_CONFIG_HOME": str(home / "f"), "HELM_DATA_HOME": str(home / "d")}
    proc = subprocess.run([str(devbuild.binary_path("helm")), *args], capture_output=True,
                          text=True, env=env, timeout=UNINSTALL_TIMEOUT_S
                          if args[:1] == ("uninstall",) else HELM_TIMEOUT_S)
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
