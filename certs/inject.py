"""Put a CA certificate into webhook configurations (``egpu certs inject-ca``).

``inject_ca(documents, ca_pem)`` sets ``webhooks[*].clientConfig.caBundle`` (base64 of the
PEM bytes, as admissionregistration.k8s.io/v1 expects) on every
``MutatingWebhookConfiguration`` and ``ValidatingWebhookConfiguration`` among parsed YAML
documents, in place, and returns how many webhooks it set. ``inject_ca_text`` does the same
on YAML text (multi-document; comments are not kept). ``inject_ca_live`` patches a live
object through the Kubernetes API.
"""

from __future__ import annotations

import base64
from typing import Any, Final

import yaml

WEBHOOK_KINDS: Final = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


class InjectError(ValueError):
    """Nothing to inject into, or the input is not what was expected."""


def ca_bundle(ca_pem: bytes) -> str:
    """The ``caBundle`` value for a PEM CA: base64 of the PEM bytes. Raises InjectError when
    the bytes hold no PEM certificate."""
    if b"-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise InjectError("the CA file holds no PEM certificate")
    return base64.b64encode(ca_pem).decode("ascii")


def inject_ca(documents: list[Any], ca_pem: bytes) -> int:
    """Set caBundle on every webhook of every webhook configuration in ``documents``."""
    bundle = ca_bundle(ca_pem)
    count = 0
    for doc in documents:
        if not isinstance(doc, dict) or doc.get("kind") not in WEBHOOK_KINDS:
            continue
        for index, webhook in enumerate(doc.get("webhooks") or []):
            if not isinstance(webhook, dict):
                raise InjectError(f"{doc.get('kind')}.webhooks[{index}]: not an object")
            client = webhook.setdefault("clientConfig", {})
            if not isinstance(client, dict):
                raise InjectError(f"{doc.get('kind')}.webhooks[{index}].clientConfig: "
                                  "not an object")
            client["caBundle"] = bundle
            count += 1
    return count


def inject_ca_text(text: str, ca_pem: bytes) -> str:
    """``inject_ca`` on YAML text; returns the new YAML. Raises InjectError when no webhook
    configuration is found, yaml.YAMLError for bad YAML."""
    documents = [d for d in yaml.safe_load_all(text) if d is not None]
    if inject_ca(documents, ca_pem) == 0:
        raise InjectError(f"no webhook in any {' or '.join(WEBHOOK_KINDS)} of the input")
    return yaml.safe_dump_all(documents, sort_keys=False, width=10_000)


def inject_ca_live(name: str, ca_pem: bytes, kubeconfig: str | None = None,
                   context: str | None = None) -> int:
    """Set caBundle on each webhook of the live MutatingWebhookConfiguration ``name``.

    Uses ``kubeconfig`` (None: the default loading rules). Returns the webhook count.
    Raises kubernetes.client.ApiException from the API.
    """
    from kubernetes import client, config

    config.load_kube_config(config_file=kubeconfig, context=context)
    api = client.AdmissionregistrationV1Api()
    bundle = ca_bundle(ca_pem)
    live = api.read_mutating_webhook_configuration(name)
    patch = {"webhooks": [{"name": w.name, "clientConfig": {"caBundle": bundle}}
                          for w in live.webhooks or []]}
    api.patch_mutating_webhook_configuration(name, patch)
    return len(patch["webhooks"])
