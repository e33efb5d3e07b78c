"""Helpers for the webhook tests: AdmissionReview builders, pods, the shared pod inputs."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from egpu.config import Config
from egpu.workloads import pod_templates
from webhook.review import review

GOLDEN = Path(__file__).parent / "golden"


def admission_review(pod: dict[str, Any] | None, *, uid: str = "uid-1",
                     operation: str = "CREATE", namespace: str | None = None,
                     dry_run: bool = False, kind: str = "Pod",
                     sub_resource: str | None = None) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview as the API server sends it (``pod`` may be
    malformed: a metadata that is not an object gives no name and the default namespace)."""
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    metadata = metadata if isinstance(metadata, dict) else {}
    if namespace is None:
        namespace = metadata.get("namespace", "default")
    name = metadata.get("name", "")
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "name": name if isinstance(name, str) else "",
        "namespace": namespace if isinstance(namespace, str) and namespace else "default",
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": pod,
        "oldObject": None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch of a response (empty when none)."""
    if "patch" not in response:
        return []
    return json.loads(base64.b64decode(response["patch"]))


def answer(pod: dict[str, Any], config: Config | None = None, **kwargs: Any) -> dict[str, Any]:
    """The ``response`` part of the review of creating ``pod``."""
    result = review(admission_review(pod, **kwargs), config or Config())
    return dict(result["response"])


def admitted(pod: dict[str, Any], config: Config | None = None) -> dict[str, Any]:
    """The pod as the API server stores it after our patch (asserts it is allowed)."""
    response = answer(pod, config)
    assert response["allowed"], response
    return jsonpatch.apply_patch(pod, decoded_patch(response))


def as_pod(template_pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A pod template (or pod) as a Pod object in ``namespace``."""
    metadata = dict(template_pod.get("metadata") or {})
    metadata.setdefault("namespace", namespace)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": template_pod.get("spec") or {}}


def input_pods(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(label, Pod)`` for every pod template in a shared input file."""
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        for template in pod_templates(doc):
            out.append((template.label, as_pod(dict(template.pod), template.namespace)))
    return out


def make_pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
             annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
             namespace: str = "team", **spec: Any) -> dict[str, Any]:
    """A Pod object; metadata.labels/annotations only when given."""
    metadata: dict[str, Any] = {"name": "p", "namespace": namespace}
    if annotations is not None:
        metadata["annotations"] = annotations
    if labels is not None:
        metadata["labels"] = labels
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def container(name: str = "c", limits: dict[str, Any] | None = None, **extra: Any
              ) -> dict[str, Any]:
    """A container with ``limits`` (requests left to Kubernetes' defaulting)."""
    out: dict[str, Any] = {"name": name, "image": "busybox:1.36", **extra}
    if limits is not None:
        out["resources"] = {"limits": limits}
    return out
