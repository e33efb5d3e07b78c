"""The dev cluster itself: simulated GPU nodes carry their inventory; a plain pod runs."""

from __future__ import annotations

import contextlib
import json

import pytest
import yaml
from kubernetes import client

from devcluster import cluster as devcluster
from devcluster import nodes as devnodes
from devcluster.pki import ensure_pki
from egpu.contract import ANN_INVENTORY, ANN_INVENTORY_HEARTBEAT, RES_GPU
from egpu.records import Inventory

CLUSTER_YAML = """
nodes:
  - name: gpu-x
    labels: {topology.kubernetes.io/zone: zone-a}
    cards: {count: 4, model: NVIDIA A100-SXM4-40GB, memoryMiB: 40960}
"""


# --- no cluster needed ------------------------------------------------------------------


def test_node_manifest_shape():
    spec = yaml.safe_load(CLUSTER_YAML)["nodes"][0]
    node = devnodes.node_manifest(spec, shares_per_card=3, now="2030-01-01T00:00:00Z")
    ann = node["metadata"]["annotations"]
    assert ann["kwok.x-k8s.io/node"] == "fake"
    assert ann[ANN_INVENTORY_HEARTBEAT] == "2030-01-01T00:00:00Z"
    raw = json.loads(ann[ANN_INVENTORY])
    assert raw["version"] == 1
    assert raw["cards"][0] == {
        "uuid": devnodes.card_uuid("gpu-x", 0),
        "index": 0,
        "model": "NVIDIA A100-SXM4-40GB",
        "memory_mib": 40960,
        "healthy": True,
        "numa_node": 0,
        "driver_memory_limit": False,  # the simulated nodes' drivers are before r615
    }
    assert [c["numa_node"] for c in raw["cards"]] == [0, 0, 1, 1]
    assert len({c["uuid"] for c in raw["cards"]}) == 4
    assert devnodes.card_uuid("gpu-x", 0) == devnodes.card_uuid("gpu-x", 0)
    assert devnodes.card_uuid("gpu-x", 0) != devnodes.card_uuid("gpu-y", 0)
    for key in ("capacity", "allocatable"):
        res = node["status"][key]
        assert res == {"cpu": "64", "memory": "512Gi", "pods": "110", RES_GPU: "12"}
    assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "zone-a"
    assert "taints" not in node["spec"]


def test_scheduler_config_serves_the_egpu_profile_unless_told_not_to():
    """Bug caught: the egpu-scheduler profile missing from a dev cluster started with it (or
    present where egpu is installed and serves that name itself)."""
    plain = yaml.safe_load(devcluster.scheduler_config("/k"))
    assert [p["schedulerName"] for p in plain["profiles"]] == [
        "default-scheduler",
        "egpu-scheduler",
    ]
    assert plain["leaderElection"]["leaderElect"] is False
    assert "extenders" not in plain
    alone = yaml.safe_load(devcluster.scheduler_config("/k", egpu_profile=False))
    assert [p["schedulerName"] for p in alone["profiles"]] == ["default-scheduler"]


def test_pki(tmp_path):
    from cryptography import x509

    pki = ensure_pki(tmp_path / "pki")
    admin = x509.load_pem_x509_certificate((pki / "admin.crt").read_bytes())
    assert "O=system:masters" in admin.subject.rfc4514_string()
    api = x509.load_pem_x509_certificate((pki / "apiserver.crt").read_bytes())
    sans = api.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    before = (pki / "ca.crt").read_bytes()
    ensure_pki(pki)  # reused, not regenerated
    assert (pki / "ca.crt").read_bytes() == before


def test_status_of_empty_state_dir(tmp_path):
    st = devcluster.status(tmp_path)
    assert not st.recorded and not st.running and not st.up
    assert devcluster.down(tmp_path) == []


# --- against the dev cluster ------------------------------------------------------------


@pytest.mark.e2e
def test_nodes_carry_inventory(cluster):
    expected = {n["name"]: n for n in devnodes.load_cluster(cluster.inputs / "cluster.yaml")}
    assert len(expected) == 6
    out = json.loads(cluster.kubectl("get", "nodes", "-o", "json"))
    got = {item["metadata"]["name"]: item for item in out["items"]}
    assert set(expected) <= set(got)
    for name, spec in expected.items():
        node = got[name]
        ann = node["metadata"]["annotations"]
        inv = Inventory.decode(ann[ANN_INVENTORY])
        assert len(inv.cards) == spec["cards"]["count"]
        assert {c.model for c in inv.cards} == {spec["cards"]["model"]}
        assert {c.memory_mib for c in inv.cards} == {spec["cards"]["memoryMiB"]}
        assert [c.index for c in inv.cards] == list(range(spec["cards"]["count"]))
        assert all(c.uuid == devnodes.card_uuid(name, c.index) for c in inv.cards)
        assert ann[ANN_INVENTORY_HEARTBEAT].endswith("Z")
        assert node["status"]["allocatable"][RES_GPU] == str(spec["cards"]["count"] * 4)
        assert node["status"]["allocatable"]["cpu"] == "64"
        for key, value in (spec.get("labels") or {}).items():
            assert node["metadata"]["labels"][key] == value
        assert not node["spec"].get("taints")
    # kwok marks them Ready
    core = client.CoreV1Api(cluster.api_client())

    def all_ready() -> bool:
        for name in expected:
            conds = core.read_node(name).status.conditions or []
            if not any(c.type == "Ready" and c.status == "True" for c in conds):
                return False
        return True

    cluster.wait_for("all simulated nodes Ready", all_ready, timeout=60)


@pytest.mark.e2e
def test_cpu_only_pod_runs_on_a_simulated_node(cluster):
    manifest = cluster.inputs / "pods" / "08-cpu-only.yaml"
    pod = yaml.safe_load(manifest.read_text())
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    cluster.ensure_namespace(ns)
    cluster.kubectl("apply", "-f", str(manifest))
    core = client.CoreV1Api(cluster.api_client())
    try:

        def running():
            p = core.read_namespaced_pod(name, ns)
            return p if p.status.phase == "Running" else None

        p = cluster.wait_for(f"pod {ns}/{name} Running", running, timeout=90)
        assert p.spec.node_name in cluster.node_names
        assert p.spec.scheduler_name == "default-scheduler"
        out = cluster.kubectl("get", "pod", "-n", ns, name, "-o", "jsonpath={.status.phase}")
        assert out == "Running"
    finally:
        cluster.kubectl(
            "delete", "-f", str(manifest), "--wait=false", "--ignore-not-found", check=False
        )


@pytest.mark.e2e
def test_heartbeat_refresh(cluster):
    core = client.CoreV1Api(cluster.api_client())
    name = cluster.node_names[0]
    core.patch_node(
        name, {"metadata": {"annotations": {ANN_INVENTORY_HEARTBEAT: "2000-01-01T00:00:00Z"}}}
    )
    devnodes.refresh_heartbeats(cluster.api_client(), [name])
    stamp = core.read_node(name).metadata.annotations[ANN_INVENTORY_HEARTBEAT]
    assert stamp > "2020-01-01T00:00:00Z"


@pytest.mark.e2e
def test_a_node_made_again_without_a_device_plugin_offers_no_egpu_io_gpu(cluster, tmp_path):
    """create_nodes over an existing node with device_plugin=False (as `egpu demo --dra`
    makes its fleet): the node loses egpu.io/gpu, and its slices keep the shares a card it
    was made with. Bug caught: the status merge patch left out egpu.io/gpu, which keeps the
    old value (the DRA-only node still offered the device plugin's slots)."""
    from devcluster.dra import DevSliceStore
    from devcluster.kubeapi import api_request
    from egpu.dra.slices import CAPACITY_SHARES

    name = "gpu-no-device-plugin"
    nodes_file = tmp_path / "cluster.yaml"
    nodes_file.write_text(yaml.safe_dump({"nodes": [{"name": name, "cards": {
        "count": 2, "model": "NVIDIA A10", "memoryMiB": 23028}}]}))
    api = cluster.api_client()
    try:
        devnodes.create_nodes(api, nodes_file, shares_per_card=3, ready_timeout_s=0)
        node = api_request(api, "GET", f"/api/v1/nodes/{name}")
        assert node["status"]["allocatable"][RES_GPU] == "6"
        devnodes.create_nodes(api, nodes_file, shares_per_card=3, ready_timeout_s=0,
                              device_plugin=False)
        node = api_request(api, "GET", f"/api/v1/nodes/{name}")
        for part in ("capacity", "allocatable"):
            assert RES_GPU not in node["status"][part], node["status"][part]
        [body] = DevSliceStore(api).list_slices(name)
        assert [d["capacity"][CAPACITY_SHARES]["value"] for d in body["spec"]["devices"]] \
            == ["3", "3"]
    finally:
        with contextlib.suppress(devnodes.ApiError):
            api_request(api, "DELETE", f"/api/v1/nodes/{name}")
        for body in DevSliceStore(api).list_slices(name):
            DevSliceStore(api).delete_slice(body["metadata"]["name"])
