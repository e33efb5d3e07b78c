"""Claims from pod specs on the dev cluster: the webhook in DRA mode (``allocationMode: dra``)
against the real kube-apiserver and kube-scheduler (v1.37.2, ``cluster`` fixture).

The webhook runs as its own process (``--config`` with ``allocationMode: dra``,
``--kubeconfig`` of the dev cluster) for this module's namespace only; the simulated fleet
publishes its ResourceSlices (``devcluster.dra``) and the DeviceClasses of
``manifests/dra/deviceclasses.yaml`` are applied. Pods are written as their authors write them
(``egpu.io/*``, Volcano names); the webhook makes their ResourceClaimTemplates and the default
scheduler allocates the claims. Checks: every shared input that asks for a share lands as its
comment says (node, card, consumed capacity, ShareConfig); a dry run creates no template; an
impossible UUID filter stays Pending; bursts of pods created at once never book a card past its
capacity.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
V1 = "/apis/resource.k8s.io/v1"


class Env:
    """The API as plain JSON in this module's namespace."""

    def __init__(self, cluster: E2ECluster) -> None:
        self.cluster = cluster
        self.client = cluster.api_client()

    def api(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        return devnodes.api_request(self.client, method, path, body, query=query or None)

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.api("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    def pod(self, name: str) -> dict[str, Any]:
        return self.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")

    def claim_of(self, pod: dict[str, Any]) -> dict[str, Any]:
        [entry] = (pod.get("status") or {}).get("resourceClaimStatuses") or [{}]
        name = entry.get("resourceClaimName")
        assert name, f"pod {pod['metadata']['name']} names no claim: {pod.get('status')}"
        return self.api("GET", f"{V1}/namespaces/{NAMESPACE}/resourceclaims/{name}")

    def templates(self) -> list[str]:
        body = self.api("GET", f"{V1}/namespaces/{NAMESPACE}/resourceclaimtemplates")
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
        "--config", str(work / "config.yaml"), "--kubeconfig", cluster.kubeconfig))
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

def test_a_dry_run_creates_no_template(env: Env) -> None:
    pod = _pod("dry", {"egpu.io/gpu-memory": "4321"})
    before = env.templates()
    result = subprocess.run(env.cluster.info.kubectl_argv(
        "create", "--dry-run=server", "-o", "json", "-f", "-"), input=json.dumps(pod),
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    name = json.loads(result.stdout)["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    assert name not in env.templates() and env.templates() == before


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
        body = devnodes.node_manifest(spec)
        for key in ("capacity", "allocatable"):
            body["status"][key].pop(RES_GPU)  # a DRA node: no device plugin
        devnodes.put_node(env.client, body)
        devnodes.wait_nodes_ready(env.client, [NODE], timeout_s=60)
        publish_node_slices(env.client, NODE, devnodes.inventory(spec).cards)
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
