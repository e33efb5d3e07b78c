"""egpu top's pure view: bookings per card from allocation annotations, usage from the node."""

from __future__ import annotations

from typing import Any

import pytest

from cli.top_cmd import format_views
from egpu.cluster_view import cluster_view
from egpu.records import (
    Allocation,
    Card,
    CardShare,
    CardUsage,
    ContainerAllocation,
    Inventory,
    NodeUsage,
)

CARDS = (Card("GPU-a", 0, "NVIDIA A10", 23028), Card("GPU-b", 1, "NVIDIA A10", 23028))


def node(name: str = "n1", usage: NodeUsage | None = None) -> dict[str, Any]:
    annotations = {"egpu.io/inventory": Inventory(CARDS).encode()}
    if usage:
        annotations["egpu.io/usage"] = usage.encode()
    return {"metadata": {"name": name, "annotations": annotations}}


def pod(name: str, allocation: Allocation, spec: dict[str, Any], phase: str = "Running",
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "annotations": {
        "egpu.io/allocation": allocation.encode(), **(annotations or {})}},
        "spec": {"nodeName": "n1", **spec}, "status": {"phase": phase}}


def limits(mib: int, cores: int) -> dict[str, Any]:
    return {"resources": {"limits": {"egpu.io/gpu-memory": mib, "egpu.io/gpu-cores": cores}}}


def test_fc07_init_rule_and_summed_containers_per_card() -> None:
    init_pod = pod("ocr", Allocation((
        ContainerAllocation("warm", True, (CardShare("GPU-a", 0, 12000, 100),)),
        ContainerAllocation("ocr", False, (CardShare("GPU-a", 0, 8000, 20),)))),
        {"initContainers": [{"name": "warm", **limits(12000, 100)}],
         "containers": [{"name": "ocr", **limits(8000, 20)}]})
    two = pod("retrieval", Allocation((
        ContainerAllocation("e", False, (CardShare("GPU-b", 1, 4000, 10),)),
        ContainerAllocation("r", False, (CardShare("GPU-b", 1, 6000, 10),)))),
        {"containers": [{"name": "e", **limits(4000, 10)}, {"name": "r", **limits(6000, 10)}]},
        annotations={"egpu.io/priority": "low"})
    finished = ContainerAllocation("x", False, (CardShare("GPU-b", 1, 9, 9),))
    done = pod("old", Allocation((finished,)),
               {"containers": [{"name": "x", **limits(9, 9)}]}, phase="Succeeded")
    usage = NodeUsage((CardUsage("GPU-a", 5000, 42.0),))
    [view] = cluster_view([node(usage=usage), {"metadata": {"name": "cpu-node"}}],
                          [init_pod, two, done])
    a, b = view.cards
    assert (a.booked_mib, a.booked_cores, len(a.shares)) == (12000, 100, 2)
    assert (b.booked_mib, b.booked_cores, len(b.shares)) == (10000, 20, 2)
    assert (a.used_mib, a.compute_used_percent, b.used_mib) == (5000, 42.0, None)
    assert {s.priority for s in b.shares} == {"low"}
    text = format_views([view])
    assert "ns/ocr/warm (init): 12000 MiB, 100% cores" in text


def test_malformed_annotations_are_problems_not_crashes() -> None:
    bad_node = {"metadata": {"name": "n1", "annotations": {"egpu.io/inventory": "{"}}}
    [view] = cluster_view([bad_node], [])
    assert view.problems and "not valid JSON" in view.problems[0]
    bad_pod = {"metadata": {"name": "p", "namespace": "ns",
                            "annotations": {"egpu.io/allocation": "[]"}},
               "spec": {"nodeName": "n1"}}
    [view] = cluster_view([node()], [bad_pod])
    assert "pod ns/p" in view.problems[0]


def test_placed_records_are_read_without_the_pod_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record with kinds and policies (a current extender's): bookings by the
    effective-request rule from the record's kinds, priority from the record, and the pod
    spec never read (here it is empty)."""
    def read_pod(*_: object) -> None:
        raise AssertionError("kubectl egpu read the pod spec for what the record says")

    monkeypatch.setattr("egpu.cluster_view.read_pod", read_pod)

    def entry(name: str, kind: str, uuid: str, mib: int, cores: int) -> ContainerAllocation:
        return ContainerAllocation(name, kind != "container",
                                   (CardShare(uuid, 0 if uuid == "GPU-a" else 1, mib, cores),),
                                   kind)

    # GPU-a: an init (12000) then the app (8000): max. GPU-b: a sidecar (2000), an init after
    # it (4000: it runs beside the sidecar), the app (3000): max(2000 + 3000, 2000 + 4000).
    ocr = pod("ocr", Allocation((entry("warm", "init", "GPU-a", 12000, 100),
                                 entry("ocr", "container", "GPU-a", 8000, 20)),
                                "n1", "high", "strict", False), {})
    mixed = pod("mixed", Allocation((entry("proxy", "sidecar", "GPU-b", 2000, 5),
                                     entry("load", "init", "GPU-b", 4000, 30),
                                     entry("serve", "container", "GPU-b", 3000, 10)),
                                    "n1", "low", "elastic", True), {},
                annotations={"egpu.io/priority": "high"})  # the record wins
    [view] = cluster_view([node()], [ocr, mixed])
    a, b = view.cards
    assert (a.booked_mib, a.booked_cores) == (12000, 100)
    assert (b.booked_mib, b.booked_cores) == (6000, 35)
    assert {s.priority for s in a.shares} == {"high"} and {s.priority for s in b.shares} == {"low"}
    assert [(s.container, s.init) for s in b.shares] == [
        ("proxy", True), ("load", True), ("serve", False)]


def test_record_bookings_equal_the_spec_reading_for_a_placed_pod() -> None:
    """The same pod, its record with and without kinds: the same bookings (one with the spec
    read, one without)."""
    spec = {"initContainers": [{"name": "proxy", "restartPolicy": "Always", **limits(2000, 5)},
                               {"name": "load", **limits(4000, 30)}],
            "containers": [{"name": "serve", **limits(3000, 10)}]}
    shares = [("proxy", "sidecar", 2000, 5), ("load", "init", 4000, 30),
              ("serve", "container", 3000, 10)]
    containers = tuple(ContainerAllocation(n, k != "container",
                                           (CardShare("GPU-b", 1, m, c),), k)
                       for n, k, m, c in shares)
    placed = Allocation(containers, "n1", "high", "strict", False)
    old = Allocation(tuple(c.replace(kind=None) for c in containers), "n1")
    [new_view] = cluster_view([node()], [pod("p", placed, spec)])
    [old_view] = cluster_view([node()], [pod("p", old, spec)])
    assert [(c.booked_mib, c.booked_cores) for c in new_view.cards] == [
        (c.booked_mib, c.booked_cores) for c in old_view.cards] == [(0, 0), (6000, 35)]
