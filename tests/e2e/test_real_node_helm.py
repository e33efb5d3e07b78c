"""The Helm path on the real node: ``helm install`` of charts/egpu (values: the local egpu
image and the webhook's caBundle, nothing else) reaches the same Ready state as the kustomize
install and runs the same share pod. Runs after the kustomize tests (file order): it removes
that install first, and its own at the end.
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import build as devbuild
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

CHART = inst.REPO / "charts" / "egpu"
RELEASE = "egpu"
HELM_TIMEOUT_S = 300


def _helm(cluster: RealCluster, home: Path, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "HELM_CACHE_HOME": str(home / "c"),
           "HELM_CONFIG_HOME": str(home / "f"), "HELM_DATA_HOME": str(home / "d")}
    proc = subprocess.run([str(devbuild.binary_path("helm")), *args], capture_output=True,
                          text=True, env=env, timeout=HELM_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {proc.stdout}{proc.stderr}")
    return proc.stdout


@pytest.fixture(scope="module")
def helm_installed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[RealCluster]:
    work = tmp_path_factory.mktemp("helm")
    kustomize = inst.kustomization(work / "kustomize")
    real_cluster.kubectl("delete", "-k", str(kustomize), "--ignore-not-found", "--wait=true",
                         "--timeout=180s", timeout=200)  # the kustomize install, if any
    ca = inst.create_webhook_tls(real_cluster, work)
    repo_ref, _, tag = inst.devimages.IMAGE_EGPU.rpartition(":")
    _helm(real_cluster, work, "install", RELEASE, str(CHART), "--namespace", inst.NAMESPACE,
          "--set", "namespace.create=false",
          "--set", f"images.egpu.repository={repo_ref}", "--set", f"images.egpu.tag={tag}",
          "--set", f"webhook.caBundle={base64.b64encode(ca.read_bytes()).decode()}")
    inst.wait_installed(real_cluster)
    real_cluster.ensure_namespace(inst.SHARE_NS)
    yield real_cluster
    real_cluster.kubectl("-n", inst.SHARE_NS, "delete", "pods", "-l", "egpu-e2e=real-node",
                         "--wait=true", check=False, timeout=120)
    _helm(real_cluster, work, "uninstall", RELEASE, "--namespace", inst.NAMESPACE, "--wait")


def test_helm_lint_is_clean(real_cluster: RealCluster, tmp_path: Path) -> None:
    out = _helm(real_cluster, tmp_path, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out


def test_helm_install_brings_every_part_ready_on_the_real_node(
        helm_installed: RealCluster, tmp_path: Path) -> None:
    status = _helm(helm_installed, tmp_path, "status", RELEASE, "--namespace", inst.NAMESPACE)
    assert "STATUS: deployed" in status
    pods = inst.get_json(helm_installed, "pods", "-n", inst.NAMESPACE)["items"]
    assert len(pods) == 5, [p["metadata"]["name"] for p in pods]  # 2 webhook, 2 scheduler, agent
    for pod in pods:
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready["Ready"] == "True", pod["metadata"]["name"]


def test_helm_installed_share_pod_sees_exactly_its_share(helm_installed: RealCluster) -> None:
    name = "chat-serving-helm"
    pod = inst.share_pod(name, inst.SHARE_NS,
                         helm_installed.inputs / "pods" / "01-vllm-online.yaml", inst.REAL_LABEL)
    inst.apply_json(helm_installed, pod)
    result = inst.probe_result(helm_installed, inst.SHARE_NS, name)
    live = inst.get_json(helm_installed, "pod", "-n", inst.SHARE_NS, name)
    assert live["spec"]["schedulerName"] == "egpu-scheduler"
    assert "egpu.io/allocation" in live["metadata"]["annotations"]
    assert result["total_mib"] == 24000 and result["nvml_total_mib"] == 24000, result
    assert result["alloc_free"] == 0 and result["alloc_one_more_mib"] == 2, result
