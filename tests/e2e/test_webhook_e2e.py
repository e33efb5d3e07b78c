"""The admission webhook against a real kube-apiserver (the dev cluster, ``cluster`` fixture).

The webhook runs as its own process on 127.0.0.1:<free port> with a certificate whose SAN
includes 127.0.0.1; a MutatingWebhookConfiguration like manifests/webhook's (same rules,
namespaceSelector and CEL matchConditions) calls it by URL. Checks: pods created through the
API come out mutated; bad pods are denied with egpu's message (as kubectl shows it); CPU pods
never reach the webhook; with the webhook down, CPU pods are still created and GPU pods are
refused (FC-08b). The webhook configuration is deleted afterwards.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs.inject import inject_ca_text
from certs.issue import create_ca, create_serving, write_bundle
from devcluster import webhook_process as devcluster_webhook
from devcluster.net import free_port
from egpu.workloads import pod_templates
from webhook.registration import configuration_for_url

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "e2e-webhook"
CONFIG_NAME = "egpu-webhook-e2e"


_free_port = free_port  # tests/e2e/test_dra_claims_e2e.py imports it from here


class WebhookProcess(devcluster_webhook.WebhookProcess):
    """``python -m webhook.main`` on 127.0.0.1:port with certificates in ``certs`` (and
    ``extra_args``, e.g. ``--config`` and ``--kubeconfig`` for DRA mode), ready when /readyz
    answers; its log in ``certs/webhook.log`` (devcluster.webhook_process)."""

    def __init__(self, certs: Path, port: int, extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(certs, port, extra_args, log_level="INFO", ready_path="/readyz")

    def stop(self, grace_s: float = 15.0) -> None:
        super().stop(grace_s)

    def reviews(self) -> float:
        """Requests to /mutate so far (all results), from /metrics."""
        with urllib.request.urlopen(f"{self.url}/metrics", context=self.context,
                                    timeout=5) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("egpu_webhook_requests_total{"))


def _pod(name: str, limits: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "busybox:1.36"}
    if limits:
        container["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": [container], **spec}}


GPU = {"egpu.io/gpu": "1", "egpu.io/gpu-memory": "3000"}


@pytest.fixture(scope="module")
def webhook(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    certs = tmp_path_factory.mktemp("webhook-certs")
    ca = create_ca()
    write_bundle(certs, ca, create_serving(ca, ["127.0.0.1", "localhost"]))
    process = WebhookProcess(certs, _free_port())
    process.start()
    cluster.ensure_namespace(NAMESPACE)
    api = cluster.api_client()
    admission = client.AdmissionregistrationV1Api(api)
    core = client.CoreV1Api(api)
    with_url = configuration_for_url(f"{process.url}/mutate", ca.cert_pem, name=CONFIG_NAME)
    # Only this test's namespace: other tests may share the cluster (matchConditions as is).
    for hook in with_url["webhooks"]:
        hook["namespaceSelector"] = {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": [NAMESPACE]}]}
    with contextlib.suppress(ApiException):
        admission.delete_mutating_webhook_configuration(CONFIG_NAME)
    admission.create_mutating_webhook_configuration(with_url)
    try:
        counter = iter(range(10_000))

        def registered() -> bool:  # the API server notices the configuration within ~1 s
            pod = core.create_namespaced_pod(NAMESPACE, _pod(f"probe-{next(counter)}", GPU))
            return bool((pod.metadata.labels or {}).get("egpu.io/priority"))

        cluster.wait_for("the webhook to be called", registered, timeout=30)
        yield process
    finally:
        with contextlib.suppress(ApiException):
            admission.delete_mutating_webhook_configuration(CONFIG_NAME)
        process.stop()
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)


def _kubectl_create(cluster: Any, pod: dict[str, Any],
                   *extra: str) -> subprocess.CompletedProcess[str]:
    """``kubectl create -f -`` of ``pod`` (as a user would; quantities may be YAML ints)."""
    return subprocess.run(cluster.info.kubectl_argv("create", *extra, "-f", "-"),
                          input=json.dumps(pod), capture_output=True, text=True, timeout=60)


def _create(cluster: Any, pod: dict[str, Any]) -> dict[str, Any]:
    """Create ``pod`` through kubectl; the stored object as JSON."""
    result = _kubectl_create(cluster, pod, "-o", "json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def _input_pods(cluster: Any, name: str) -> list[dict[str, Any]]:
    out = []
    for doc in yaml.safe_load_all((cluster.inputs / "pods" / name).read_text()):
        for index, template in enumerate(pod_templates(doc)):
            pod = json.loads(json.dumps(template.pod))
            metadata = pod.setdefault("metadata", {})
            metadata["name"] = f"{Path(name).stem[:2]}-{metadata.get('name') or 'pod'}-{index}"
            metadata["namespace"] = NAMESPACE
            pod["apiVersion"], pod["kind"] = "v1", "Pod"
            pod["spec"].setdefault("restartPolicy", "Always")
            if pod["spec"]["restartPolicy"] not in ("Always", "OnFailure", "Never"):
                pod["spec"]["restartPolicy"] = "Always"
            out.append(pod)
    return out


@pytest.mark.parametrize("name", ["01-vllm-online.yaml", "02-train-offline.yaml",
                                  "03-notebook-percentage.yaml",
                                  "04-embed-rerank-two-containers.yaml",
                                  "05-tts-oversubscribed.yaml", "06-init-container-gpu.yaml",
                                  "07-volcano-names.yaml"])
def test_gpu_pods_come_out_mutated(cluster: Any, webhook: WebhookProcess, name: str) -> None:
    for pod in _input_pods(cluster, name):
        created = _create(cluster, pod)
        spec = created["spec"]
        assert spec["schedulerName"] == "egpu-scheduler"
        assert created["metadata"]["labels"]["egpu.io/priority"] in ("high", "low")
        # F1: the node's /var/run/egpu is never mounted into a pod (the hook mounts only
        # the container's own folder and card files)
        assert not any(v.get("hostPath") for v in spec.get("volumes", [])), spec.get("volumes")
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            limits = c.get("resources", {}).get("limits", {})
            assert not any(k.startswith("volcano.sh/") for k in limits)
            if any(k.startswith("egpu.io/") for k in limits):
                env = {e["name"]: e.get("value") for e in c["env"]}
                assert env["EGPU_PRIORITY"] in ("high", "low")
                assert not any(m["mountPath"].startswith("/var/run/egpu")
                               for m in c.get("volumeMounts", []))


def test_fc08d_cpu_and_native_gpu_pods_never_reach_the_webhook(
        cluster: Any, webhook: WebhookProcess) -> None:
    before = webhook.reviews()
    for name in ("08-cpu-only.yaml", "09-native-whole-gpu.yaml"):
        for pod in _input_pods(cluster, name):
            created = _create(cluster, pod)
            assert created["spec"]["schedulerName"] == "default-scheduler"
            assert "egpu.io/priority" not in (created["metadata"].get("labels") or {})
    assert webhook.reviews() == before  # filtered out by the CEL matchConditions


def test_bad_pods_denied_with_our_message(cluster: Any, webhook: WebhookProcess) -> None:
    expected = {"bad-cores": "egpu.io/gpu-cores='150'",
                "bad-both-memory": "egpu.io/gpu-memory=4000 is given too",
                "bad-zero-percentage": "egpu.io/gpu-memory-percentage='0'",
                "bad-priority": "egpu.io/priority='urgent'"}
    pods = _input_pods(cluster, "10-bad-requests.yaml")
    assert len(pods) == len(expected)
    for pod, (name, needle) in zip(pods, expected.items(), strict=True):
        result = _kubectl_create(cluster, pod)
        assert result.returncode != 0, f"{name} was admitted"
        assert 'admission webhook "pods.egpu.io" denied the request' in result.stderr
        assert needle in result.stderr, result.stderr


def test_fc09_init_container_and_node_name_denials(cluster: Any, webhook: WebhookProcess) -> None:
    result = _kubectl_create(cluster, _pod("pinned", GPU, nodeName="gpu-a100-0"))
    assert result.returncode != 0 and "spec.nodeName='gpu-a100-0'" in result.stderr
    pod = _pod("bad-init", {"cpu": "100m"})
    pod["spec"]["initContainers"] = [{"name": "warm", "image": "busybox:1.36", "resources": {
        "limits": {"egpu.io/gpu": "1", "egpu.io/gpu-memory-percentage": "101"}}}]
    result = _kubectl_create(cluster, pod)
    assert result.returncode != 0
    assert "container 'warm': egpu.io/gpu-memory-percentage='101'" in result.stderr


def test_fc07_gpu_only_in_init_container_is_routed(cluster: Any, webhook: WebhookProcess) -> None:
    pod = _pod("init-only", {"cpu": "100m"})
    pod["spec"]["initContainers"] = [{"name": "warm", "image": "busybox:1.36", "resources": {
        "limits": {"egpu.io/gpu": "1", "egpu.io/gpu-memory": "12000"}}}]
    created = _create(cluster, pod)
    assert created["spec"]["schedulerName"] == "egpu-scheduler"
    assert "env" not in created["spec"]["containers"][0]


def test_server_side_dry_run_shows_the_mutation(cluster: Any, webhook: WebhookProcess) -> None:
    result = _kubectl_create(cluster, _pod("dry", GPU), "--dry-run=server", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["spec"]["schedulerName"] == "egpu-scheduler"


def test_fc08b_webhook_down_gpu_pods_refused_cpu_pods_created(
        cluster: Any, webhook: WebhookProcess) -> None:
    webhook.stop()
    try:
        deadline = time.monotonic() + 15
        round_ = 0
        while time.monotonic() < deadline:
            cpu = _kubectl_create(cluster, _pod(f"cpu-while-down-{round_}", {"cpu": "100m"}))
            assert cpu.returncode == 0, cpu.stderr
            gpu = _kubectl_create(cluster, _pod(f"gpu-while-down-{round_}", GPU))
            assert gpu.returncode != 0, "a GPU pod was admitted without the webhook"
            assert "pods.egpu.io" in gpu.stderr and "failed calling webhook" in gpu.stderr
            round_ += 1
            time.sleep(2)
    finally:
        webhook.start()  # same port: the configuration works again
    created = _create(cluster, _pod("gpu-after-restart", GPU))
    assert created["spec"]["schedulerName"] == "egpu-scheduler"


def test_manifests_are_accepted_by_the_api_server(cluster: Any, tmp_path: Path) -> None:
    """manifests/webhook, with the CA injected, passes the API server's validation (dry run)."""
    cluster.ensure_namespace("egpu-system")
    ca_pem = create_ca().cert_pem
    folder = tmp_path / "webhook"
    folder.mkdir()
    for source in (REPO / "manifests" / "webhook").glob("*.yaml"):
        text = source.read_text()
        if source.name == "mutatingwebhook.yaml":
            text = inject_ca_text(text, ca_pem)
        (folder / source.name).write_text(text)
    result = subprocess.run(
        cluster.info.kubectl_argv("apply", "--dry-run=server", "-k", str(folder)),
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for kind in ("serviceaccount/egpu-webhook", "deployment.apps/egpu-webhook",
                 "poddisruptionbudget.policy/egpu-webhook", "service/egpu-webhook",
                 "mutatingwebhookconfiguration.admissionregistration.k8s.io/egpu-webhook"):
        assert kind in result.stdout, result.stdout
