"""The webhook in DRA mode: claims from pod specs (docs/dra.md "Claims from pod specs").

The review (pure): the same denials as the extender path, the pod pointed at its own claim,
the egpu resources gone, every shared input landing as one claim. The HTTP edge (aiohttp test
client, a fake ``ClaimStore``): the claim created before the answer, never for a dry run, a
pod refused when it cannot be, non-GPU pods never touched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer

from egpu.config import Config
from egpu.contract import DRA_POD_CLAIM, EGPU_RESOURCES, VOLCANO_ALIASES
from egpu.dra.claims import ClaimPlanError
from tests.conftest import SHARED
from webhook.claimstore import ClaimStoreError, card_sizes_of
from webhook.review import decide_pod
from webhook.server import ConfigSource, Settings, create_app

from .support import admission_review, answer, container, decoded_patch, input_pods, make_pod

DRA = Config(allocation_mode="dra")
GPU = {"egpu.io/gpu": "1", "egpu.io/gpu-memory": "3000", "egpu.io/gpu-cores": "30"}
SIZES = (81559, 40960, 23028, 15360)
OURS = {*EGPU_RESOURCES, *VOLCANO_ALIASES}


def _admitted(pod: dict[str, Any], config: Config = DRA, namespace: str = "team"
              ) -> tuple[dict[str, Any], Any]:
    decision = decide_pod(pod, config, namespace, lambda: SIZES)
    assert decision.allowed, decision.message
    return jsonpatch.apply_patch(pod, decision.patch), decision


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


INPUTS = sorted((SHARED / "inputs" / "pods").glob("*.yaml"))


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_every_input_is_decided_as_in_extender_mode_and_shares_become_one_claim(
        path: Path) -> None:
    for label, pod in input_pods(path):
        extender = decide_pod(pod, Config(), pod["metadata"]["namespace"])
        dra = decide_pod(pod, DRA, pod["metadata"]["namespace"], lambda: SIZES)
        assert dra.allowed == extender.allowed, label
        assert (dra.message, dra.code, dra.denials) == (
            extender.message, extender.code, extender.denials), label
        if not dra.allowed or not extender.patch:
            assert not dra.patch and not dra.claims, label
            continue
        new = jsonpatch.apply_patch(pod, dra.patch)
        [claim] = dra.claims
        assert claim["kind"] == "ResourceClaim"
        assert claim["metadata"]["namespace"] == pod["metadata"]["namespace"]
        assert new["spec"]["resourceClaims"] == [{
            "name": DRA_POD_CLAIM, "resourceClaimName": claim["metadata"]["name"]}]
        assert "schedulerName" not in new["spec"], label  # the kube-scheduler's
        request_names = {r["name"] for r in claim["spec"]["devices"]["requests"]}
        for c in _containers(new):
            resources = c.get("resources", {})
            for key in ("limits", "requests"):
                assert not OURS & set(resources.get(key, {})), (label, c["name"])
            for claim in resources.get("claims", []):
                assert claim["name"] == DRA_POD_CLAIM and claim["request"] in request_names
        # a second pass changes nothing (no egpu resource is left)
        again = decide_pod(new, DRA, pod["metadata"]["namespace"], lambda: SIZES)
        assert again.allowed and not again.patch and not again.claims


def test_the_patch_keeps_other_resources_and_sets_label_and_env() -> None:
    pod = make_pod(container(limits={**GPU, "cpu": "1"}))
    pod["spec"]["containers"][0]["resources"]["requests"] = {**GPU, "cpu": "1"}
    new, decision = _admitted(pod)
    [c] = new["spec"]["containers"]
    assert c["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"},
                              "claims": [{"name": DRA_POD_CLAIM, "request": "c"}]}
    assert new["metadata"]["labels"]["egpu.io/priority"] == "high"
    assert {e["name"]: e["value"] for e in c["env"]}["EGPU_COMPUTE_POLICY"] == "strict"
    assert not decision.warnings


def test_volcano_names_become_the_same_claim_as_egpu_names() -> None:
    volcano = make_pod(container(limits={"volcano.sh/vgpu-number": "1",
                                         "volcano.sh/vgpu-memory": "3000",
                                         "volcano.sh/vgpu-cores": "30"}))
    _, by_alias = _admitted(volcano)
    _, by_name = _admitted(make_pod(container(limits=GPU)))
    assert by_alias.claims == by_name.claims


def test_the_mode_follows_the_pod_then_the_namespace_then_the_config() -> None:
    pod = make_pod(container(limits=GPU))
    by_namespace = Config(namespace_allocation_modes={"team": "dra"})
    assert decide_pod(pod, by_namespace, "team").claims
    assert not decide_pod(pod, by_namespace, "other").claims
    opted_out = make_pod(container(limits=GPU), annotations={"egpu.io/allocation-mode":
                                                             "extender"})
    extender = decide_pod(opted_out, DRA, "team")
    assert not extender.claims
    assert {"op": "add", "path": "/spec/schedulerName", "value": "egpu-scheduler"} in (
        extender.patch)


def test_denials_are_those_of_the_extender_path() -> None:
    bad = make_pod(container(limits={"egpu.io/gpu": "1", "egpu.io/gpu-cores": "150"}))
    response = answer(bad, DRA)
    assert not response["allowed"] and response["status"]["code"] == 400
    assert "egpu.io/gpu-cores='150' is not allowed (out of range)" in response["status"][
        "message"]
    privileged = make_pod(container(limits=GPU, securityContext={"privileged": True}))
    assert answer(privileged, DRA)["status"]["code"] == 403


def test_dra_only_denials_say_what_to_change() -> None:
    taken = make_pod(container(limits=GPU), resourceClaims=[{
        "name": DRA_POD_CLAIM, "resourceClaimTemplateName": "mine"}])
    decision = decide_pod(taken, DRA, "team")
    assert not decision.allowed and decision.code == 400 and decision.denials == ("claim",)
    assert "spec.resourceClaims[].name='egpu' is not allowed" in decision.message
    percentage = make_pod(container(limits={"egpu.io/gpu-memory-percentage": "25"}))
    decision = decide_pod(percentage, DRA, "team")  # no card sizes known
    assert not decision.allowed and "egpu.io/gpu-memory in MiB" in decision.message

    def unreadable() -> tuple[int, ...]:
        raise ClaimPlanError("reading the ResourceSlices failed (503)")

    decision = decide_pod(percentage, DRA, "team", unreadable)
    assert not decision.allowed and "503" in decision.message


def test_an_own_claim_beside_egpus_is_kept_and_placement_policies_warn() -> None:
    pod = make_pod(container(limits=GPU, resources=None), annotations={
        "egpu.io/gpu-policy": "spread"}, resourceClaims=[{"name": "nic",
                                                          "resourceClaimName": "nic-1"}])
    pod["spec"]["containers"][0]["resources"] = {"limits": GPU, "claims": [{"name": "nic"}]}
    new, decision = _admitted(pod)
    assert [c["name"] for c in new["spec"]["resourceClaims"]] == ["nic", DRA_POD_CLAIM]
    assert new["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "nic"}, {"name": DRA_POD_CLAIM, "request": "c"}]
    assert decision.warnings == ("pod annotation egpu.io/gpu-policy is not applied in DRA "
                                 "mode (the kube-scheduler chooses the node and the card)",)


def test_card_sizes_are_read_from_the_drivers_slices() -> None:
    slices = [{"spec": {"driver": "gpu.egpu.io", "devices": [
        {"attributes": {"memoryMiB": {"int": 15360}}},
        {"attributes": {"memoryMiB": {"int": 81559}}},
        {"attributes": {}}]}},
        {"spec": {"driver": "other.example.com", "devices": [
            {"attributes": {"memoryMiB": {"int": 1}}}]}}]
    assert card_sizes_of(slices) == (81559, 15360)


# --- the HTTP edge ---------------------------------------------------------------------------

class FakeStore:
    """A ClaimStore in memory: the claims it was asked for; ``fail`` makes it refuse."""

    def __init__(self, fail: str = "") -> None:
        self.claims: list[dict[str, Any]] = []
        self.fail = fail

    def create_claim(self, claim: dict[str, Any]) -> None:
        if self.fail:
            raise ClaimStoreError(self.fail)
        self.claims.append(claim)

    def card_sizes_mib(self) -> tuple[int, ...]:
        return SIZES


@pytest.fixture
def store() -> FakeStore:
    return FakeStore()


@pytest.fixture
async def client(store: FakeStore) -> AsyncIterator[TestClient]:
    settings = Settings(config=ConfigSource(config=DRA), claims=store)
    async with TestClient(TestServer(create_app(settings))) as c:
        yield c


async def _review(client: TestClient, pod: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    resp = await client.post("/mutate", json=admission_review(pod, **kwargs))
    assert resp.status == 200
    return dict((await resp.json())["response"])


async def test_the_pods_own_claim_is_created_before_the_pod_is_admitted(
        client: TestClient, store: FakeStore) -> None:
    pod = make_pod(container(limits={"egpu.io/gpu-memory-percentage": "25"}))
    response = await _review(client, pod, uid="req-1")
    assert response["allowed"]
    [claim] = store.claims
    assert claim["metadata"]["namespace"] == "team"
    # the allocation finalizer is there already: the kube-scheduler skips writing it
    assert claim["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
    assert claim["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "egpu-webhook"
    claims = [op for op in decoded_patch(response) if op["path"] == "/spec/resourceClaims"]
    assert claims[0]["value"][0]["resourceClaimName"] == claim["metadata"]["name"]
    # another admission request (another replica of the same shape): another claim
    await _review(client, pod, uid="req-2")
    assert len({c["metadata"]["name"] for c in store.claims}) == 2


async def test_a_dry_run_creates_nothing(client: TestClient, store: FakeStore) -> None:
    response = await _review(client, make_pod(container(limits=GPU)), dry_run=True)
    assert response["allowed"] and decoded_patch(response)
    assert store.claims == []


async def test_a_pod_whose_claim_cannot_be_made_is_refused_and_cpu_pods_never_are(
        store: FakeStore) -> None:
    store.fail = "ResourceClaim team/p-egpu-0: creating it failed: 403 Forbidden"
    settings = Settings(config=ConfigSource(config=DRA), claims=store)
    async with TestClient(TestServer(create_app(settings))) as client:
        response = await _review(client, make_pod(container(limits=GPU)))
        assert not response["allowed"] and response["status"]["code"] == 500
        assert "403 Forbidden" in response["status"]["message"]
        assert "refused" in response["status"]["message"]
        cpu = await _review(client, make_pod(container(limits={"cpu": "1"})))
        assert cpu["allowed"] and "patch" not in cpu
        metrics = await (await client.get("/metrics")).text()
        assert 'egpu_webhook_denials_total{reason="claim"} 1.0' in metrics


async def test_without_api_access_a_dra_pod_is_refused_with_the_reason() -> None:
    async with TestClient(TestServer(create_app(Settings(
            config=ConfigSource(config=DRA))))) as client:
        response = await _review(client, make_pod(container(limits=GPU)))
        assert not response["allowed"]
        assert "no Kubernetes API access for DRA mode" in response["status"]["message"]
