"""node_agent.uninstall: when an agent's stop is egpu's removal, and what removal takes off a
node. The whole path (helm uninstall on the real node) is tests/e2e/test_real_node_helm.py."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from node_agent.inventory import inventory_patch
from node_agent.uninstall import (
    NODE_ANNOTATIONS,
    capacity_removal,
    cdi_files,
    daemonset_owner,
    daemonset_removed,
    node_annotations_removal,
    remove_node_files,
)

UID = "0b6c3a52-9c1f-4d2e-8a55-6f1f3b1f0c11"


def _daemonset(uid: str = UID, deleting: bool = False,
               finalizers: tuple[str, ...] = ("foregroundDeletion",)) -> dict[str, object]:
    meta: dict[str, object] = {"name": "egpu-node-agent", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T05:00:00Z"
        meta["finalizers"] = list(finalizers)
    return {"metadata": meta}


@pytest.mark.parametrize(("daemonset", "removed"), [
    (_daemonset(deleting=True), True),  # foreground deletion: the hook Job's, the doc's
    # gone (404): a Helm upgrade or rollback that drops the DaemonSet (the DRA pool's, its
    # nodes handed to the other agent), or a background delete
    (None, False),
    (_daemonset(deleting=True, finalizers=("orphan",)), False),  # orphaning its pods
    (_daemonset(), False),  # a roll, a pod deleted by hand, a node shutting down
    (_daemonset(uid="another", deleting=True), False),  # not ours
    (_daemonset(uid="another"), False),  # reinstalled under the same name: it takes over
])
def test_only_the_agents_own_daemonset_going_away_is_a_removal(daemonset, removed) -> None:
    """Bug caught: an agent that cleans its node on every stop would delete the files of
    running shares at each roll; one that never does leaves everything after uninstall. And
    since: a Helm upgrade that drops the DRA pool's DaemonSet (background deletion, 404) made
    each of its agents wipe its node (hook, interposer, every share's files) with share pods
    running and the other agent taking the node over."""
    assert daemonset_removed(UID, daemonset) is removed


def test_an_agent_without_a_daemonset_owner_never_removes() -> None:
    assert daemonset_removed("", None) is False


def test_the_owner_is_the_controlling_daemonset_reference() -> None:
    pod = {"metadata": {"ownerReferences": [
        {"kind": "ReplicaSet", "name": "x", "uid": "1", "controller": False},
        {"kind": "DaemonSet", "name": "egpu-node-agent", "uid": UID, "controller": True}]}}
    assert daemonset_owner(pod) == ("egpu-node-agent", UID)
    assert daemonset_owner({"metadata": {}}) == ("", "")


def test_the_annotation_patch_removes_every_annotation_the_agent_writes() -> None:
    patch = inventory_patch((), datetime.now(UTC), None, "extender", "1 file")
    written = patch["metadata"]["annotations"]
    removal = node_annotations_removal()["metadata"]["annotations"]
    assert set(written) <= set(removal) == set(NODE_ANNOTATIONS)
    assert all(value is None for value in removal.values())  # merge patch: null removes


def test_capacity_goes_only_once_the_kubelet_reads_zero() -> None:
    """Bug caught: removing the key while the kubelet still counts the stopped plugin's
    devices (its 5 min grace) is undone at its next status update; removing it without a
    test op would drop the capacity of a plugin that registered again in between."""
    counted = {"status": {"capacity": {"egpu.io/gpu": "20"}, "allocatable": {"egpu.io/gpu": "0"}}}
    assert capacity_removal(counted) is None
    assert capacity_removal({"status": {"capacity": {"cpu": "2"}}}) is None
    forgotten = {"status": {"capacity": {"egpu.io/gpu": "0"}, "allocatable": {"egpu.io/gpu": "0"}}}
    assert capacity_removal(forgotten) == [
        {"op": "test", "path": "/status/capacity/egpu.io~1gpu", "value": "0"},
        {"op": "remove", "path": "/status/capacity/egpu.io~1gpu"},
        {"op": "remove", "path": "/status/allocatable/egpu.io~1gpu"},
    ]


def test_node_files_go_and_the_mounted_folders_stay(tmp_path: Path) -> None:
    runtime = tmp_path / "run-egpu"
    (runtime / "cards" / "GPU-0").mkdir(parents=True)
    (runtime / "cards" / "GPU-0" / "roster").write_bytes(b"x")
    (runtime / "containers" / "uid_c").mkdir(parents=True)
    private = tmp_path / "egpu-node"
    (private / "allocations").mkdir(parents=True)
    (private / "allocations" / "uid.json").write_text("{}")
    os.symlink("/etc/passwd", private / "link")  # a link goes, its target stays
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    for name in ("egpu.json", "egpu-claim-1234.json", "nvidia.yaml", "egpu-notes.txt"):
        (cdi / name).write_text("{}")
    left = remove_node_files([str(runtime), str(private), str(tmp_path / "absent")],
                             [*cdi_files(str(cdi)), str(tmp_path / "gone.json")])
    assert left == []
    assert list(runtime.iterdir()) == [] and list(private.iterdir()) == []
    assert sorted(p.name for p in cdi.iterdir()) == ["egpu-notes.txt", "nvidia.yaml"]
    assert os.path.exists("/etc/passwd")
