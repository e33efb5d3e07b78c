"""The device plugin over gRPC against a stub kubelet (v1beta1), pods given as JSON (FC-12).

The same scenarios run with pods from a real kube-apiserver in tests/e2e/test_node_e2e.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from node_fixtures import CARD_UUIDS, pod_manifest

from egpu.config import Config
from egpu.records import Card, PodShares
from node_agent.deviceplugin.kubelet_stub import KubeletStub
from node_agent.deviceplugin.service import EgpuDevicePlugin, PluginServer
from node_agent.deviceplugin.slots import card_of, slot_id
from node_agent.pods import PodRegistry

NODE = "node-dp"
SHARES = 4


@dataclass
class Rig:
    kubelet: KubeletStub
    server: PluginServer
    registry: PodRegistry
    cards: list[Card]
    folder: str


@pytest.fixture
def rig() -> Iterator[Rig]:
    folder = tempfile.mkdtemp(prefix="egpu-dp-", dir="/tmp")  # unix socket paths are short
    cards = [Card(u, i, "NVIDIA A10", 24576, numa_node=i // 4) for i, u in enumerate(CARD_UUIDS)]
    registry = PodRegistry(NODE, Config(shares_per_card=SHARES), f"{folder}/private",
                           f"{folder}/runtime")
    plugin = EgpuDevicePlugin(lambda: tuple(cards), SHARES, registry.pending, registry.consume,
                              NODE)
    kubelet = KubeletStub(f"{folder}/plugins")
    kubelet.start()
    server = PluginServer(plugin, f"{folder}/plugins")
    assert server.ensure()
    kubelet.wait_for_list(1)
    yield Rig(kubelet, server, registry, cards, folder)
    plugin.stop()
    server.stop()
    kubelet.stop()
    shutil.rmtree(folder, ignore_errors=True)


def test_registration_and_slots(rig: Rig) -> None:
    request = rig.kubelet.requests[0]
    assert (request.version, request.endpoint, request.resource_name) == \
        ("v1beta1", "egpu.sock", "egpu.io/gpu")
    assert request.options.get_preferred_allocation_available
    devices = rig.kubelet.devices
    assert len(devices) == 8 * SHARES and all(d.health == "Healthy" for d in devices)
    first_id = devices[0].ID
    assert first_id == slot_id(CARD_UUIDS[0], 0)
    assert devices[-1].topology.nodes[0].ID == 1


def test_allocation_file_is_written_for_the_hook(rig: Rig) -> None:
    rig.registry.update(pod_manifest("p", NODE, {"main": [(2, 1000, 10)]}, uid="uid-f"))
    path = os.path.join(rig.folder, "private", "allocations", "uid-f.json")
    with open(path, encoding="utf-8") as handle:
        record = PodShares.decode(handle.read())
    assert record.allocation.containers[0].uuids == (CARD_UUIDS[2],)
    assert record.priority == "high" and record.compute_policy == "strict"


def test_fc12_opposite_order_each_gets_its_own(rig: Rig) -> None:
    rig.registry.update(pod_manifest("first", NODE, {"main": [(0, 4096, 30)]}, uid="uid-1"))
    rig.registry.update(pod_manifest("second", NODE, {"main": [(1, 4096, 30)]}, uid="uid-2"))
    envs_second = rig.kubelet.allocate([slot_id(CARD_UUIDS[1], 2)])
    envs_first = rig.kubelet.allocate([slot_id(CARD_UUIDS[0], 0)])
    assert (envs_second["EGPU_POD_UID"], envs_second["NVIDIA_VISIBLE_DEVICES"]) == \
        ("uid-2", CARD_UUIDS[1])
    assert (envs_first["EGPU_POD_UID"], envs_first["NVIDIA_VISIBLE_DEVICES"]) == \
        ("uid-1", CARD_UUIDS[0])
    assert envs_first["EGPU_MEMORY_LIMIT_MIB"] == "4096" and "EGPU_ALLOCATION_ERROR" not in \
        envs_first


def test_fc12_eight_card_pod_gets_eight_distinct_cards(rig: Rig) -> None:
    order = [5, 2, 7, 0, 1, 6, 3, 4]
    rig.registry.update(pod_manifest("big", NODE, {"main": [(i, 24576, 100) for i in order]},
                                     uid="uid-8"))
    available = [d.ID for d in rig.kubelet.devices]
    chosen = rig.kubelet.preferred(available, 8)
    assert len({card_of(c) for c in chosen}) == 8
    envs = rig.kubelet.allocate(chosen)
    visible = envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert visible == [CARD_UUIDS[i] for i in order] and len(set(visible)) == 8
    assert envs["EGPU_POD_UID"] == "uid-8"


def test_fc12_unmatchable_devices_fail_clearly(rig: Rig) -> None:
    rig.registry.update(pod_manifest("a", NODE, {"main": [(0, 4096, 30)]}, uid="uid-a"))
    envs = rig.kubelet.allocate([slot_id(CARD_UUIDS[3], 0)])
    assert "no pod bound on node node-dp waits for a share" in envs["EGPU_ALLOCATION_ERROR"]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "void" and "EGPU_POD_UID" not in envs


def test_fc12_same_cards_ambiguous_defers_to_the_hook(rig: Rig) -> None:
    rig.registry.update(pod_manifest("a", NODE, {"main": [(0, 1000, 10)]}, uid="uid-a"))
    rig.registry.update(pod_manifest("b", NODE, {"main": [(0, 8000, 50)]}, uid="uid-b"))
    envs = rig.kubelet.allocate([slot_id(CARD_UUIDS[0], 1)])
    assert envs["NVIDIA_VISIBLE_DEVICES"] == CARD_UUIDS[0]
    assert "EGPU_POD_UID" not in envs and "EGPU_MEMORY_LIMIT_MIB" not in envs


def test_preferred_allocation_follows_the_first_seen_pod(rig: Rig) -> None:
    rig.registry.update(pod_manifest("a", NODE, {"main": [(6, 1000, 10)]}, uid="uid-a"))
    rig.registry.update(pod_manifest("b", NODE, {"main": [(3, 1000, 10)]}, uid="uid-b"))
    chosen = rig.kubelet.preferred([d.ID for d in rig.kubelet.devices], 1)
    assert card_of(chosen[0]) == CARD_UUIDS[6]
    rig.kubelet.allocate(chosen)
    chosen = rig.kubelet.preferred([d.ID for d in rig.kubelet.devices], 1)
    assert card_of(chosen[0]) == CARD_UUIDS[3]


def test_unhealthy_card_is_streamed(rig: Rig) -> None:
    before = rig.kubelet.lists
    rig.cards[3] = Card(CARD_UUIDS[3], 3, "NVIDIA A10", 24576, healthy=False)
    rig.server.plugin.notify()
    devices = rig.kubelet.wait_for_list(before + 1)
    bad = {d.ID for d in devices if d.health == "Unhealthy"}
    assert bad == {slot_id(CARD_UUIDS[3], k) for k in range(SHARES)}


def test_registers_again_after_a_kubelet_restart(rig: Rig) -> None:
    rig.kubelet.restart()
    assert rig.server.ensure()
    assert len(rig.kubelet.requests) == 2
    rig.kubelet.wait_for_list(2)
    assert not rig.server.ensure()  # nothing changed: no third registration
