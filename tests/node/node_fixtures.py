"""Helpers for the node tests: synthetic accounting regions (egpu_region.h v1) and pods."""

from __future__ import annotations

from egpu.records import Allocation, CardShare, ContainerAllocation
from testbed.regions import MIB, region_bytes, write_regions

__all__ = ["MIB", "region_bytes", "write_regions"]


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
