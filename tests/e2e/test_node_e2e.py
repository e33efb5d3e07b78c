"""The node agent against a real kube-apiserver (the local control plane): FC-12 and inventory.

Pods are created in the API server bound (spec.nodeName) to a node that no kubelet serves, so
they stay Pending, as pods do while their kubelet admits them; the agent's pod watch feeds its
registry, and a stub kubelet (node_agent.deviceplugin.kubelet_stub) registers the plugin and
calls GetPreferredAllocation / Allocate as the kubelet does.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from node_fixtures import CARD_UUIDS, pod_manifest

from egpu.config import Config
from egpu.contract import ANN_INVENTORY, ANN_INVENTORY_HEARTBEAT
from egpu.records import Card, Inventory
from node_agent import inventory
from node_agent.deviceplugin.kubelet_stub import KubeletStub
from node_agent.deviceplugin.service import EgpuDevicePlugin, PluginServer
from node_agent.deviceplugin.slots import card_of, slot_id
from node_agent.pods import PodRegistry, watch_pods

pytestmark = pytest.mark.e2e
SHARES = 4


class Agent:
    """The agent's device-plugin half, fed by a real pod watch."""

    def __init__(self, core: client.CoreV1Api, node: str) -> None:
        self.folder = tempfile.mkdtemp(prefix="egpu-e2e-", dir="/tmp")
        self.core = core
        self.node = node
        self.cards = tuple(Card(u, i, "NVIDIA A10", 24576) for i, u in enumerate(CARD_UUIDS))
        self.registry = PodRegistry(node, Config(shares_per_card=SHARES),
                                    f"{self.folder}/private", f"{self.folder}/runtime")
        self.stop = threading.Event()
        threading.Thread(target=watch_pods, args=(core, self.registry, self.stop),
                         daemon=True).start()
        self.plugin = EgpuDevicePlugin.from_functions(
            lambda: self.cards, SHARES, self.registry.pending, self.registry.consume, node)
        self.kubelet = KubeletStub(f"{self.folder}/plugins")
        self.kubelet.start()
        self.server = PluginServer(self.plugin, f"{self.folder}/plugins")
        assert self.server.ensure()
        self.kubelet.wait_for_list(1)

    def wait_pending(self, count: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while len(self.registry.pending()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.registry.pending())} pending, want {count}")
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.plugin.stop()
        self.server.stop()
        self.kubelet.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def agent(cluster) -> Iterator[tuple[Agent, str]]:
    core = client.CoreV1Api(cluster.api_client())
    namespace = f"egpu-node-{uuid.uuid4().hex[:6]}"
    cluster.ensure_namespace(namespace)
    node = f"egpu-dp-{uuid.uuid4().hex[:6]}"  # no kubelet: the pods stay Pending
    agent = Agent(core, node)
    yield agent, namespace
    agent.close()
    # Pods bound to a node without a kubelet are only removed with grace 0; without this they
    # would linger (with allocations on a node that does not exist) while the namespace goes.
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    core.delete_namespace(namespace)


def create(agent: Agent, namespace: str, name: str, cards: list[tuple[int, int, int]]) -> str:
    body = pod_manifest(name, agent.node, {"main": cards}, namespace=namespace)
    body.pop("status")
    return agent.core.create_namespaced_pod(namespace, body).metadata.uid


def test_fc12_two_pods_bound_within_a_second_allocated_in_opposite_order(agent) -> None:
    rig, namespace = agent
    first = create(rig, namespace, "first", [(0, 4096, 30)])
    second = create(rig, namespace, "second", [(1, 4096, 30)])
    rig.wait_pending(2)
    envs_second = rig.kubelet.allocate([slot_id(CARD_UUIDS[1], 0)])
    envs_first = rig.kubelet.allocate([slot_id(CARD_UUIDS[0], 3)])
    assert envs_second["EGPU_POD_UID"] == second
    assert envs_second["NVIDIA_VISIBLE_DEVICES"] == CARD_UUIDS[1]
    assert envs_first["EGPU_POD_UID"] == first
    assert envs_first["NVIDIA_VISIBLE_DEVICES"] == CARD_UUIDS[0]


def test_fc12_eight_card_pod_gets_eight_distinct_cards(agent) -> None:
    rig, namespace = agent
    order = [7, 0, 6, 1, 5, 2, 4, 3]
    uid = create(rig, namespace, "big", [(i, 20000, 100) for i in order])
    rig.wait_pending(1)
    chosen = rig.kubelet.preferred([d.ID for d in rig.kubelet.devices], 8)
    envs = rig.kubelet.allocate(chosen)
    assert len({card_of(c) for c in chosen}) == 8
    assert envs["NVIDIA_VISIBLE_DEVICES"].split(",") == [CARD_UUIDS[i] for i in order]
    assert envs["EGPU_POD_UID"] == uid


def test_fc12_no_match_is_a_clear_failure(agent) -> None:
    rig, namespace = agent
    create(rig, namespace, "a", [(0, 4096, 30)])
    rig.wait_pending(1)
    envs = rig.kubelet.allocate([slot_id(CARD_UUIDS[5], 0)])
    assert "waits for a share on cards" in envs["EGPU_ALLOCATION_ERROR"]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_inventory_annotations_are_published(cluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    name = f"egpu-inv-{uuid.uuid4().hex[:6]}"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        cards = (Card(CARD_UUIDS[0], 0, "NVIDIA A10", 24576, numa_node=0),)
        inventory.publish(core, name, cards)
        annotations = core.read_node(name).metadata.annotations
        assert Inventory.decode(annotations[ANN_INVENTORY]).cards == cards
        assert annotations[ANN_INVENTORY_HEARTBEAT].endswith("Z")
    finally:
        core.delete_node(name)
