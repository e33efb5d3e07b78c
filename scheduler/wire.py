"""The scheduler extender protocol's JSON shapes, declared once.

Source: k8s.io/kube-scheduler/extender/v1/types.go. The Go structs carry no json tags, so the
keys are the Go field names (kube-scheduler decodes them case-insensitively, and sends them
capitalized). With ``nodeCacheCapable: true`` the scheduler sends and expects ``NodeNames``;
otherwise whole ``Nodes`` (a NodeList). Pods and nodes stay plain Kubernetes JSON dicts.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

MAX_EXTENDER_PRIORITY = 10  # extender/v1 MaxExtenderPriority: scores are 0..10


class NodeList(TypedDict, total=False):
    """A v1.NodeList (only ``items`` is read)."""

    apiVersion: str
    kind: str
    items: list[dict[str, Any]]


class ExtenderArgs(TypedDict):
    """Body of the filter and prioritize calls."""

    Pod: dict[str, Any]
    Nodes: NotRequired[NodeList | None]
    NodeNames: NotRequired[list[str] | None]


class ExtenderFilterResult(TypedDict, total=False):
    """Answer to filter: the nodes that fit, and why each other node does not.

    FailedNodes: node -> reason (preemption may help). FailedAndUnresolvableNodes: node ->
    reason (it cannot: removing pods would not make the pod fit). Error: the whole call failed.
    """

    Nodes: NodeList | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    """One node's score (0..MAX_EXTENDER_PRIORITY); the answer to prioritize is a list."""

    Host: str
    Score: int


HostPriorityList = list[HostPriority]


class ExtenderBindingArgs(TypedDict):
    """Body of the bind call."""

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(TypedDict, total=False):
    """Answer to bind: ``Error`` empty (or absent) on success."""

    Error: str
