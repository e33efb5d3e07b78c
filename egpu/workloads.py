"""Find the pod templates inside Kubernetes workload objects.

``pod_templates(obj)`` yields ``PodTemplate`` for a Pod (itself), a Deployment, ReplicaSet,
StatefulSet, DaemonSet or Job (``spec.template``) and a CronJob
(``spec.jobTemplate.spec.template``); other kinds yield nothing. The template's namespace is
the workload's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from egpu.kube import KubeObject

TEMPLATE_KINDS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job"})


@dataclass(frozen=True)
class PodTemplate:
    """A pod (or pod template) found in an object: ``kind/name`` of its owner and the pod dict."""

    kind: str
    name: str
    namespace: str
    pod: Mapping[str, Any]

    @property
    def label(self) -> str:
        """``Kind namespace/name`` for reports."""
        return f"{self.kind} {self.namespace}/{self.name}"


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def pod_templates(obj: Any) -> Iterator[PodTemplate]:
    """Yield the pod templates of one Kubernetes object (dict); nothing for other kinds."""
    if not isinstance(obj, Mapping):
        return
    kind = str(obj.get("kind", ""))
    owner = KubeObject(obj)
    name, namespace = owner.name, owner.namespace or "default"
    if kind == "Pod":
        template: Any = obj
    elif kind in TEMPLATE_KINDS:
        template = _get(obj, "spec", "template")
    elif kind == "CronJob":
        template = _get(obj, "spec", "jobTemplate", "spec", "template")
    elif kind == "List":
        for item in obj.get("items") or []:
            yield from pod_templates(item)
        return
    else:
        return
    if isinstance(template, Mapping):
        yield PodTemplate(kind, name, namespace, template)
