"""What ``helm uninstall`` left on the real node (docs/operating.md, "Removing egpu"): the
uninstall test_real_node_helm_uninstall.py began, which has run in the background since
(``helm_uninstall``, tests/e2e/helm.py). In the helm lane (tests/lanes.py); a serial run
takes this module last of all, so that the uninstall's 5 min wait for the kubelet overlaps
the kwok and demo lanes.
"""

from __future__ import annotations

import pytest

from testbed import realnode_install as inst
from tests.e2e.helm import EGPU_NODE_FOLDERS, UninstallUnderWay, uninstall_if_installed

pytestmark = pytest.mark.e2e


def test_helm_uninstall_takes_egpu_off_the_node_and_leaves_share_pods_running(
        helm_uninstall: UninstallUnderWay) -> None:
    """docs/operating.md's `helm uninstall` with a share pod running. Bugs caught: the node kept
    egpu's annotations, a 0 egpu.io/gpu capacity, /var/run/cdi/egpu.json, /var/run/egpu/*,
    /var/run/egpu-node/* and /usr/local/egpu after uninstall; an uninstall that killed the
    user's running pods."""
    cluster = helm_uninstall.cluster
    try:
        status, output = helm_uninstall.outcome()
        if status != 0:  # say why: the Job's log and what is left
            raise AssertionError(
                f"helm uninstall failed ({status}): {output}\nthe hook Job's log:\n"
                + cluster.kubectl("-n", inst.NAMESPACE, "logs", "job/egpu-uninstall",
                                  "--tail=40", check=False)
                + cluster.kubectl("-n", inst.NAMESPACE, "get", "pods,daemonsets,jobs", "-o",
                                  "wide", check=False))

        node = inst.get_json(cluster, "node", cluster.node.name)
        left = sorted(k for k in node["metadata"].get("annotations") or {}
                      if k.startswith("egpu.io/"))
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
        assert after["metadata"]["uid"] == helm_uninstall.survivor_uid
        assert after["status"]["phase"] == "Running"
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    finally:  # the lane's last module: its real node clean for whatever runs next there
        uninstall_if_installed(cluster, helm_uninstall.work)
