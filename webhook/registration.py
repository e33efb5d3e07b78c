"""The MutatingWebhookConfiguration for a webhook reached by URL (dev clusters, tests, bench).

In a cluster the API server reaches the webhook through its Service
(manifests/webhook/mutatingwebhook.yaml). Outside one, ``configuration_for_url(url, ca_pem)``
returns the same configuration (same rules, namespaceSelector, matchConditions, failure
policy, timeouts) with ``clientConfig: {url, caBundle}`` instead, as a dict ready for the
API (admissionregistration.k8s.io/v1).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

MANIFEST = Path(__file__).resolve().parent.parent / "manifests" / "webhook" / "mutatingwebhook.yaml"


def load_manifest(path: Path | str = MANIFEST) -> dict[str, Any]:
    """The MutatingWebhookConfiguration of the manifest file."""
    for doc in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")):
        if isinstance(doc, dict) and doc.get("kind") == "MutatingWebhookConfiguration":
            return doc
    raise ValueError(f"{path}: no MutatingWebhookConfiguration")


def configuration_for_url(url: str, ca_pem: bytes, name: str = "egpu-webhook-dev",
                          manifest: Path | str = MANIFEST) -> dict[str, Any]:
    """The manifest's configuration named ``name``, calling ``url`` (``https://host:port/mutate``)
    and trusting ``ca_pem`` (the CA of the serving certificate, PEM bytes)."""
    doc = load_manifest(manifest)
    doc["metadata"] = {"name": name, "labels": dict(doc.get("metadata", {}).get("labels", {}))}
    bundle = base64.b64encode(ca_pem).decode("ascii")
    for webhook in doc["webhooks"]:
        webhook["clientConfig"] = {"url": url, "caBundle": bundle}
    return doc
