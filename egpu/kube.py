"""Read-only typed views over Kubernetes objects as JSON dicts: ``KubePod``, ``KubeNode``.

egpu's parts receive pods and nodes as the JSON the API server sends (watch events, lists,
the scheduler's arguments, the kubernetes client's ``sanitize_for_serialization``). A view
wraps one such dict and reads the fields egpu uses with their types: absent, ``null`` or
wrongly typed parts read as empty (``""``, an empty mapping, an empty tuple; a ``null``
label or annotation value as ``""``, as the API server decodes it); a view never raises and
never changes the object (``raw`` is the object itself).

    pod = KubePod(obj)
    pod.uid, pod.namespace, pod.name, pod.key        # str; key is "namespace/name"
    pod.annotation("egpu.io/allocation")             # str | None
    pod.label("egpu.io/priority")                    # str | None
    pod.node_name, pod.phase, pod.finished           # spec.nodeName, status.phase
    pod.containers, pod.init_containers              # spec's container objects

Only the fields the parts read are here; the pod's egpu requests are read by
``egpu.requests.read_pod`` (through ``egpu.podshape``'s checked view), not by these views.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})

FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})  # a pod that runs no more


def section(obj: Any, key: str) -> Mapping[str, Any]:
    """``obj[key]`` when ``obj`` is a mapping and that is one; else an empty mapping."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else _EMPTY


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 timestamp as the API server writes it (``2026-12-05T07:00:00Z``) -> an
    aware datetime; None when absent, unreadable or without a zone."""
    if not isinstance(text, str) or not text:
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else None


def _text(obj: Mapping[str, Any], key: str) -> str:
    """``obj[key]`` as text: a string, or a number as written (hand-written YAML's ``name:
    123``); "" for anything else."""
    value = obj.get(key)
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else ""


def _objects(obj: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], ...]:
    """The mappings of the list ``obj[key]`` (other entries left out); () when absent."""
    value = obj.get(key)
    if not isinstance(value, list | tuple):
        return ()
    return tuple(item for item in value if isinstance(item, Mapping))


def _string(value: Any) -> str | None:
    """A label or annotation value: a string; ``null`` reads as "" (as the API server
    decodes it, and ``egpu.podshape``); None for anything else."""
    if isinstance(value, str):
        return value
    return "" if value is None else None


def _strings(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """``obj`` itself when every value is a string (the API server's), else its entries as
    ``_string`` reads them (the others left out)."""
    if all(isinstance(v, str) for v in obj.values()):
        return obj
    return {k: text for k, v in obj.items() if (text := _string(v)) is not None}


class KubeObject:
    """Any Kubernetes object: its ``metadata``."""

    __slots__ = ("raw",)

    def __init__(self, obj: Any) -> None:
        self.raw: Mapping[str, Any] = obj if isinstance(obj, Mapping) else _EMPTY

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, uid={self.uid!r})"

    @property
    def metadata(self) -> Mapping[str, Any]:
        """``metadata``, empty when absent."""
        return section(self.raw, "metadata")

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return _text(self.metadata, "name")

    @property
    def namespace(self) -> str:
        """``metadata.namespace`` ("" for cluster-scoped objects)."""
        return _text(self.metadata, "namespace")

    @property
    def key(self) -> str:
        """``namespace/name`` (``/name`` for cluster-scoped objects)."""
        return f"{self.namespace}/{self.name}"

    @property
    def uid(self) -> str:
        """``metadata.uid``."""
        return _text(self.metadata, "uid")

    @property
    def resource_version(self) -> str:
        """``metadata.resourceVersion``."""
        return _text(self.metadata, "resourceVersion")

    @property
    def deleting(self) -> bool:
        """Whether ``metadata.deletionTimestamp`` is set (the object is terminating)."""
        return bool(self.metadata.get("deletionTimestamp"))

    @property
    def annotations(self) -> Mapping[str, str]:
        """``metadata.annotations`` (string values only), empty when absent."""
        return _strings(section(self.metadata, "annotations"))

    @property
    def labels(self) -> Mapping[str, str]:
        """``metadata.labels`` (string values only), empty when absent."""
        return _strings(section(self.metadata, "labels"))

    def annotation(self, key: str) -> str | None:
        """The annotation ``key``; None when absent (or neither a string nor null)."""
        annotations = section(self.metadata, "annotations")
        return _string(annotations[key]) if key in annotations else None

    def label(self, key: str) -> str | None:
        """The label ``key``; None when absent (or neither a string nor null)."""
        labels = section(self.metadata, "labels")
        return _string(labels[key]) if key in labels else None


class KubePod(KubeObject):
    """A Pod (or a pod template: then only metadata and spec)."""

    __slots__ = ()

    @property
    def spec(self) -> Mapping[str, Any]:
        """``spec``, empty when absent."""
        return section(self.raw, "spec")

    @property
    def status(self) -> Mapping[str, Any]:
        """``status``, empty when absent."""
        return section(self.raw, "status")

    @property
    def node_name(self) -> str:
        """``spec.nodeName`` ("" while unbound)."""
        return _text(self.spec, "nodeName")

    @property
    def containers(self) -> tuple[Mapping[str, Any], ...]:
        """``spec.containers``."""
        return _objects(self.spec, "containers")

    @property
    def init_containers(self) -> tuple[Mapping[str, Any], ...]:
        """``spec.initContainers`` (sidecars included)."""
        return _objects(self.spec, "initContainers")

    @property
    def resource_claims(self) -> tuple[Mapping[str, Any], ...]:
        """``spec.resourceClaims`` (DRA)."""
        return _objects(self.spec, "resourceClaims")

    @property
    def resource_claim_statuses(self) -> tuple[Mapping[str, Any], ...]:
        """``status.resourceClaimStatuses`` (DRA: the claims made for the pod from templates)."""
        return _objects(self.status, "resourceClaimStatuses")

    @property
    def phase(self) -> str:
        """``status.phase`` ("" when not reported yet)."""
        return _text(self.status, "phase")

    @property
    def finished(self) -> bool:
        """Whether the pod has finished (phase Succeeded or Failed): it runs no more."""
        return self.phase in FINISHED_PHASES

    @property
    def admitted(self) -> bool:
        """Whether its kubelet is done admitting the pod, so its device plugin calls are over:
        the kubelet writes ``status.startTime`` (or a phase past Pending, or container
        statuses) only after admission, or a rejection (phase Failed). A terminating pod
        may still be admitted: a kubelet that first sees it with a deletionTimestamp admits
        it before it kills it."""
        status = self.status
        return bool(status.get("startTime") or self.phase not in ("", "Pending")
                    or status.get("containerStatuses") or status.get("initContainerStatuses"))

    @property
    def container_statuses(self) -> tuple[Mapping[str, Any], ...]:
        """``status.initContainerStatuses`` then ``status.containerStatuses``."""
        status = self.status
        return (*_objects(status, "initContainerStatuses"),
                *_objects(status, "containerStatuses"))


class KubeNode(KubeObject):
    """A Node: egpu reads its name and annotations (``KubeObject``)."""

    __slots__ = ()
