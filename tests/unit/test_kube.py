"""The typed views over Kubernetes objects (egpu.kube): the fields the parts read, with their
types; absent, null or wrongly typed parts read as empty, and no view ever raises."""

from __future__ import annotations

from typing import Any

import pytest

from egpu.kube import KubeNode, KubeObject, KubePod

POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                 "annotations": {"egpu.io/allocation": "{}", "a": None},
                 "labels": {"egpu.io/priority": "low"}},
    "spec": {"nodeName": "n1", "containers": [{"name": "c"}, "junk"],
             "initContainers": [{"name": "i"}], "resourceClaims": [{"name": "egpu"}]},
    "status": {"phase": "Running", "initContainerStatuses": [{"name": "i"}],
               "containerStatuses": [{"name": "c"}]},
}


def test_a_pod_reads_as_written() -> None:
    pod = KubePod(POD)
    assert (pod.name, pod.namespace, pod.key, pod.uid, pod.resource_version) == (
        "p", "ns", "ns/p", "u-1", "7")
    assert pod.annotation("egpu.io/allocation") == "{}" and pod.annotation("x") is None
    assert pod.annotation("a") == "" and pod.annotations == {"egpu.io/allocation": "{}", "a": ""}
    assert pod.label("egpu.io/priority") == "low" and pod.labels == {"egpu.io/priority": "low"}
    assert pod.node_name == "n1" and pod.phase == "Running" and not pod.finished
    assert not pod.deleting
    assert [c["name"] for c in pod.containers] == ["c"]
    assert [c["name"] for c in pod.init_containers] == ["i"]
    assert [c["name"] for c in pod.container_statuses] == ["i", "c"]
    assert [c["name"] for c in pod.resource_claims] == ["egpu"]
    assert pod.raw is POD


@pytest.mark.parametrize("obj", [None, 5, "pod", [], {}, {"metadata": None, "spec": []},
                                 {"metadata": {"annotations": [], "labels": "x", "name": None,
                                               "uid": ["u"]},
                                  "spec": {"nodeName": 3.5, "containers": {"a": 1}},
                                  "status": "Running"}])
def test_a_malformed_object_reads_as_empty(obj: Any) -> None:
    pod = KubePod(obj)
    assert (pod.name, pod.namespace, pod.uid, pod.phase) == ("", "", "", "")
    assert pod.key == "/" and pod.annotations == {} and pod.labels == {}
    assert pod.annotation("egpu.io/allocation") is None and pod.label("x") is None
    assert pod.containers == () and pod.init_containers == () and pod.container_statuses == ()
    assert not pod.finished and not pod.deleting
    assert pod.node_name in ("", "3.5")  # a number reads as written (hand-written YAML)


def test_finished_deleting_and_nodes() -> None:
    assert KubePod({"status": {"phase": "Succeeded"}}).finished
    assert KubePod({"status": {"phase": "Failed"}}).finished
    assert KubePod({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}).deleting
    node = KubeNode({"metadata": {"name": "gpu-1", "annotations": {"egpu.io/inventory": "{}"}}})
    assert node.name == "gpu-1" and node.annotation("egpu.io/inventory") == "{}"
    assert node.namespace == "" and node.key == "/gpu-1"
    assert KubeObject({"metadata": {"name": 123}}).name == "123"  # YAML `name: 123`
    assert KubeObject({"metadata": {"name": True}}).name == ""
    assert repr(KubePod(POD)) == "KubePod('ns/p', uid='u-1')"
