"""Helpers for the node tests: synthetic accounting regions (egpu_region.h v1) and pods."""

from __future__ import annotations

import os

from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares
from node_agent.metrics.region import (
    CARD,
    HEADER,
    PROC_SIZE,
    REGION_MAGIC,
    REGION_SIZE,
    REGION_VERSION,
)

MIB = 1 << 20


def region_bytes(cards: list[tuple[str, int, int]]) -> bytes:
    """A full region with ``cards`` = [(uuid, limit_bytes, used_bytes)]."""
    data = bytearray(REGION_SIZE)
    HEADER.pack_into(data, 0, REGION_MAGIC, REGION_VERSION, REGION_SIZE, b"", len(cards), 0,
                     0, 0, b"")
    for i, (uuid, limit, used) in enumerate(cards):
        CARD.pack_into(data, HEADER.size + i * CARD.size, uuid.encode(), limit, used, b"")
    assert len(data) == HEADER.size + 16 * CARD.size + 1024 * PROC_SIZE
    return bytes(data)


def write_regions(runtime_dir: str, count: int, uuids: list[str]) -> dict[str, PodShares]:
    """``count`` containers (one per pod), each with a 1024 MiB share on one of ``uuids``,
    using (i % 1024) MiB. Returns pod uid -> PodShares."""
    shares = {}
    for i in range(count):
        uid = f"00000000-0000-0000-0000-{i:012d}"
        uuid = uuids[i % len(uuids)]
        folder = os.path.join(runtime_dir, "containers", f"{uid}_main")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "region"), "wb") as handle:
            handle.write(region_bytes([(uuid, 1024 * MIB, (i % 1024) * MIB)]))
        entry = ContainerAllocation("main", False, (CardShare(uuid, 0, 1024, 10),))
        shares[uid] = PodShares("team", f"pod-{i}", uid, "high", "strict", False,
                                Allocation(containers=(entry,), node="n1"))
    return shares


CARD_UUIDS = [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(8)]


def allocation_for(node: str, containers: dict[str, list[tuple[int, int, int]]]) -> Allocation:
    """An Allocation: container -> [(card index, MiB, cores)] on CARD_UUIDS."""
    return Allocation(node=node, containers=tuple(
        ContainerAllocation(name, False, tuple(CardShare(CARD_UUIDS[i], i, mib, cores)
                                                for i, mib, cores in cards))
        for name, cards in containers.items()))


def pod_manifest(name: str, node: str, containers: dict[str, list[tuple[int, int, int]]],
                 namespace: str = "team", uid: str = "") -> dict:
    """A pod bound to ``node`` whose containers have the given shares (egpu.io resources and
    the extender's egpu.io/allocation annotation), as Kubernetes JSON."""
    spec_containers = []
    for cname, cards in containers.items():
        limits = {"egpu.io/gpu": str(len(cards)), "egpu.io/gpu-memory": str(cards[0][1]),
                  "egpu.io/gpu-cores": str(cards[0][2])}
        spec_containers.append({"name": cname, "image": "registry.k8s.io/pause:3.9",
                                "resources": {"limits": limits, "requests": limits}})
    meta: dict = {"name": name, "namespace": namespace, "annotations": {
        "egpu.io/allocation": allocation_for(node, containers).encode()}}
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "schedulerName": "egpu-scheduler",
                     "containers": spec_containers},
            "status": {"phase": "Pending"}}
