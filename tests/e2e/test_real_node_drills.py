"""Failure drills on the real node: the kubelet, the node agent and containerd restarted under
running shares, and a share whose Allocate cannot be matched (FC-05, FC-12 on the real path).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster import realnode
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

SOURCE = "01-vllm-online.yaml"
SMALL = {"egpu.io/gpu-memory": 1000, "egpu.io/gpu-cores": 5}
REGISTERED = 'Registered client" name="egpu.io/gpu"'  # the kubelet's log line


def _start_share(cluster: RealCluster, name: str) -> dict:
    pod = inst.share_pod(name, inst.SHARE_NS, cluster.inputs / "pods" / SOURCE,
                         inst.REAL_LABEL, overrides=SMALL)
    inst.apply_json(cluster, pod)
    result = inst.probe_result(cluster, inst.SHARE_NS, name)
    assert result["total_mib"] == 1000 and result["alloc_one_more_mib"] == 2, result
    return dict(inst.get_json(cluster, "pod", "-n", inst.SHARE_NS, name))


def _container_id(pod: dict) -> str:
    return str(pod["status"]["containerStatuses"][0]["containerID"])


def _node_files(cluster: RealCluster) -> set[str]:
    root = cluster.node.host_path("/var/run/egpu")
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _delete(cluster: RealCluster, *names: str) -> None:
    cluster.kubectl("-n", inst.SHARE_NS, "delete", "pod", *names, "--wait=true",
                    "--ignore-not-found", timeout=120)


def _still_running(cluster: RealCluster, pod: dict) -> None:
    name = pod["metadata"]["name"]
    now = inst.get_json(cluster, "pod", "-n", inst.SHARE_NS, name)
    assert now["status"]["phase"] == "Running", now["status"]
    assert _container_id(now) == _container_id(pod), "the share container was restarted"
    assert now["status"]["containerStatuses"][0]["restartCount"] == 0


def _slots(cluster: RealCluster) -> int:
    node = inst.get_json(cluster, "node", cluster.node.name)
    return int(node["status"]["allocatable"].get("egpu.io/gpu", "0"))


def test_kubelet_restart_keeps_running_shares_and_new_shares_still_start(
        installed: RealCluster) -> None:
    before = _start_share(installed, "drill-kubelet-old")
    files = _node_files(installed)
    realnode.restart_part(installed.info.state_dir, installed.node.name, "kubelet")
    installed.node = realnode.RealNode.load(installed.info.state_dir, installed.node.name)
    # The device plugin re-registers with the new kubelet (the node agent watches
    # kubelet.sock), and its slots come back in a status the new kubelet wrote.
    log = Path(installed.node.processes["kubelet"].log)
    installed.wait_for("the device plugin's registration with the new kubelet",
                       lambda: REGISTERED in log.read_text().rsplit("\n=== ", 1)[-1], timeout=90)
    installed.wait_for("the device plugin's slots after the kubelet restart",
                       lambda: _slots(installed) > 0, timeout=90)
    inst.wait_slots(installed)
    _still_running(installed, before)
    assert files <= _node_files(installed), "a running share lost its files"
    _start_share(installed, "drill-kubelet-new")
    _delete(installed, "drill-kubelet-old", "drill-kubelet-new")


def test_node_agent_pod_recreated_changes_no_share_and_leaks_no_files(
        installed: RealCluster) -> None:
    share = _start_share(installed, "drill-agent")
    files = _node_files(installed)
    agent = inst.get_json(installed, "pods", "-n", inst.NAMESPACE, "-l",
                          "app.kubernetes.io/name=egpu-node-agent")["items"][0]
    installed.kubectl("-n", inst.NAMESPACE, "delete", "pod", agent["metadata"]["name"],
                      "--wait=true", timeout=90)
    inst.wait_installed(installed)
    _still_running(installed, share)
    assert _node_files(installed) == files
    _delete(installed, "drill-agent")
    installed.wait_for("the deleted share's files removed",
                       lambda: not any(share["metadata"]["uid"] in f
                                       for f in _node_files(installed)), timeout=60)


def test_containerd_restart_keeps_running_share_containers(installed: RealCluster) -> None:
    share = _start_share(installed, "drill-containerd-old")
    realnode.restart_part(installed.info.state_dir, installed.node.name, "containerd")
    installed.node = realnode.RealNode.load(installed.info.state_dir, installed.node.name)
    _still_running(installed, share)
    assert _container_id(share).split("//", 1)[1] in installed.node.crictl("ps", "-q")
    _start_share(installed, "drill-containerd-new")
    _delete(installed, "drill-containerd-old", "drill-containerd-new")


def test_unmatched_allocate_is_refused_with_a_clear_event_never_run_unlimited(
        installed: RealCluster) -> None:
    """FC-05/FC-12 on the real path: a pod that reaches the kubelet with egpu.io/gpu but no
    allocation (bound straight to the node, past the webhook and the scheduler) must not
    start; the kubelet's event says why."""
    name = "drill-unmatched"
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "kube-system"},  # outside the webhook
        "spec": {
            "nodeName": installed.node.name,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "probe", "image": inst.devimages.IMAGE_EGPU,
                            "command": ["python3", "-c", inst.PROBE],
                            "resources": {"limits": {"egpu.io/gpu": 1, "cpu": "100m",
                                                     "memory": "128Mi"}}}],
        },
    }
    inst.apply_json(installed, pod)

    def refused() -> str:
        events = installed.kubectl("-n", "kube-system", "get", "events", "--field-selector",
                                   f"involvedObject.name={name}", check=False)
        return events if "egpu" in events and ("Failed" in events or "Error" in events) \
            else ""

    events = installed.wait_for("the kubelet's refusal event", refused, timeout=90)
    live = inst.get_json(installed, "pod", "-n", "kube-system", name)
    statuses = live["status"].get("containerStatuses", [])
    assert not any(s.get("state", {}).get("running") for s in statuses), live["status"]
    logs = installed.kubectl("-n", "kube-system", "logs", name, check=False)
    assert "PROBE" not in logs, "the container ran without a share"
    installed.kubectl("-n", "kube-system", "delete", "pod", name, "--wait=true",
                      "--ignore-not-found", timeout=60)
    assert "egpu" in events
