"""Every replica starts with its own share (issue 21): Deployments at density on two real
nodes (kubelet v1.37 + containerd, 4 fake H100 cards each, egpu installed by ``kubectl apply
-k``): the session's real node and a second one this module adds (``second_node``).

The bug these catch: the device plugin API gives Allocate no pod, so when pods that wait for
the kubelet's admission hold same-sized shares on different cards, the kubelet can hand one
pod the other's slots; the hook then refuses the container at every restart (a Deployment of
19 replicas on a 2-card node left 2 pods in CrashLoopBackOff for good). The extender's bind
gate (docs/node.md, "One binding of pod to cards") keeps such pods from waiting together.

Each case ends with every pod Running with exactly its share, as its probe sees it: the
cuMemGetInfo total equal to the share, one MiB past it CUDA_ERROR_OUT_OF_MEMORY, and NVML's
cards exactly the cards of its ``egpu.io/allocation``; no pod Failed or restarted; and after
the scale to 0, no file of a deleted pod left on the node.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu.records import Allocation
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

SECOND_NODE = "egpu-real-1"
SECOND_CARDS = tuple((f"GPU-7e1e0001-0000-4000-8000-00000000000{i}", "NVIDIA H100 80GB HBM3",
                      81559, 0) for i in range(4))
SLOTS_PER_NODE = 40  # 4 cards x 10 shares per card (manifests/base/config.yaml)
REPLICAS = 2 * SLOTS_PER_NODE  # every slot of both nodes
SHARE_MIB = 1000
CUDA_ERROR_OUT_OF_MEMORY = 2
START_S = 480.0  # 80 containers, each a Python probe, on the 2-core machine


@pytest.fixture(scope="module", autouse=True)
def second_node(installed: RealCluster) -> Iterator[Any]:
    """A second real node with 4 cards for this module; the installed DaemonSet's agent on
    it offers its 40 slots before the tests start. Removed at the end."""
    from devcluster import realnode

    node = realnode.add(installed.info, name=SECOND_NODE, cards=SECOND_CARDS)

    def serving() -> bool:
        obj = inst.get_json(installed, "node", SECOND_NODE)
        return int(obj["status"].get("allocatable", {}).get("egpu.io/gpu", "0")) \
            == SLOTS_PER_NODE and "egpu.io/inventory" in obj["metadata"].get("annotations", {})

    try:
        installed.wait_for("the second node's agent serving its slots", serving, timeout=300,
                           interval=2.0)
        yield node
    finally:  # its pods go with their kubelet still there, then the node
        installed.kubectl("-n", inst.SHARE_NS, "delete", "pods", "--all", "--field-selector",
                          f"spec.nodeName={SECOND_NODE}", "--wait=true", "--timeout=120s",
                          check=False, timeout=150)
        realnode.remove(installed.info.state_dir, SECOND_NODE)

def delete_deployment(cluster: RealCluster, app: str) -> None:
    """Delete Deployment ``app`` and wait until every pod of it is gone (foreground cascade:
    the Deployment stays until its ReplicaSets and pods are deleted). A pod that does not go
    fails the test that made it, with the namespace's state, instead of blocking whatever runs
    next on the node (a replica left Terminating once failed the Helm module's teardown)."""
    in_flight = sys.exc_info()[1]  # called from a finally of a failing test
    cluster.kubectl("-n", inst.SHARE_NS, "delete", "deployment", app, "--cascade=foreground",
                    "--ignore-not-found", "--wait=true", "--timeout=240s", check=False,
                    timeout=260)
    try:
        cluster.wait_for(f"every pod of {app} gone", lambda: not inst.get_json(
            cluster, "pods", "-n", inst.SHARE_NS, "-l", f"app={app}")["items"],
            timeout=60, interval=2.0)
    except Exception as exc:
        state = f"{exc}\n{inst.describe_namespace(cluster, inst.SHARE_NS)}"
        if in_flight is not None:
            print(state)  # never hide the failure of the test itself
            return
        raise AssertionError(state) from exc


def deployment(name: str, replicas: int, pod: dict[str, Any]) -> dict[str, Any]:
    """A Deployment of ``replicas`` copies of ``pod`` (a share pod of realnode_install)."""
    template = copy.deepcopy(pod)
    labels = {**template["metadata"].get("labels", {}), "app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": inst.SHARE_NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels,
                                      "annotations": template["metadata"].get("annotations", {})},
                         "spec": template["spec"]},
        },
    }


def share_template(cluster: RealCluster, mib: int) -> dict[str, Any]:
    return inst.share_pod("x", inst.SHARE_NS, cluster.inputs / "pods" / "01-vllm-online.yaml",
                          inst.REAL_LABEL, overrides={"egpu.io/gpu-memory": mib,
                                                      "egpu.io/gpu-cores": 2})


def pods_of(cluster: RealCluster, app: str) -> list[dict[str, Any]]:
    return list(inst.get_json(cluster, "pods", "-n", inst.SHARE_NS, "-l", f"app={app}")["items"])


def broken(pod: dict[str, Any]) -> str:
    """Why a pod is not on its way to Running with its share ("" when it is)."""
    status = pod.get("status", {})
    if status.get("phase") == "Failed":
        return f"Failed: {status.get('reason')}: {status.get('message')}"
    for c in status.get("containerStatuses", []):
        waiting = c.get("state", {}).get("waiting", {})
        if c.get("restartCount", 0) or waiting.get("reason") in (
                "CrashLoopBackOff", "CreateContainerError", "RunContainerError"):
            return f"container {c['name']}: {waiting.get('reason')} {waiting.get('message', '')}"
    return ""


def wait_running(cluster: RealCluster, app: str, count: int) -> list[dict[str, Any]]:
    """All ``count`` pods of ``app`` Running; fails at once on a pod that cannot get there."""
    def running() -> list[dict[str, Any]] | None:
        pods = pods_of(cluster, app)
        bad = {p["metadata"]["name"]: why for p in pods if (why := broken(p))}
        if bad:
            raise AssertionError(f"pods that will not start with their share: {bad}\n"
                                 + inst.describe_namespace(cluster, inst.SHARE_NS))
        up = [p for p in pods if p.get("status", {}).get("phase") == "Running"
              and not p["metadata"].get("deletionTimestamp")]
        return up if len(up) == count and len(pods) == count else None

    try:
        return list(cluster.wait_for(f"{count} pods of {app} Running", running,
                                     timeout=START_S, interval=2.0))
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{inst.describe_namespace(cluster, inst.SHARE_NS)}\n"
                             f"{inst.scheduler_log_tail(cluster)}") from exc


def wrong_shares(cluster: RealCluster, pods: list[dict[str, Any]], mib: int) -> list[str]:
    """Each pod whose probe does not see exactly its share on exactly its cards."""
    wrong = []
    for pod in pods:
        name = pod["metadata"]["name"]
        record = Allocation.decode(pod["metadata"]["annotations"]["egpu.io/allocation"])
        probe = pod["spec"]["containers"][0]["name"]  # the app container runs the probe
        cards = sorted(next(c for c in record.containers if c.name == probe).uuids)
        result = inst.probe_result(cluster, inst.SHARE_NS, name, timeout=120)
        seen = (result["total_mib"], result["alloc_one_more_mib"],
                sorted(result.get("cards") or []))
        if seen != (mib, CUDA_ERROR_OUT_OF_MEMORY, cards):  # with all it saw: which call failed
            wrong.append(f"{name}: total/one-more/cards {seen}, placed {mib} MiB on {cards}; "
                         f"the probe: {json.dumps(result)}")
    return wrong


def node_files(cluster: RealCluster) -> set[str]:
    """Pod uids that still have files on either node (allocation files, hook and region
    folders)."""
    from devcluster import realnode

    second = realnode.RealNode.load(cluster.info.state_dir, SECOND_NODE)
    uids = set()
    for node in (cluster.node, second):
        for base in ("/var/run/egpu-node/allocations", "/var/run/egpu-node/hook",
                     "/var/run/egpu/containers"):
            folder = Path(node.host_path(base))
            if folder.is_dir():
                uids |= {p.name.removesuffix(".json").split("_")[0] for p in folder.iterdir()}
    return uids


def scale(cluster: RealCluster, app: str, replicas: int) -> None:
    cluster.kubectl("-n", inst.SHARE_NS, "scale", f"deployment/{app}", f"--replicas={replicas}")


def test_a_deployment_of_eighty_replicas_fills_two_nodes_each_replica_with_its_own_share(
        installed: RealCluster) -> None:
    """80 identical replicas, created at once: binpack fills card 0, then 1, 2, 3 of each
    node, so every card change meets pods of the previous card still waiting for admission.
    Then scale 0 -> 80 again: the same on nodes whose slots were all just freed."""
    app = "density"
    inst.apply_json(installed, deployment(app, REPLICAS, share_template(installed, SHARE_MIB)))
    try:
        for round_ in ("first start", "after scale 0 -> 80"):
            pods = wait_running(installed, app, REPLICAS)
            assert wrong_shares(installed, pods, SHARE_MIB) == [], round_
            per_card: dict[str, int] = {}
            for p in pods:
                for c in Allocation.decode(
                        p["metadata"]["annotations"]["egpu.io/allocation"]).containers:
                    for uuid in c.uuids:
                        per_card[uuid] = per_card.get(uuid, 0) + 1
            assert sorted(per_card.values()) == [10] * 8, per_card
            uids = {p["metadata"]["uid"] for p in pods}
            scale(installed, app, 0)
            installed.wait_for("every replica gone", lambda: not pods_of(installed, app),
                               timeout=180, interval=2.0)
            installed.wait_for("no file of a deleted replica on the node",
                               lambda uids=uids: not (node_files(installed) & uids),
                               timeout=60)
            if round_ == "first start":
                scale(installed, app, REPLICAS)
    finally:
        delete_deployment(installed, app)


def test_deployments_of_one_two_and_four_card_shares_all_start_with_their_cards(
        installed: RealCluster) -> None:
    """Mixed shapes: 4-card replicas bound first (binpack fills card 0's slots with 1-card
    pods, after which no 4-card pod fits: a limit of slot counting, not of this issue), then
    1-card, 2-card and another 1-card size created together (sizes the kubelet tells apart,
    and one size on several cards), and pods with a share in an init container, a sidecar and
    the app container."""
    shapes = {"four": (4, 1000, 2), "one": (1, 1500, 8), "two": (2, 2000, 4),
              "small": (1, 500, 6)}  # 30 of the node's 40 slots
    base = share_template(installed, SHARE_MIB)
    started = time.monotonic()
    for app, (gpus, mib, replicas) in shapes.items():
        pod = copy.deepcopy(base)
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        limits.update({"egpu.io/gpu": gpus, "egpu.io/gpu-memory": mib})
        inst.apply_json(installed, deployment(app, replicas, pod))
        if app == "four":
            installed.wait_for("the 4-card replicas bound", lambda: sum(
                bool(p["spec"].get("nodeName")) for p in pods_of(installed, "four")) == 2,
                timeout=120, interval=1.0)
    # an init container and a sidecar with shares beside the app's: the kubelet hands the app
    # container the init's slot (its reuse pool), so placement must have put both on one card
    staged = copy.deepcopy(base)
    app_container = staged["spec"]["containers"][0]
    share_limits = {k: v for k, v in app_container["resources"]["limits"].items()
                    if k not in ("egpu.io/gpu-memory",)}
    staged["spec"]["initContainers"] = [
        {"name": "prep", "image": app_container["image"], "command": ["true"],
         "resources": {"limits": {**share_limits, "egpu.io/gpu-memory": 500}}},
        {"name": "side", "image": app_container["image"], "restartPolicy": "Always",
         "command": ["sleep", "3600"],
         "resources": {"limits": {**share_limits, "egpu.io/gpu-memory": 300}}}]
    inst.apply_json(installed, deployment("staged", 3, staged))
    try:
        wrong = []
        for app, (gpus, mib, replicas) in [*shapes.items(), ("staged", (1, SHARE_MIB, 3))]:
            pods = wait_running(installed, app, replicas)
            for pod in pods:
                record = Allocation.decode(pod["metadata"]["annotations"]["egpu.io/allocation"])
                app_entry = next(c for c in record.containers if not c.init)
                assert len(app_entry.uuids) == gpus, json.dumps(record.to_dict())
                if app == "staged":
                    by_name = {c.name: set(c.uuids) for c in record.containers}
                    assert by_name["prep"] <= by_name["side"], by_name  # the kubelet's reuse
            wrong += wrong_shares(installed, pods, mib)
        assert wrong == []
        print(f"mixed shapes: {3 + sum(r for *_, r in shapes.values())} pods Running after "
              f"{time.monotonic() - started:.0f} s")
    finally:
        for app in [*shapes, "staged"]:
            delete_deployment(installed, app)


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
        assert wrong_shares(installed, pods, SHARE_MIB) == [], "after the rolling update"
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
        assert wrong_shares(installed, pods, SHARE_MIB) == [], "after drain and uncordon"
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
        assert wrong_shares(installed, pods, SHARE_MIB) == []
    finally:
        delete_deployment(installed, app)


def test_share_pods_created_during_a_node_agent_roll_all_start(installed: RealCluster) -> None:
    """`kubectl rollout restart` of the node agents (what a config change or an upgrade does)
    while 10 share pods are created: the new agent serves beside the old one until the
    kubelet has its slots (surge, readiness /healthz), so no pod fails admission and none
    waits for slots. Bug caught: the old agent stopped first, the node offered 0 slots for
    about 8 s, pods failed with UnexpectedAdmissionError or waited 5 min (issue 22)."""
    app = "during-roll"
    count = 10
    installed.kubectl("-n", inst.NAMESPACE, "rollout", "restart", "daemonset/egpu-node-agent")
    created = time.monotonic()
    inst.apply_json(installed, deployment(app, count, share_template(installed, SHARE_MIB)))
    try:
        pods = wait_running(installed, app, count)  # fails at once on a Failed pod
        took = time.monotonic() - created
        installed.kubectl("-n", inst.NAMESPACE, "rollout", "status", "daemonset/egpu-node-agent",
                          "--timeout=300s", timeout=310)
        assert wrong_shares(installed, pods, SHARE_MIB) == []
        assert took <= 30, f"{count} pods Running {took:.0f} s after the roll began (p99 <= 30 s)"
        print(f"{count} share pods Running {took:.1f} s after the node agents' roll began")
    finally:
        delete_deployment(installed, app)
