"""``helm uninstall`` on the real node (docs/operating.md, "Removing egpu"), begun here, after
test_real_node_helm.py in its lane (tests/lanes.py), on a fresh install with the chart's
default values and a share pod running. The uninstall's hook Job waits for the kubelet to
drop the stopped device plugin's capacity (5 min): the uninstall runs in the background
(``helm_uninstall``, tests/e2e/helm.py) while other tests run, and
test_real_node_helm_uninstalled.py checks what it left (in a serial run, last of all).
"""

from __future__ import annotations

import pytest

from testbed import realnode_install as inst
from tests.e2e.helm import EGPU_NODE_FOLDERS, UninstallUnderWay, install

pytestmark = pytest.mark.e2e


def test_helm_uninstall_begins_with_egpu_on_the_node_and_a_share_pod_running(
        helm_uninstall: UninstallUnderWay) -> None:
    """The state the uninstall must undo, seen before it begins: the node's egpu annotations,
    its egpu.io/gpu capacity, egpu's files on the node, and a share pod Ready (it must keep
    running). Bug caught: an install that put nothing on the node (no inventory annotation, no
    capacity, no files), on which the checks after the uninstall would pass without testing
    anything."""
    cluster, work = helm_uninstall.cluster, helm_uninstall.work
    install(cluster, work)  # the chart's default values: the uninstall waits for the kubelets
    pod = inst.share_pod("survivor", inst.SHARE_NS,
                         cluster.inputs / "pods" / "01-vllm-online.yaml", inst.REAL_LABEL)
    # checked after the kwok lane and the demos: no exit (and restart) however long they take
    pod["spec"]["containers"][0]["command"] = ["sleep", "infinity"]
    inst.apply_json(cluster, pod)
    cluster.kubectl("-n", inst.SHARE_NS, "wait", "pod/survivor", "--for=condition=Ready",
                    "--timeout=120s", timeout=130)
    before = inst.get_json(cluster, "pod", "-n", inst.SHARE_NS, "survivor")
    node_before = inst.get_json(cluster, "node", cluster.node.name)
    assert "egpu.io/inventory" in node_before["metadata"]["annotations"]
    assert int(node_before["status"]["capacity"]["egpu.io/gpu"]) > 0
    assert cluster.node.run("ls", "-A", *EGPU_NODE_FOLDERS).split()  # something to remove
    helm_uninstall.survivor_uid = before["metadata"]["uid"]
    helm_uninstall.begin()
