"""The node agent's inventory against a real kube-apiserver (the local control plane).

FC-12 (pods bound within a second, allocated in any order) runs on the real kubelet:
tests/e2e/test_real_node.py::test_a_burst_of_share_pods_all_start_on_the_real_kubelet and
tests/e2e/test_real_node_drills.py::test_unmatched_allocate_is_refused_with_a_clear_event_never_run_unlimited;
the orders the kubelet may choose, one by one, in tests/node/test_device_plugin.py.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from node_fixtures import CARD_UUIDS

from egpu.contract import ANN_INVENTORY, ANN_INVENTORY_HEARTBEAT
from egpu.records import Card, Inventory
from node_agent import inventory

pytestmark = pytest.mark.e2e


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
