"""The DRA kubelet plugin (node_agent/draplugin): the pure core, the driver on disk, and the
gRPC edge over unix sockets as the kubelet v1.37 calls it (GetInfo, NotifyRegistrationStatus,
NodePrepareResources / NodeUnprepareResources in v1 and v1beta1)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from egpu.contract import ANN_ALLOCATION
from egpu.dra.shareconfig import ShareConfigError
from egpu.records import Card, PodShares
from node_agent.cdi import CdiPublisher
from node_agent.draplugin import claims
from node_agent.draplugin.claims import ClaimError
from node_agent.draplugin.driver import DraDriver
from node_agent.draplugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    registration_v1_pb2,
    registration_v1_pb2_grpc,
)
from node_agent.draplugin.service import KubeletPlugin
from node_agent.draplugin.state import ClaimStore
from node_agent.pods import PodRegistry

NODE = "node-a"
CARDS = (Card("GPU-AAAA-0001", 0, "NVIDIA H100 80GB HBM3", 81559),
         Card("GPU-BBBB-0002", 1, "NVIDIA H100 80GB HBM3", 81559))
CLAIM_UID = "c0ffee00-0000-4000-8000-000000000001"
POD_UID = "90d00000-0000-4000-8000-000000000001"


def share_claim(memory: str = "4Gi", cores: str = "30", config: Any = None,
                device: str = "gpu-aaaa-0001") -> dict[str, Any]:
    entries = [] if config is None else [{"source": "FromClaim", "requests": [],
                                          "opaque": {"driver": "gpu.egpu.io",
                                                     "parameters": config}}]
    return {
        "metadata": {"name": "share-pod-gpu-x", "namespace": "ml", "uid": CLAIM_UID},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "gpu", "driver": "gpu.egpu.io", "pool": NODE,
                             "device": device, "shareID": "5a5a5a5a-0000-4000-8000-1",
                             "consumedCapacity": {"memory": memory, "cores": cores}}],
                "config": entries}},
            "reservedFor": [{"resource": "pods", "name": "share-pod", "uid": POD_UID}]},
    }


def share_pod(containers: list[dict[str, Any]] | None = None,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "share-pod", "namespace": "ml", "uid": POD_UID,
                     "annotations": annotations or {}},
        "spec": {"nodeName": NODE,
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share"}],
                 "containers": containers if containers is not None else [
                     {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                     {"name": "logger"}]},
        "status": {"resourceClaimStatuses": [{"name": "gpu",
                                              "resourceClaimName": "share-pod-gpu-x"}]},
    }


# --- the pure core ----------------------------------------------------------------------------
def test_a_share_claim_gives_its_container_the_consumed_capacity() -> None:
    prepared = claims.prepare(share_claim(), [share_pod()], NODE, CARDS)
    assert prepared.config == claims.ShareConfig()
    (device,) = prepared.devices
    assert (device.uuid, device.memory_mib, device.cores, device.share_id) == (
        "GPU-AAAA-0001", 4096, 30, "5a5a5a5a-0000-4000-8000-1")
    shares = claims.pod_shares(POD_UID, [prepared], low_priority_floor=7)
    assert shares is not None
    assert [c.name for c in shares.allocation.containers] == ["main"]  # not "logger"
    card = shares.allocation.containers[0].cards[0]
    assert (card.uuid, card.index, card.memory_mib, card.cores) == ("GPU-AAAA-0001", 0, 4096, 30)
    assert (shares.priority, shares.compute_policy, shares.low_priority_floor) == (
        "high", "strict", 7)
    assert PodShares.decode(shares.encode()) == shares  # what the hook reads
    assert claims.request_envs(prepared) == {"gpu": {
        "EGPU_DEVICES": f"claim-{CLAIM_UID}-gpu", "NVIDIA_VISIBLE_DEVICES": "GPU-AAAA-0001"}}


def test_the_opaque_share_config_sets_the_pods_policies() -> None:
    config = {"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig", "priority": "low",
              "computePolicy": "elastic", "memoryOversubscription": True}
    prepared = claims.prepare(share_claim(config=config), [share_pod()], NODE, CARDS)
    shares = claims.pod_shares(POD_UID, [prepared])
    assert shares is not None
    assert (shares.priority, shares.compute_policy, shares.memory_oversubscription) == (
        "low", "elastic", True)


def test_a_bad_share_config_fails_with_its_message() -> None:
    config = {"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig", "priority": "urgent"}
    with pytest.raises(ShareConfigError, match=r"ShareConfig\.priority: 'urgent'; allowed: high"):
        claims.prepare(share_claim(config=config), [share_pod()], NODE, CARDS)


@pytest.mark.parametrize(("claim", "message"), [
    (share_claim(memory="4.5Mi"), "not a whole number of MiB"),
    (share_claim(cores="101"), "allowed: a whole number 0..100"),
    (share_claim(device="gpu-cccc-0003"), "no such card"),
    ({**share_claim(), "status": {}}, "is not allocated"),
])
def test_claims_that_cannot_be_prepared(claim: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        claims.prepare(claim, [share_pod()], NODE, CARDS)


def test_no_consumed_capacity_means_the_whole_card() -> None:
    claim = share_claim()
    del claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    (device,) = claims.prepare(claim, [share_pod()], NODE, CARDS).devices
    assert (device.memory_mib, device.cores) == (81559, 0)


def test_two_running_containers_on_one_claim_are_refused_an_init_container_is_not() -> None:
    both = [{"name": "a", "resources": {"claims": [{"name": "gpu"}]}},
            {"name": "b", "resources": {"claims": [{"name": "gpu"}]}}]
    with pytest.raises(ClaimError, match="run at the same time"):
        claims.prepare(share_claim(), [share_pod(both)], NODE, CARDS)
    pod = share_pod()
    pod["spec"]["initContainers"] = [{"name": "warmup",
                                      "resources": {"claims": [{"name": "gpu"}]}}]
    prepared = claims.prepare(share_claim(), [pod], NODE, CARDS)
    assert [(c.name, c.init) for c in prepared.pods[0].containers] == [
        ("warmup", True), ("main", False)]


def test_a_pod_of_the_extender_path_is_refused() -> None:
    with pytest.raises(ClaimError, match="use one or the other"):
        claims.prepare(share_claim(), [share_pod(annotations={ANN_ALLOCATION: "{}"})], NODE,
                       CARDS)


def test_state_round_trips() -> None:
    prepared = claims.prepare(share_claim(), [share_pod()], NODE, CARDS)
    assert claims.PreparedClaim.decode(prepared.encode()) == prepared


# --- the driver on disk -----------------------------------------------------------------------
class FakeReader:
    def __init__(self, claim: dict[str, Any], pod: dict[str, Any]) -> None:
        self.claim_obj, self.pod_obj = claim, pod
        self.reads = 0

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        if self.claim_obj is None:
            raise ClaimError(f"ResourceClaim {namespace}/{name} not found")
        return copy.deepcopy(self.claim_obj)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.pod_obj)


@pytest.fixture
def node_dirs(tmp_path: Path) -> dict[str, Path]:
    dirs = {k: tmp_path / k for k in ("private", "runtime", "cdi")}
    for d in dirs.values():
        d.mkdir()
    return dirs


def make_driver(dirs: dict[str, Path], reader: FakeReader) -> DraDriver:
    cdi = CdiPublisher(str(dirs["cdi"]), [str(dirs["cdi"])], "/usr/local/egpu/bin/egpu-hook",
                       present=lambda _p: False)
    cdi.publish(CARDS)
    return DraDriver(NODE, lambda: CARDS, reader, ClaimStore(str(dirs["private"])), cdi,
                     str(dirs["runtime"]), low_priority_floor=0)


def test_prepare_writes_the_pod_file_and_the_claim_cdi_spec_idempotently(
        node_dirs: dict[str, Path]) -> None:
    reader = FakeReader(share_claim(), share_pod())
    driver = make_driver(node_dirs, reader)
    (device,) = driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    assert device.cdi_device_ids == ("egpu.io/gpu=GPU-AAAA-0001",
                                     f"egpu.io/gpu=claim-{CLAIM_UID}-gpu")
    assert (device.pool, device.device, device.request) == (NODE, "gpu-aaaa-0001", "gpu")
    pod_file = node_dirs["private"] / "allocations" / f"{POD_UID}.json"
    shares = PodShares.decode(pod_file.read_text())
    assert shares.allocation.containers[0].cards[0].memory_mib == 4096
    assert oct(pod_file.stat().st_mode & 0o777) == "0o600"
    spec = json.loads((node_dirs["cdi"] / f"egpu-claim-{CLAIM_UID}.json").read_text())
    assert spec["kind"] == "egpu.io/gpu"
    assert spec["devices"][0]["containerEdits"]["env"] == [
        f"EGPU_DEVICES=claim-{CLAIM_UID}-gpu", "NVIDIA_VISIBLE_DEVICES=GPU-AAAA-0001"]
    assert driver.owns_pod(POD_UID)
    # again (the kubelet retries), and after a restart: same answer from the state, no read
    pod_file.unlink()
    again = make_driver(node_dirs, reader)
    assert again.prepare("ml", CLAIM_UID, "share-pod-gpu-x") == [device]
    assert reader.reads == 1
    assert pod_file.exists()  # rewritten
    assert again.owns_pod(POD_UID)
    assert again.shares()[POD_UID] == shares


def test_unprepare_removes_the_claims_files_and_unknown_claims_are_fine(
        node_dirs: dict[str, Path]) -> None:
    driver = make_driver(node_dirs, FakeReader(share_claim(), share_pod()))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    region = node_dirs["runtime"] / "containers" / f"{POD_UID}_main"
    region.mkdir(parents=True)
    restarted = make_driver(node_dirs, FakeReader(None, None))  # the claim is gone meanwhile
    restarted.unprepare(CLAIM_UID)
    leftovers = [p for p in node_dirs["private"].rglob("*") if p.is_file()]
    leftovers += [p for p in node_dirs["cdi"].iterdir() if p.name != "egpu.json"]
    assert leftovers == []
    assert not region.exists()
    assert not restarted.owns_pod(POD_UID)
    restarted.unprepare("never-prepared")


def test_a_bad_claim_writes_nothing(node_dirs: dict[str, Path]) -> None:
    bad = share_claim(config={"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig",
                              "priority": "urgent"})
    driver = make_driver(node_dirs, FakeReader(bad, share_pod()))
    with pytest.raises(ShareConfigError):
        driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    assert [p for p in node_dirs["private"].rglob("*") if p.is_file()] == []
    assert sorted(p.name for p in node_dirs["cdi"].iterdir()) == ["egpu.json"]


def test_a_claim_of_another_uid_is_refused(node_dirs: dict[str, Path]) -> None:
    driver = make_driver(node_dirs, FakeReader(share_claim(), share_pod()))
    with pytest.raises(ClaimError, match="deleted and created again"):
        driver.prepare("ml", "another-uid", "share-pod-gpu-x")


def test_the_pod_registry_leaves_the_plugins_pod_files_alone(
        node_dirs: dict[str, Path]) -> None:
    from egpu.config import Config

    driver = make_driver(node_dirs, FakeReader(share_claim(), share_pod()))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    registry = PodRegistry(NODE, Config(), str(node_dirs["private"]), str(node_dirs["runtime"]),
                           owned_elsewhere=driver.owns_pod)
    registry.resync([share_pod()])  # a DRA pod: no egpu.io/allocation
    assert (node_dirs["private"] / "allocations" / f"{POD_UID}.json").exists()


# --- the gRPC edge, as the kubelet calls it ---------------------------------------------------
@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a unix socket path has at most 107 characters."""
    path = Path(tempfile.mkdtemp(prefix="egpu-dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin(node_dirs: dict[str, Path], short_dir: Path):
    kubelet = short_dir / "kubelet"
    (kubelet / "plugins_registry").mkdir(parents=True)
    served = KubeletPlugin(make_driver(node_dirs, FakeReader(share_claim(), share_pod())),
                           str(kubelet))
    stop = threading.Event()
    thread = threading.Thread(target=served.run, args=(stop, 0.05), daemon=True)
    thread.start()
    deadline = 200
    while served.starts == 0 and deadline:
        stop.wait(0.02)
        deadline -= 1
    yield served
    stop.set()
    thread.join(5)


def test_registration_answers_what_the_kubelet_expects(plugin: KubeletPlugin) -> None:
    with grpc.insecure_channel(f"unix://{plugin.registration_socket}") as channel:
        stub = registration_v1_pb2_grpc.RegistrationStub(channel)
        info = stub.GetInfo(registration_v1_pb2.InfoRequest(), timeout=5)
        stub.NotifyRegistrationStatus(
            registration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin", "gpu.egpu.io", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
    assert info.endpoint == plugin.dra_socket
    assert plugin.registry_dir.endswith("plugins_registry")
    assert plugin.dra_socket.endswith("plugins/gpu.egpu.io/dra.sock")
    assert plugin.registration.registered == 1


@pytest.mark.parametrize(("pb", "grpc_mod"), [(dra_v1_pb2, dra_v1_pb2_grpc),
                                              (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)])
def test_prepare_and_unprepare_over_grpc(plugin: KubeletPlugin, pb: Any, grpc_mod: Any) -> None:
    claim = pb.Claim(namespace="ml", uid=CLAIM_UID, name="share-pod-gpu-x")
    with grpc.insecure_channel(f"unix://{plugin.dra_socket}") as channel:
        stub = grpc_mod.DRAPluginStub(channel)
        answer = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]),
                                           timeout=5)
        result = answer.claims[CLAIM_UID]
        assert result.error == ""
        (device,) = result.devices
        assert list(device.cdi_device_ids) == ["egpu.io/gpu=GPU-AAAA-0001",
                                               f"egpu.io/gpu=claim-{CLAIM_UID}-gpu"]
        assert (list(device.request_names), device.pool_name, device.device_name) == (
            ["gpu"], NODE, "gpu-aaaa-0001")
        if pb is dra_v1_pb2:
            assert device.share_id == "5a5a5a5a-0000-4000-8000-1"
        gone = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(
            claims=[claim, pb.Claim(namespace="ml", uid="unknown", name="x")]), timeout=5)
        assert {k: v.error for k, v in gone.claims.items()} == {CLAIM_UID: "", "unknown": ""}


def test_a_bad_claim_answers_its_error_over_grpc(node_dirs: dict[str, Path],
                                                 short_dir: Path) -> None:
    kubelet = short_dir / "k"
    (kubelet / "plugins_registry").mkdir(parents=True)
    bad = share_claim(config={"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig",
                              "priority": "urgent"})
    served = KubeletPlugin(make_driver(node_dirs, FakeReader(bad, share_pod())), str(kubelet))
    assert served.ensure()
    try:
        with grpc.insecure_channel(f"unix://{served.dra_socket}") as channel:
            answer = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(
                    namespace="ml", uid=CLAIM_UID, name="share-pod-gpu-x")]), timeout=5)
        error = answer.claims[CLAIM_UID].error
        assert "ShareConfig.priority: 'urgent'" in error, error
        assert not answer.claims[CLAIM_UID].devices
    finally:
        served.stop()


def test_the_plugin_serves_again_when_its_socket_vanishes_and_waits_for_the_kubelet(
        short_dir: Path, node_dirs: dict[str, Path]) -> None:
    served = KubeletPlugin(make_driver(node_dirs, FakeReader(share_claim(), share_pod())),
                           str(short_dir / "no-kubelet"))
    assert not served.ensure()  # no plugins_registry: no kubelet, nothing created
    assert not (short_dir / "no-kubelet").exists()
    os.makedirs(served.registry_dir)
    try:
        assert served.ensure() and not served.ensure()
        os.unlink(served.registration_socket)
        assert served.ensure() and served.starts == 2
        assert os.path.exists(served.registration_socket)
    finally:
        served.stop()


# --- the webhook's claims, prepared: one claim per pod, one request per container -------------
def _allocated(plan_template: dict[str, Any], card_of: dict[str, str]) -> dict[str, Any]:
    """A ResourceClaim of the template as the scheduler would allocate it: each request on the
    card ``card_of`` names, consuming what it asks (whole card memory when it asks none)."""
    results = []
    for r in plan_template["spec"]["spec"]["devices"]["requests"]:
        asked = r["exactly"].get("capacity", {}).get("requests", {})
        results.append({"request": r["name"], "driver": "gpu.egpu.io", "pool": NODE,
                        "device": card_of[r["name"]],
                        "consumedCapacity": {"memory": asked.get("memory", "81559Mi"),
                                             "cores": asked.get("cores", "0")}})
    claim = share_claim()
    claim["spec"] = plan_template["spec"]["spec"]
    claim["status"]["allocation"]["devices"] = {"results": results, "config": []}
    return claim


def _pod_with(plan: Any, pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the webhook patches it: one pod claim ``egpu``, each container naming its
    requests."""
    pod = copy.deepcopy(pod)
    pod["metadata"].update({"uid": POD_UID})
    pod["spec"]["nodeName"] = NODE
    pod["spec"]["resourceClaims"] = [{"name": "egpu", "resourceClaimTemplateName": "t"}]
    pod["status"] = {"resourceClaimStatuses": [{"name": "egpu",
                                                "resourceClaimName": "share-pod-gpu-x"}]}
    for key in ("initContainers", "containers"):
        for c in pod["spec"].get(key) or []:
            c["resources"] = {"claims": [{"name": "egpu", "request": r}
                                         for r in plan.requests_of(c["name"])]}
    return pod


def test_each_container_of_a_webhook_claim_gets_its_own_request() -> None:
    """FC-11: two app containers, one claim, a request each, on one card: each container's
    share is its own request's, not the claim's."""
    from egpu.dra.claims import plan_claims
    from egpu.requests import read_pod

    pod = {"metadata": {"name": "share-pod", "namespace": "ml"}, "spec": {"containers": [
        {"name": "embed", "resources": {"limits": {"egpu.io/gpu-memory": "6000",
                                                   "egpu.io/gpu-cores": "30"}}},
        {"name": "rerank", "resources": {"limits": {"egpu.io/gpu-memory": "4000",
                                                    "egpu.io/gpu-cores": "20"}}}]}}
    plan = plan_claims(read_pod(pod).request)
    template = plan.template_in("ml")
    requests = [r["name"] for r in template["spec"]["spec"]["devices"]["requests"]]
    claim = _allocated(template, dict.fromkeys(requests, "gpu-aaaa-0001"))
    prepared = claims.prepare(claim, [_pod_with(plan, pod)], NODE, CARDS)
    shares = {c.name: [(s.memory_mib, s.cores) for s in c.cards]
              for c in prepared.pods[0].containers}
    assert shares == {"embed": [(6000, 30)], "rerank": [(4000, 20)]}


def test_an_init_container_of_a_webhook_claim_gets_its_partner_and_headroom() -> None:
    """FC-07 (input 06): the init container names the app container's request and a headroom
    on the same card: its share is their sum (12000 MiB), the app container's its own."""
    import yaml

    from egpu.dra.claims import plan_claims
    from egpu.requests import read_pod

    pod = yaml.safe_load((Path(__file__).resolve().parents[3] / "shared" / "inputs" / "pods"
                          / "06-init-container-gpu.yaml").read_text())
    plan = plan_claims(read_pod(pod).request)
    template = plan.template_in("ml-serving")
    requests = [r["name"] for r in template["spec"]["spec"]["devices"]["requests"]]
    claim = _allocated(template, dict.fromkeys(requests, "gpu-aaaa-0001"))
    prepared = claims.prepare(claim, [_pod_with(plan, pod)], NODE, CARDS)
    shares = {c.name: [s.memory_mib for s in c.cards] for c in prepared.pods[0].containers}
    assert shares == {"compile-engine": [12000], "ocr": [8000]}


def test_two_running_containers_naming_one_request_are_refused() -> None:
    both = [{"name": "a", "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}},
            {"name": "b", "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}]
    with pytest.raises(ClaimError, match="both name request 'gpu'"):
        claims.prepare(share_claim(), [share_pod(both)], NODE, CARDS)
