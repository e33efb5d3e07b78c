"""manifests/webhook: the settings issue 4 asks for, checked on the YAML."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.review import FORBIDDEN_CAPABILITIES

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "webhook"


def _objects() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    out: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((MANIFESTS / name).read_text()):
            if doc:
                out[doc["kind"]] = doc
    return out


def test_every_object_present() -> None:
    assert set(_objects()) == {"ServiceAccount", "Deployment", "PodDisruptionBudget", "Service",
                               "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                               "ValidatingAdmissionPolicyBinding"}


def test_pod_fields_policy_covers_pod_create_and_update_not_the_binding() -> None:
    """F2: egpu.io/allocation and the egpu.io/priority label are written once."""
    objects = _objects()
    policy = objects["ValidatingAdmissionPolicy"]
    binding = objects["ValidatingAdmissionPolicyBinding"]
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # Every subresource that can change a pod's metadata, but not pods/binding: the
    # extender's Binding writes the allocation.
    assert set(rule["resources"]) == {"pods", "pods/status", "pods/resize",
                                      "pods/ephemeralcontainers"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "egpu.io/allocation" in text and "egpu.io/priority" in text


def test_webhook_configuration() -> None:
    (webhook,) = _objects()["MutatingWebhookConfiguration"]["webhooks"]
    assert webhook["failurePolicy"] == "Fail" and webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["timeoutSeconds"] == 5 and webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                 "operations": ["CREATE"], "resources": ["pods"],
                                 "scope": "Namespaced"}]
    assert webhook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["kube-system", "egpu-system"]}]
    service = webhook["clientConfig"]["service"]
    assert service == {"name": "egpu-webhook", "namespace": "egpu-system", "path": "/mutate",
                       "port": 443}
    (condition,) = webhook["matchConditions"]
    expression = condition["expression"]
    for needle in ("object.spec.containers", "object.spec.initContainers", "limits",
                   "requests", "'egpu.io/'", "'volcano.sh/vgpu-'"):
        assert needle in expression
    assert expression.count("(") == expression.count(")")


def test_deployment_service_pdb_fit_together() -> None:
    objects = _objects()
    deployment = objects["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert objects["Service"]["spec"]["selector"].items() <= labels.items()
    assert objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= (
        labels.items())
    assert pod["spec"]["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "egpu-webhook-tls"
    assert volumes["config"]["configMap"] == {"name": "egpu-config", "items": [
        {"key": "config.yaml", "path": "config.yaml"}]}
    args = " ".join(container["command"])
    assert "--cert=/etc/egpu/tls/tls.crt" in args
    assert "--config=/etc/egpu/config/config.yaml" in args
    assert objects["Service"]["spec"]["ports"][0]["targetPort"] == "https"
    for obj in objects.values():
        if obj["kind"] not in ("MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                               "ValidatingAdmissionPolicyBinding"):  # cluster-scoped
            assert obj["metadata"]["namespace"] == "egpu-system"


@pytest.mark.parametrize("path", ["manifests/webhook/allocation-policy.yaml",
                                  "charts/egpu/templates/webhook/allocation-policy.yaml"])
def test_the_ephemeral_container_rule_refuses_the_capabilities_the_webhook_refuses(
        path: str) -> None:
    """The policy's CEL list is a second spelling of ``FORBIDDEN_CAPABILITIES``. Bug caught: a
    capability added to the webhook's list but not to the policy's, so ``kubectl debug`` could
    add it to a share pod."""
    text = (REPO / path).read_text()
    (listed,) = re.findall(r"replace\(\s*'CAP_', ''\) in \[([^\]]*)\]", text)
    assert tuple(re.findall(r"'([A-Z_]+)'", listed)) == FORBIDDEN_CAPABILITIES
    for capability in FORBIDDEN_CAPABILITIES:  # and its message names each
        assert capability in text.split(listed)[1].split("reason:")[0], capability
