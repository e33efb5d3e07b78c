"""Claims from pod specs on the dev cluster: the webhook in DRA mode (``allocationMode: dra``)
against the real kube-apiserver and kube-scheduler (v1.37.2, ``cluster`` fixture).

The webhook runs as its own process (``--config`` with ``allocationMode: dra``,
``--kubeconfig`` of the dev cluster) for this module's namespace only; the simulated fleet
publishes its ResourceSlices (``devcluster.dra``) and the DeviceClasses of
``manifests/dra/deviceclasses.yaml`` are applied. Pods are written as their authors write them
(``egpu.io/*``, Volcano names); the webhook makes each pod's own ResourceClaim and the default
scheduler allocates the claims. Checks: every shared input that asks for a share lands as its
comment says (node, card, consumed capacity, ShareConfig); a dry run creates no claim; an
impossible UUID filter stays Pending; bursts of pods created at once never book a card past its
capacity; no claim is left behind by a deleted pod, a pod refused after the webhook, or a
webhook that died between its claim and its answer (the sweeper, with a grace of
``SWEEP_GRACE_S`` here).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs.issue import create_ca, create_serving, write_bundle
from devcluster import cluster as devcluster
from devcluster import nodes as devnodes
from devcluster.dra import publish_node_slices
from egpu.contract import DRA_DRIVER, RES_GPU
from egpu.dra.shareconfig import ShareConfig
from egpu.dra.slices import MIB, parse_quantity
from egpu.workloads import pod_templates
from tests.e2e.conftest import E2ECluster
from tests.e2e.test_webhook_e2e import WebhookProcess, _free_port
from webhook.registration import configuration_for_url

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEVICE_CLASSES = REPO / "manifests" / "dra" / "deviceclasses.yaml"
NAMESPACE = "egpu-dra-claims"
CONFIG_NAME = "egpu-webhook-dra-claims"
NODE = "egpu-dra-claims-burst"
A10 = ("NVIDIA A10", 23028)
SCHEDULE_S = 90.0
# the sweeper's grace here: a claim is older than this before it may go (the product's
# default is 120 s); long enough for a pod's create to finish on a loaded machine
SWEEP_GRACE_S = 15
SWEPT_S = 90.0  # within this a claim no pod can use is gone (grace, sweeps, the finalizer)
V1 = "/apis/resource.k8s.io/v1"


class Env:
    """The API as plain JSON in this module's namespace."""

    def __init__(self, cluster: E2ECluster) -> None:
        self.cluster = cluster
        self.client = cluster.api_client()
        self.webhook: WebhookProcess | None = None

    def api(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        return devnodes.api_request(self.client, method, path, body, query=query or None)

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    def pod(self, name: str) -> dict[str, Any]:
        return self.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")

    def claim_of(self, pod: dict[str, Any]) -> dict[str, Any]:
        [entry] = pod["spec"].get("resourceClaims") or [{}]
        name = entry.get("resourceClaimName")
        assert name, f"pod {pod['metadata']['name']} names no claim: {pod['spec']}"
        return self.api("GET", f"{V1}/namespaces/{NAMESPACE}/resourceclaims/{name}")

    def claims(self) -> list[str]:
        body = self.api("GET", f"{V1}/namespaces/{NAMESPACE}/resourceclaims")
        return [t["metadata"]["name"] for t in body["items"]]

    def device_memory_mib(self) -> dict[tuple[str, str], int]:
        """(pool, device) -> the card's memoryMiB attribute, over the fleet's slices."""
        out = {}
        for body in self.api("GET", f"{V1}/resourceslices")["items"]:
            if body["spec"]["driver"] == DRA_DRIVER:
                for d in body["spec"].get("devices") or []:
                    out[(body["spec"]["pool"]["name"], d["name"])] = d["attributes"][
                        "memoryMiB"]["int"]
        return out

    def consumed(self, pool: str) -> dict[str, dict[str, Decimal]]:
        """Device -> capacity -> what every allocated claim of the cluster books of it."""
        booked: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
        for claim in self.api("GET", f"{V1}/resourceclaims")["items"]:
            for result in _results(claim):
                if result["driver"] == DRA_DRIVER and result["pool"] == pool:
                    for capacity, text in (result.get("consumedCapacity") or {}).items():
                        booked[result["device"]][capacity] += _q(text)
        return booked


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def _q(text: str) -> Decimal:
    value = parse_quantity(text)
    assert value is not None, text
    return value


def _scheduled(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName"))


def _unschedulable(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _share_config(claim: dict[str, Any]) -> ShareConfig:
    [config] = claim["spec"]["devices"]["config"]
    return ShareConfig.decode(config["opaque"]["parameters"])


def _mib(result: dict[str, Any]) -> Decimal:
    return _q(result["consumedCapacity"]["memory"]) / MIB


def _cores(result: dict[str, Any]) -> Decimal:
    return _q(result["consumedCapacity"]["cores"])


@pytest.fixture(scope="module")
def env(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    cluster.kubectl("apply", "-f", str(DEVICE_CLASSES))
    cluster.ensure_namespace(NAMESPACE)
    work = tmp_path_factory.mktemp("dra-claims")
    ca = create_ca()
    write_bundle(work, ca, create_serving(ca, ["127.0.0.1", "localhost"]))
    (work / "config.yaml").write_text("allocationMode: dra\n")
    process = WebhookProcess(work, _free_port(), (
        "--config", str(work / "config.yaml"), "--kubeconfig", cluster.kubeconfig,
        "--claim-grace-seconds", str(SWEEP_GRACE_S), "--claim-sweep-interval-seconds", "1"))
    process.start()
    admission = client.AdmissionregistrationV1Api(cluster.api_client())
    with_url = configuration_for_url(f"{process.url}/mutate", ca.cert_pem, name=CONFIG_NAME)
    for hook in with_url["webhooks"]:  # only this module's namespace
        hook["namespaceSelector"] = {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": [NAMESPACE]}]}
    with contextlib.suppress(ApiException):
        admission.delete_mutating_webhook_configuration(CONFIG_NAME)
    admission.create_mutating_webhook_configuration(with_url)
    handle = Env(cluster)
    handle.webhook = process
    try:
        counter = iter(range(10_000))

        def registered() -> bool:  # the API server notices the configuration within ~1 s
            body = _pod(f"probe-{next(counter)}", {RES_GPU: "1", "egpu.io/gpu-memory": "1"})
            body["spec"]["nodeSelector"] = {"egpu-e2e": "nowhere"}  # never placed
            return bool(handle.create_pod(body)["spec"].get("resourceClaims"))

        cluster.wait_for("the DRA-mode webhook to be called", registered, timeout=30)
        handle.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods",
                   gracePeriodSeconds=0)
        yield handle
    finally:
        with contextlib.suppress(ApiException):
            admission.delete_mutating_webhook_configuration(CONFIG_NAME)
        process.stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=90s",
                        check=False, timeout=120)
        with contextlib.suppress(devnodes.ApiError):
            handle.api("DELETE", f"/api/v1/nodes/{NODE}")


def _pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None,
         node: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "image": "egpu.local/pause:3.10",
                                     "resources": {"limits": limits}}],
                     "terminationGracePeriodSeconds": 0,
                     "nodeSelector": {"kubernetes.io/hostname": node} if node
                     else {"type": "kwok"}}}


def _input_pods(env: Env, name: str) -> list[dict[str, Any]]:
    """The pods of a shared input file as Pods in this module's namespace (kwok nodes)."""
    out = []
    text = (env.cluster.inputs / "pods" / name).read_text()
    for doc in yaml.safe_load_all(text):
        for index, template in enumerate(pod_templates(doc)):
            pod = json.loads(json.dumps(template.pod))
            metadata = pod.setdefault("metadata", {})
            metadata["name"] = f"in{name[:2]}-{metadata.get('name') or 'pod'}-{index}"
            metadata["namespace"] = NAMESPACE
            pod["apiVersion"], pod["kind"] = "v1", "Pod"
            pod["spec"]["restartPolicy"] = "Always"
            pod["spec"]["nodeSelector"] = {"type": "kwok"}
            pod["spec"]["terminationGracePeriodSeconds"] = 0
            out.append(pod)
    return out


def _landed(env: Env, pod: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                    dict[str, Any]]:
    name = pod["metadata"]["name"]
    created = env.create_pod(pod)
    assert created["spec"]["resourceClaims"][0]["name"] == "egpu", created["spec"]
    placed = devcluster.wait_until(f"{name} scheduled", lambda: (
        p := env.pod(name)) and _scheduled(p) and p, timeout=SCHEDULE_S)
    claim = env.claim_of(placed)
    return placed, _results(claim), claim


# --- the shared inputs, as their comments say -------------------------------------------------

def test_01_online_serving_lands_on_an_h100_or_a100_with_24000_mib_and_50_cores(
        env: Env) -> None:
    [pod] = _input_pods(env, "01-vllm-online.yaml")
    placed, [result], claim = _landed(env, pod)
    assert placed["spec"]["nodeName"].startswith(("gpu-h100-", "gpu-a100-"))
    assert (_mib(result), _cores(result)) == (24000, 50)
    assert _share_config(claim) == ShareConfig("high", "strict", False)
    assert placed["metadata"]["labels"]["egpu.io/priority"] == "high"


def test_02_offline_training_takes_two_distinct_cards_never_the_a10(env: Env) -> None:
    [pod] = _input_pods(env, "02-train-offline.yaml")
    placed, results, claim = _landed(env, pod)
    assert placed["spec"]["nodeName"] != "gpu-a10-a"
    assert len({r["device"] for r in results}) == len(results) == 2
    assert {r["pool"] for r in results} == {placed["spec"]["nodeName"]}
    assert all((_mib(r), _cores(r)) == (30000, 30) for r in results)
    assert _share_config(claim) == ShareConfig("low", "elastic", False)


def test_03_a_memory_percentage_books_that_share_of_the_chosen_card(env: Env) -> None:
    [pod] = _input_pods(env, "03-notebook-percentage.yaml")
    _, [result], _ = _landed(env, pod)
    card_mib = env.device_memory_mib()[(result["pool"], result["device"])]
    assert _mib(result) == card_mib * 25 // 100 and _cores(result) == 10


def test_04_two_containers_each_book_their_own_share(env: Env) -> None:
    [pod] = _input_pods(env, "04-embed-rerank-two-containers.yaml")
    placed, results, _ = _landed(env, pod)
    by_request = {r["request"]: (_mib(r), _cores(r)) for r in results}
    assert by_request == {"embedding": (4000, 10), "reranker": (6000, 10)}
    claims = {c["name"]: c["resources"]["claims"] for c in placed["spec"]["containers"]}
    assert claims == {"embedding": [{"name": "egpu", "request": "embedding"}],
                      "reranker": [{"name": "egpu", "request": "reranker"}]}


def test_05_oversubscription_is_in_the_share_config(env: Env) -> None:
    [pod] = _input_pods(env, "05-tts-oversubscribed.yaml")
    _, [result], claim = _landed(env, pod)
    assert (_mib(result), _cores(result)) == (32000, 20)
    assert _share_config(claim).memory_oversubscription is True


def test_06_the_init_container_books_max_of_init_and_app_on_one_card(env: Env) -> None:
    [pod] = _input_pods(env, "06-init-container-gpu.yaml")
    placed, results, _ = _landed(env, pod)
    assert len({r["device"] for r in results}) == 1, results  # one card
    assert sum(_mib(r) for r in results) == 12000  # max(12000, 8000)
    assert sum(_cores(r) for r in results) == 100  # max(100, 20)
    [init] = placed["spec"]["initContainers"]
    assert [c["request"] for c in init["resources"]["claims"]] == ["ocr", "compile-engine"]


def test_07_volcano_names_book_like_egpu_names(env: Env) -> None:
    [pod] = _input_pods(env, "07-volcano-names.yaml")
    placed, [result], _ = _landed(env, pod)
    assert (_mib(result), _cores(result)) == (3000, 30)
    limits = placed["spec"]["containers"][0]["resources"].get("limits", {})
    assert not any(k.startswith(("volcano.sh/", "egpu.io/")) for k in limits)


def test_bad_requests_are_denied_with_the_same_messages(env: Env) -> None:
    for pod in _input_pods(env, "10-bad-requests.yaml"):
        with pytest.raises(devnodes.ApiError) as denied:
            env.create_pod(pod)
        assert denied.value.status == 400 and "is not allowed" in str(denied.value)


# --- dry run, an impossible filter --------------------------------------------------------------

def test_a_dry_run_creates_no_claim(env: Env) -> None:
    pod = _pod("dry", {"egpu.io/gpu-memory": "4321"})
    before = env.claims()
    result = subprocess.run(env.cluster.info.kubectl_argv(
        "create", "--dry-run=server", "-o", "json", "-f", "-"), input=json.dumps(pod),
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    name = json.loads(result.stdout)["spec"]["resourceClaims"][0]["resourceClaimName"]
    assert name.startswith("dry-egpu-")
    assert name not in env.claims() and env.claims() == before


def test_an_impossible_uuid_filter_stays_pending(env: Env) -> None:
    env.create_pod(_pod("no-such-card", {"egpu.io/gpu-memory": "1000"}, {
        "egpu.io/use-gpu-uuid": "GPU-00000000-0000-0000-0000-000000000000"}))
    devcluster.wait_until("no-such-card unschedulable",
                          lambda: _unschedulable(env.pod("no-such-card")), timeout=SCHEDULE_S)
    assert not _scheduled(env.pod("no-such-card"))


# --- bursts never overbook a card ---------------------------------------------------------------

@pytest.mark.parametrize("round_", range(3))
def test_a_burst_of_pods_never_books_a_card_past_its_capacity(env: Env, round_: int) -> None:
    """Two A10 cards (23028 MiB): 8 pods of 8000 MiB + 30% at once: 2 fit a card (3 x 8000 >
    23028), so exactly 4 are placed and 4 stay Pending, and no card is booked past it."""
    spec = {"name": NODE, "labels": {"egpu-e2e": "dra-claims"},
            "cards": {"count": 2, "model": A10[0], "memoryMiB": A10[1]}}
    if round_ == 0:
        # a DRA node: no device plugin
        devnodes.put_node(env.client, devnodes.node_manifest(spec, device_plugin=False))
        devnodes.wait_nodes_ready(env.client, [NODE], timeout_s=60)
        publish_node_slices(env.client, NODE, devnodes.inventory(spec).cards,
                            shares_per_card=devnodes.DEFAULT_SHARES_PER_CARD)
    names = [f"burst{round_}-{i}" for i in range(8)]
    pods = [_pod(n, {"egpu.io/gpu-memory": "8000", "egpu.io/gpu-cores": "30"}, node=NODE)
            for n in names]
    with ThreadPoolExecutor(len(pods)) as pool:
        list(pool.map(env.create_pod, pods))

    def now() -> list[dict[str, Any]]:
        return [env.pod(n) for n in names]

    devcluster.wait_until("4 burst pods placed, 4 unschedulable", lambda: (
        sum(map(_scheduled, p := now())) == 4 and sum(map(_unschedulable, p)) == 4),
        timeout=SCHEDULE_S)
    booked = env.consumed(NODE)
    assert len(booked) == 2
    for device, used in booked.items():
        assert used["memory"] == 2 * 8000 * MIB <= A10[1] * MIB, (device, used)
        assert used["cores"] == 60, (device, used)
    for name in names:  # the next round starts from empty cards
        env.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", gracePeriodSeconds=0)
    devcluster.wait_until("the burst's claims released", lambda: not env.consumed(NODE),
                          timeout=SCHEDULE_S)


# --- no claim left behind (webhook.claimsweep) ---------------------------------------------------

def _claims_of(env: Env, pod_name: str) -> list[dict[str, Any]]:
    """The webhook's claims made for pod ``pod_name`` (``<name>-egpu-<key>``)."""
    body = env.api("GET", f"{V1}/namespaces/{NAMESPACE}/resourceclaims",
                   labelSelector="app.kubernetes.io/managed-by=egpu-webhook")
    return [c for c in body["items"] if c["metadata"]["name"].startswith(f"{pod_name}-egpu-")]


def _wait_gone(env: Env, pod_name: str, why: str) -> None:
    devcluster.wait_until(f"the claim of {pod_name} deleted ({why})",
                          lambda: not _claims_of(env, pod_name), timeout=SWEPT_S, interval=1.0)


def test_a_deleted_pods_claim_is_deleted_and_a_pending_pods_is_kept(env: Env) -> None:
    """Bug caught: the webhook's claim outlives its pod (nothing owns it: the pod had no UID at
    admission), or the sweeper takes the claim of a pod still waiting to be scheduled."""
    _, _, claim = _landed(env, _pod("swept-run", {"egpu.io/gpu-memory": "1000"}))
    assert claim["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
    env.create_pod(_pod("swept-wait", {"egpu.io/gpu-memory": "1000"}, {
        "egpu.io/use-gpu-uuid": "GPU-00000000-0000-0000-0000-000000000000"}))
    env.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/swept-run", gracePeriodSeconds=0)
    _wait_gone(env, "swept-run", "its pod was deleted")
    # the pending pod's claim, past the grace and a few sweeps, is named by its pod: kept
    [waiting] = _claims_of(env, "swept-wait")
    created = datetime.fromisoformat(waiting["metadata"]["creationTimestamp"].replace(
        "Z", "+00:00"))
    time.sleep(max(0.0, SWEEP_GRACE_S + 3 - (datetime.now(UTC) - created).total_seconds()))
    [waiting] = _claims_of(env, "swept-wait")
    assert not (waiting.get("status") or {}).get("reservedFor")
    env.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/swept-wait", gracePeriodSeconds=0)
    _wait_gone(env, "swept-wait", "its pending pod was deleted")


def test_a_pod_refused_after_the_webhook_leaves_no_claim(env: Env) -> None:
    """A ValidatingAdmissionPolicy refuses the pod after the webhook made its claim. Bug
    caught: that claim stays forever (no pod will ever name it)."""
    policy = "egpu-e2e-refuse-labelled"
    env.api("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", {
        "metadata": {"name": policy},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["pods"]}]},
                 "validations": [{"expression": "!has(object.metadata.labels) || "
                                  "!('egpu-e2e-refuse' in object.metadata.labels)",
                                  "message": "refused by the e2e policy"}]}})
    env.api("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", {
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": NAMESPACE}}}}})
    try:
        pod = _pod("refused", {"egpu.io/gpu-memory": "1000"})
        pod["metadata"]["labels"] = {"egpu-e2e-refuse": "yes"}

        def refused() -> bool:  # the API server loads a new policy within a few seconds
            try:
                env.create_pod(pod)
            except devnodes.ApiError as exc:
                return "refused by the e2e policy" in str(exc)
            env.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/refused",
                    gracePeriodSeconds=0)
            return False

        devcluster.wait_until("the policy to refuse the pod", refused, timeout=60, interval=1.0)
        assert _claims_of(env, "refused"), "the webhook made no claim before the refusal"
        _wait_gone(env, "refused", "its pod was refused after the webhook")
    finally:
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            with contextlib.suppress(devnodes.ApiError):
                env.api("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{policy}")


def test_a_claim_left_by_a_webhook_that_died_is_swept_after_its_restart(env: Env) -> None:
    """The webhook dies after its claim's POST and before its answer: the API server refuses
    the pod, the claim stays. Bug caught: a restarted webhook forgets it (the sweeper must
    work from what the API holds, not from what the process remembers)."""
    assert env.webhook is not None
    env.webhook.stop()
    env.api("POST", f"{V1}/namespaces/{NAMESPACE}/resourceclaims", {
        "metadata": {"name": "crashed-egpu-0123456789abcdef",
                     "labels": {"app.kubernetes.io/managed-by": "egpu-webhook"},
                     "finalizers": ["resource.kubernetes.io/delete-protection"]},
        "spec": {"devices": {"requests": [{"name": "c", "exactly": {
            "deviceClassName": "share.gpu.egpu.io", "count": 1,
            "capacity": {"requests": {"memory": "1000Mi"}}}}]}}})
    env.webhook.start()
    _wait_gone(env, "crashed", "the restarted webhook swept it")
