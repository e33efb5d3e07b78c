"""``helm uninstall`` on the real node (docs/operating.md, "Removing egpu"), after
test_real_node_helm.py in its lane (tests/lanes.py), on a fresh install with the chart's
default values: it waits for the kubelet to drop the stopped device plugin's capacity
(5 min), which the other lanes' work overlaps.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster
from tests.e2e.helm import RELEASE, UNINSTALL_TIMEOUT, install, uninstall_if_installed
from tests.e2e.helm import helm as _helm

pytestmark = pytest.mark.e2e

EGPU_NODE_FOLDERS = ("/var/run/egpu", "/var/run/egpu-node", "/usr/local/egpu")


@pytest.fixture(scope="module")
def helm_installed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[RealCluster]:
    """The chart with its default values (the uninstall Job waits for the kubelets)."""
    work = tmp_path_factory.mktemp("helm")
    install(real_cluster, work)
    yield real_cluster
    uninstall_if_installed(real_cluster, work)  # when the test failed before its uninstall


def test_helm_uninstall_takes_egpu_off_the_node_and_leaves_share_pods_running(
        helm_installed: RealCluster, tmp_path: Path) -> None:
    """docs/operating.md's `helm uninstall` with a share pod running. Bugs caught: the node kept
    egpu's annotations, a 0 egpu.io/gpu capacity, /var/run/cdi/egpu.json, /var/run/egpu/*,
    /var/run/egpu-node/* and /usr/local/egpu after uninstall; an uninstall that killed the
    user's running pods."""
    cluster = helm_installed
    pod = inst.share_pod("survivor", inst.SHARE_NS,
                         cluster.inputs / "pods" / "01-vllm-online.yaml", inst.REAL_LABEL)
    pod["spec"]["containers"][0]["command"] = ["sleep", "3600"]
    inst.apply_json(cluster, pod)
    cluster.kubectl("-n", inst.SHARE_NS, "wait", "pod/survivor", "--for=condition=Ready",
                    "--timeout=120s", timeout=130)
    before = inst.get_json(cluster, "pod", "-n", inst.SHARE_NS, "survivor")
    node_before = inst.get_json(cluster, "node", cluster.node.name)
    assert "egpu.io/inventory" in node_before["metadata"]["annotations"]
    assert int(node_before["status"]["capacity"]["egpu.io/gpu"]) > 0
    assert cluster.node.run("ls", "-A", *EGPU_NODE_FOLDERS).split()  # something to remove

    try:
        _helm(cluster, tmp_path, "uninstall", RELEASE, "--namespace", inst.NAMESPACE, "--wait",
              "--timeout", UNINSTALL_TIMEOUT)
    except AssertionError as exc:  # say why: the Job's log and what is left
        raise AssertionError(f"{exc}\nthe hook Job's log:\n" + cluster.kubectl(
            "-n", inst.NAMESPACE, "logs", "job/egpu-uninstall", "--tail=40", check=False) +
            cluster.kubectl("-n", inst.NAMESPACE, "get", "pods,daemonsets,jobs", "-o", "wide",
                            check=False)) from None

    node = inst.get_json(cluster, "node", cluster.node.name)
    left = sorted(k for k in node["metadata"].get("annotations") or {} if k.startswith("egpu.io/"))
    assert left == [], f"egpu annotations left on the node: {left}"
    for part in ("capacity", "allocatable"):
        assert "egpu.io/gpu" not in node["status"][part], node["status"][part]
    listing = cluster.node.run("sh", "-c", "ls -A " + " ".join(EGPU_NODE_FOLDERS) +
                               " 2>/dev/null; ls /var/run/cdi 2>/dev/null", check=False)
    assert not [line for line in listing.split() if line and not line.endswith(":")
                and not line.startswith("nvidia")], f"left on the node:\n{listing}"
    jobs = cluster.kubectl("-n", inst.NAMESPACE, "get", "jobs,serviceaccounts", "-o", "name",
                           check=False)
    assert "egpu-uninstall" not in jobs, jobs
    after = inst.get_json(cluster, "pod", "-n", inst.SHARE_NS, "survivor")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["phase"] == "Running"
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
