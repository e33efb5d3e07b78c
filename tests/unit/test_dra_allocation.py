"""The one decoder of an allocated ResourceClaim of driver gpu.egpu.io (egpu/dra/allocation.py):
its results and ShareConfig -> the cards, MiB and cores each container of its pods gets, the
pods' allocation files (what the node agent prepares) and the claim state; the same reading
serves ``kubectl egpu`` (tests/unit/test_cluster_view.py)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from egpu.contract import ANN_ALLOCATION, claim_share_dir_name
from egpu.dra import allocation
from egpu.dra.allocation import ClaimError
from egpu.dra.shareconfig import ShareConfig, ShareConfigError
from egpu.records import PodShares
from tests.dra_objects import CARDS, CLAIM_UID, NODE, POD_UID, share_claim, share_pod


def test_a_share_claim_gives_its_container_the_consumed_capacity() -> None:
    prepared = allocation.prepare(share_claim(), [share_pod()], NODE, CARDS)
    assert prepared.config == ShareConfig()
    (device,) = prepared.devices
    assert (device.uuid, device.memory_mib, device.cores, device.share_id) == (
        "GPU-AAAA-0001", 4096, 30, "5a5a5a5a-0000-4000-8000-1")
    shares = allocation.pod_shares(POD_UID, [prepared], low_priority_floor=7)
    assert shares is not None
    assert [c.name for c in shares.allocation.containers] == ["main"]  # not "logger"
    card = shares.allocation.containers[0].cards[0]
    assert (card.uuid, card.index, card.memory_mib, card.cores) == ("GPU-AAAA-0001", 0, 4096, 30)
    assert (shares.priority, shares.compute_policy, shares.low_priority_floor) == (
        "high", "strict", 7)
    assert PodShares.decode(shares.encode()) == shares  # what the hook reads


def test_the_opaque_share_config_sets_the_pods_policies() -> None:
    config = {"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig", "priority": "low",
              "computePolicy": "elastic", "memoryOversubscription": True}
    prepared = allocation.prepare(share_claim(config=config), [share_pod()], NODE, CARDS)
    shares = allocation.pod_shares(POD_UID, [prepared])
    assert shares is not None
    assert (shares.priority, shares.compute_policy, shares.memory_oversubscription) == (
        "low", "elastic", True)


def test_a_bad_share_config_fails_with_its_message() -> None:
    config = {"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig", "priority": "urgent"}
    with pytest.raises(ShareConfigError, match=r"ShareConfig\.priority: 'urgent'; allowed: high"):
        allocation.prepare(share_claim(config=config), [share_pod()], NODE, CARDS)


@pytest.mark.parametrize(("claim", "message"), [
    (share_claim(memory="4.5Mi"), "not a whole number of MiB"),
    (share_claim(cores="101"), "allowed: a whole number 0..100"),
    (share_claim(device="gpu-cccc-0003"), "no such card"),
    ({**share_claim(), "status": {}}, "is not allocated"),
])
def test_claims_that_cannot_be_prepared(claim: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        allocation.prepare(claim, [share_pod()], NODE, CARDS)


def _admin_access_claim(value: Any = True) -> dict[str, Any]:
    """/tmp/review_placement/r4: a share claim whose request and result ask adminAccess."""
    claim = share_claim(memory="81559Mi", cores="100")
    claim["spec"]["devices"]["requests"][0]["exactly"] = {
        "deviceClassName": "share.gpu.egpu.io", "adminAccess": value}
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = value
    return claim


def test_an_admin_access_result_is_refused_at_prepare_saying_what_to_do_instead() -> None:
    """kube-scheduler does not count an adminAccess result as allocated (its memory and cores
    are free for every later claim): prepared as a share, it would overbook the card."""
    with pytest.raises(ClaimError) as info:
        allocation.prepare(_admin_access_claim(), [share_pod()], NODE, CARDS)
    message = str(info.value)
    assert message.startswith("ResourceClaim ml/share-pod-gpu-x result 0 (device "
                              "'gpu-aaaa-0001'): adminAccess: True: admin access is not "
                              "supported by the gpu.egpu.io driver"), message
    assert "kubectl egpu" in message and "exporter" in message and "without adminAccess" in (
        message)
    with pytest.raises(ClaimError, match="admin access is not supported"):  # the cluster view
        allocation.claim_devices(_admin_access_claim(), NODE, CARDS, healthy_only=False)


def test_a_result_with_admin_access_false_is_an_ordinary_share() -> None:
    (device,) = allocation.prepare(_admin_access_claim(False), [share_pod()], NODE, CARDS).devices
    assert (device.memory_mib, device.cores) == (81559, 100)


def test_no_consumed_capacity_means_the_whole_card() -> None:
    claim = share_claim()
    del claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    (device,) = allocation.prepare(claim, [share_pod()], NODE, CARDS).devices
    assert (device.memory_mib, device.cores) == (81559, 0)


def test_the_share_a_result_consumed_of_the_card_changes_nothing_on_the_node() -> None:
    """The scheduler records each result's one ``shares`` (egpu.dra.slices.CAPACITY_SHARES)
    in consumedCapacity: it bounds how many allocations a card takes, and gives the container
    no memory or cores."""
    claim = share_claim()
    claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["shares"] = "1"
    assert (allocation.prepare(claim, [share_pod()], NODE, CARDS)
            == allocation.prepare(share_claim(), [share_pod()], NODE, CARDS))


def test_an_unhealthy_card_is_never_prepared_but_still_read_for_the_cluster_view() -> None:
    """The kubelet plugin refuses a claim on an unhealthy card; ``kubectl egpu`` shows what it
    books there (``healthy_only=False``), with the same reading of its capacity."""
    sick = (dataclasses.replace(CARDS[0], healthy=False), CARDS[1])
    with pytest.raises(ClaimError, match="is unhealthy"):
        allocation.claim_devices(share_claim(), NODE, sick)
    (device,) = allocation.claim_devices(share_claim(), NODE, sick, healthy_only=False)
    assert (device.uuid, device.memory_mib, device.cores) == ("GPU-AAAA-0001", 4096, 30)


def test_the_pool_is_the_node_of_the_first_egpu_result() -> None:
    claim = share_claim()
    results = claim["status"]["allocation"]["devices"]["results"]
    results.insert(0, {"request": "nic", "driver": "net.example.com", "pool": "elsewhere",
                       "device": "eth0"})
    assert allocation.claim_pool(claim) == NODE
    assert [i for i, _ in allocation.allocation_results(claim)] == [1]
    (device,) = allocation.claim_devices(claim, NODE, CARDS)  # the other driver's left out
    assert device.device == "gpu-aaaa-0001"
    assert allocation.claim_pool({**claim, "status": {}}) is None
    with pytest.raises(ClaimError, match="is not this node's"):
        allocation.claim_devices(claim, "node-b", CARDS)


def test_a_pod_names_its_claims_by_template_by_name_and_by_extended_resource() -> None:
    pod = share_pod()
    pod["spec"]["resourceClaims"] += [{"name": "own", "resourceClaimName": "hand-written"},
                                      {"name": "late", "resourceClaimTemplateName": "t"}]
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "share-pod-extended-resources-xyz",
        "requestMappings": [{"containerName": "main", "resourceName": "egpu.io/gpu",
                             "requestName": "container-0-request-0"}]}
    # "late": a template whose claim is not created yet (no status entry) is left out
    assert allocation.pod_claim_names(pod) == (
        "share-pod-gpu-x", "hand-written", "share-pod-extended-resources-xyz")
    assert allocation.pod_claim_names({"metadata": {}}) == ()


def test_containers_naming_one_claim_draw_on_one_folder_an_init_container_too() -> None:
    """Issue 24: a model server and its sidecar on one claim share its allocation: both (and
    an init container naming it) get the claim's folder, one budget, not a folder each (the
    bug: each container was given the whole share, twice the booking)."""
    both = [{"name": "a", "resources": {"claims": [{"name": "gpu"}]}},
            {"name": "b", "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}]
    pod = share_pod(both)
    pod["spec"]["initContainers"] = [{"name": "warmup",
                                      "resources": {"claims": [{"name": "gpu"}]}}]
    prepared = allocation.prepare(share_claim(), [pod], NODE, CARDS)
    folder = claim_share_dir_name(CLAIM_UID, ["gpu"])
    assert folder == f"claim-{CLAIM_UID}_gpu"
    assert [(c.name, c.init, c.kind, c.share) for c in prepared.pods[0].containers] == [
        ("warmup", True, "init", folder), ("a", False, "container", folder),
        ("b", False, "container", folder)]
    assert {c.cards[0].memory_mib for c in prepared.pods[0].containers} == {4096}


def _two_request_claim() -> dict[str, Any]:
    claim = share_claim()
    claim["spec"]["devices"]["requests"].append({"name": "extra"})
    results = claim["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "request": "extra", "shareID": "5a5a5a5a-0000-4000-8000-2",
                    "consumedCapacity": {"memory": "1Gi", "cores": "10"}})
    return claim


def test_running_containers_naming_overlapping_requests_are_refused() -> None:
    """One container naming the claim whole (gpu + extra) and one naming gpu would hold gpu
    twice (two budgets over one booking): refused, within a pod and across pods."""
    overlap = [{"name": "a", "resources": {"claims": [{"name": "gpu"}]}},
               {"name": "b", "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}]
    with pytest.raises(ClaimError, match="overlapping but different requests"):
        allocation.prepare(_two_request_claim(), [share_pod(overlap)], NODE, CARDS)
    other = share_pod(overlap[1:])
    other["metadata"].update(name="other", uid="pod-2")
    with pytest.raises(ClaimError, match=r"pod ml/share-pod container 'a' and pod ml/other "):
        allocation.prepare(_two_request_claim(), [share_pod(overlap[:1]), other], NODE, CARDS)
    # disjoint requests are a budget each; an init container may overlap (it runs first)
    disjoint = [{"name": "a", "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}},
                {"name": "b", "resources": {"claims": [{"name": "gpu", "request": "extra"}]}}]
    pod = share_pod(disjoint)
    pod["spec"]["initContainers"] = [{"name": "warmup",
                                      "resources": {"claims": [{"name": "gpu"}]}}]
    prepared = allocation.prepare(_two_request_claim(), [pod], NODE, CARDS)
    assert [(c.name, c.share, [(s.memory_mib, s.cores) for s in c.cards])
            for c in prepared.pods[0].containers] == [
        ("warmup", f"claim-{CLAIM_UID}_extra.gpu", [(5120, 40)]),
        ("a", f"claim-{CLAIM_UID}_gpu", [(4096, 30)]),
        ("b", f"claim-{CLAIM_UID}_extra", [(1024, 10)])]


def test_the_claims_shares_file_offers_what_a_later_pod_may_join() -> None:
    """The hook's record for pods that join a prepared claim: the request sets the prepared
    pods' running containers use, and each request nobody names alone; never a set an init
    container alone uses (a joiner would run beside it, holding its requests twice)."""
    pod = share_pod([{"name": "a", "resources": {"claims": [{"name": "gpu",
                                                             "request": "gpu"}]}}])
    prepared = allocation.prepare(_two_request_claim(), [pod], NODE, CARDS)
    shares = allocation.claim_shares(prepared, low_priority_floor=5)
    assert (shares.namespace, shares.pod, shares.pod_uid, shares.low_priority_floor) == (
        "ml", "share-pod-gpu-x", CLAIM_UID, 5)
    assert [(c.name, c.share, [(s.memory_mib, s.cores) for s in c.cards])
            for c in shares.allocation.containers] == [
        ("gpu", f"claim-{CLAIM_UID}_gpu", [(4096, 30)]),
        ("extra", f"claim-{CLAIM_UID}_extra", [(1024, 10)])]
    assert PodShares.decode(shares.encode()) == shares  # what the hook reads
    init_only = share_pod([])
    init_only["spec"]["initContainers"] = [{"name": "warmup",
                                            "resources": {"claims": [{"name": "gpu"}]}}]
    prepared = allocation.prepare(_two_request_claim(), [init_only], NODE, CARDS)
    assert allocation.claim_shares(prepared).allocation.containers == ()


def test_a_pod_of_the_extender_path_is_refused() -> None:
    with pytest.raises(ClaimError, match="use one or the other"):
        allocation.prepare(share_claim(), [share_pod(annotations={ANN_ALLOCATION: "{}"})],
                           NODE, CARDS)


def test_state_round_trips() -> None:
    prepared = allocation.prepare(share_claim(), [share_pod()], NODE, CARDS)
    assert allocation.PreparedClaim.decode(prepared.encode()) == prepared


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
    request = read_pod(pod).request
    assert request is not None
    plan = plan_claims(request)
    template = plan.template_in("ml")
    requests = [r["name"] for r in template["spec"]["spec"]["devices"]["requests"]]
    claim = _allocated(template, dict.fromkeys(requests, "gpu-aaaa-0001"))
    prepared = allocation.prepare(claim, [_pod_with(plan, pod)], NODE, CARDS)
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
    request = read_pod(pod).request
    assert request is not None
    plan = plan_claims(request)
    template = plan.template_in("ml-serving")
    requests = [r["name"] for r in template["spec"]["spec"]["devices"]["requests"]]
    claim = _allocated(template, dict.fromkeys(requests, "gpu-aaaa-0001"))
    prepared = allocation.prepare(claim, [_pod_with(plan, pod)], NODE, CARDS)
    shares = {c.name: [s.memory_mib for s in c.cards] for c in prepared.pods[0].containers}
    assert shares == {"compile-engine": [12000], "ocr": [8000]}
