"""Every replica starts with its own share (issue 21): Deployments at density on two real
nodes (kubelet v1.37 + containerd, 4 fake H100 cards each, egpu installed by ``kubectl apply
-k``): the session's real node and a second one (``second_node``, shared with the next module). The
rolls, drains and restarts in the middle of a burst are in test_real_node_density_restarts.py
(the same lane, after this one: tests/lanes.py).

The bug these catch: the device plugin API gives Allocate no pod, so when pods that wait for
the kubelet's admission hold same-sized shares on different cards, the kubelet can hand one
pod the other's slots; the hook then refuses the container at every restart (a Deployment of
19 replicas on a 2-card node left 2 pods in CrashLoopBackOff for good). egpu-kube-scheduler's bind
gate (docs/node.md, "One binding of pod to cards") keeps such pods from waiting together.

Each case ends with every pod Running with exactly its share, as its probe sees it: the
cuMemGetInfo total equal to the share, one MiB past it CUDA_ERROR_OUT_OF_MEMORY, and NVML's
cards exactly the cards of its ``egpu.io/allocation``; no pod Failed or restarted; and after
the scale to 0, no file of a deleted pod left on the node.
"""

from __future__ import annotations

import copy
import json
import time

import pytest

from egpu.records import Allocation
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster
from tests.e2e.density import (
    REPLICAS,
    SHARE_MIB,
    delete_deployment,
    deployment,
    every_card_full_and_every_share_exact,
    node_files,
    pods_of,
    scale,
    share_template,
    wait_running,
    wrong_shares,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("second_node")]
STUCK_ADMISSION_S = 240.0  # under the kubelet's 5 min before it retries a pod's admission


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
        assert not wrong, "\n".join(wrong)
        print(f"mixed shapes: {3 + sum(r for *_, r in shapes.values())} pods Running after "
              f"{time.monotonic() - started:.0f} s")
    finally:
        for app in [*shapes, "staged"]:
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
        wrong = wrong_shares(installed, pods, SHARE_MIB)
        assert not wrong, "\n".join(wrong)
        # the bug's wait is the kubelet's: 5 min before it tries a pod's admission again; a
        # figure (p99 <= 30 s) is a benchmark's, not this test's (a loaded host took 33 s)
        assert took < STUCK_ADMISSION_S, f"{count} pods Running {took:.0f} s after the roll"
        print(f"{count} share pods Running {took:.1f} s after the node agents' roll began")
    finally:
        delete_deployment(installed, app)


def test_a_deployment_of_eighty_replicas_fills_two_nodes_each_replica_with_its_own_share(
        installed: RealCluster) -> None:
    """80 identical replicas, created at once: binpack fills card 0, then 1, 2, 3 of each
    node, so every card change meets pods of the previous card still waiting for admission;
    then scaled to 0, which leaves no file of a replica on the nodes. Last of its module: the
    same burst again, on nodes whose 80 slots the same agents have just freed, is the first
    start of the rolling update that follows (test_real_node_density_restarts.py; this test
    scaled 0 -> 80 itself before)."""
    app = "density"
    inst.apply_json(installed, deployment(app, REPLICAS, share_template(installed, SHARE_MIB)))
    try:
        pods = wait_running(installed, app, REPLICAS)
        wrong = every_card_full_and_every_share_exact(installed, pods)
        assert not wrong, "\n".join(wrong)
        uids = {p["metadata"]["uid"] for p in pods}
        scale(installed, app, 0)
        installed.wait_for("every replica gone", lambda: not pods_of(installed, app),
                           timeout=180, interval=2.0)
        installed.wait_for("no file of a deleted replica on the node",
                           lambda: not (node_files(installed) & uids), timeout=60)
    finally:
        delete_deployment(installed, app)
