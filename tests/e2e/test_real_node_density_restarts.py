"""Every replica starts with its own share while the node changes under it (issue 21): a
rolling update and a drain of 80 replicas, and the node agents, a kubelet or a containerd
restarted in the middle of a burst of 80, on two real nodes (the session's and
``second_node``; helpers in tests/e2e/density.py). In the lane of test_real_node_density.py,
after it (tests/lanes.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster
from tests.e2e.density import (
    REPLICAS,
    SHARE_MIB,
    START_S,
    delete_deployment,
    deployment,
    node_files,
    pods_of,
    second_node,
    share_template,
    wait_running,
    wrong_shares,
)

pytestmark = pytest.mark.e2e
__all__ = ["second_node"]  # the module's second real node (autouse)


def test_a_rolling_update_then_a_drain_and_uncordon_restart_every_replica_with_its_share(
        installed: RealCluster) -> None:
    """80 replicas (every slot), rolled to a new template 20 at a time (maxSurge 0: the
    nodes have no slot for a surge pod), then the replicas drained off the first node and it
    uncordoned: each time every replacement starts with its own share."""
    app = "rolling"
    dep = deployment(app, REPLICAS, share_template(installed, SHARE_MIB))
    dep["spec"]["strategy"] = {"type": "RollingUpdate",
                               "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 20}}
    inst.apply_json(installed, dep)
    node = installed.node.name
    try:
        before = {p["metadata"]["uid"] for p in wait_running(installed, app, REPLICAS)}
        installed.kubectl("-n", inst.SHARE_NS, "patch", f"deployment/{app}", "--type=merge",
                          "-p", json.dumps({"spec": {"template": {"metadata": {
                              "annotations": {"egpu-e2e/revision": "2"}}}}}))
        installed.kubectl("-n", inst.SHARE_NS, "rollout", "status", f"deployment/{app}",
                          f"--timeout={int(START_S)}s", timeout=START_S + 10)
        pods = wait_running(installed, app, REPLICAS)
        assert not before & {p["metadata"]["uid"] for p in pods}
        wrong = wrong_shares(installed, pods, SHARE_MIB)
        assert not wrong, "after the rolling update: " + "\n".join(wrong)
        drained = {p["metadata"]["uid"] for p in pods if p["spec"]["nodeName"] == node}
        installed.kubectl("drain", node, f"--pod-selector=app={app}", "--timeout=180s",
                          timeout=200)
        try:
            installed.wait_for("the replacements Pending beside the cordoned node", lambda: len([
                p for p in pods_of(installed, app)
                if p["metadata"]["uid"] not in drained]) == REPLICAS, timeout=180, interval=2.0)
        finally:
            installed.kubectl("uncordon", node)
        pods = wait_running(installed, app, REPLICAS)
        wrong = wrong_shares(installed, pods, SHARE_MIB)
        assert not wrong, "after drain and uncordon: " + "\n".join(wrong)
        installed.wait_for("no file of a replaced or drained replica on the nodes",
                           lambda: not (node_files(installed) & (before | drained)), timeout=60)
    finally:
        installed.kubectl("uncordon", node, check=False)
        delete_deployment(installed, app)


@pytest.mark.parametrize("part", ["agent", "kubelet", "containerd"])
def test_a_part_restarted_mid_burst_leaves_no_replica_stuck_or_with_a_wrong_share(
        installed: RealCluster, part: str) -> None:
    """80 replicas created at once; while they start, the node agents (rolled, as a config
    change or an upgrade does: the new agent serves beside the old one), the first node's
    kubelet or its containerd is restarted. Every replica ends
    Running with exactly its share; a pod refused meanwhile (phase Failed with a reason) is
    replaced by its ReplicaSet and counts only through its replacement."""
    from devcluster import realnode

    app = f"burst-{part}"
    inst.apply_json(installed, deployment(app, REPLICAS, share_template(installed, SHARE_MIB)))
    try:
        installed.wait_for("the first replicas Running", lambda: sum(
            p.get("status", {}).get("phase") == "Running" for p in pods_of(installed, app))
            >= 5, timeout=START_S, interval=0.5)
        if part == "agent":
            installed.kubectl("-n", inst.NAMESPACE, "rollout", "restart",
                              "daemonset/egpu-node-agent")
        else:
            installed.node = realnode.restart_part(installed.info.state_dir,
                                                   installed.node.name, part)
        installed.wait_for(f"the {part} serving again", lambda: inst.wait_installed(
            installed) is None, timeout=START_S, interval=5.0)

        def settled() -> list[dict[str, Any]] | None:
            pods = pods_of(installed, app)
            for p in pods:  # a refused pod is replaced; its replacement must start
                if p.get("status", {}).get("phase") == "Failed":
                    installed.kubectl("-n", inst.SHARE_NS, "delete", "pod",
                                      p["metadata"]["name"], "--wait=false")
            up = [p for p in pods if p.get("status", {}).get("phase") == "Running"
                  and not p["metadata"].get("deletionTimestamp")]
            return up if len(up) == REPLICAS == len(pods) else None

        pods = installed.wait_for(f"{REPLICAS} replicas Running after the {part} restart",
                                  settled, timeout=START_S, interval=2.0)
        # a container the kubelet restarted because its restart cut a start short is fine;
        # one refused by egpu (the hook's message in its last state) is the bug
        restarted = {p["metadata"]["name"]: c.get("lastState", {}).get("terminated", {})
                     for p in pods for c in p["status"]["containerStatuses"]
                     if c.get("restartCount")}
        refused = {n: t for n, t in restarted.items() if "egpu" in str(t.get("message", ""))}
        assert refused == {}, f"containers egpu refused: {refused}"
        if restarted:
            reasons = sorted({f"{t.get('reason')} {t.get('exitCode')}"
                              for t in restarted.values()})
            print(f"{part}: {len(restarted)} containers restarted by the kubelet: {reasons}")
        wrong = wrong_shares(installed, pods, SHARE_MIB)
        assert not wrong, "\n".join(wrong)
    finally:
        delete_deployment(installed, app)
