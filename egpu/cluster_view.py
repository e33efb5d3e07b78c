"""Per node and card: what is booked, what is used, and which shares sit there (pure).

``cluster_view(nodes, pods, config)`` takes Node and Pod objects as JSON-like dicts (as the API
returns them) and returns ``NodeView``s: each card's capacity, booked MiB and cores (Kubernetes'
effective-request rule, ``egpu.booking``), measured use (node annotation ``egpu.io/usage``) and
the shares placed on it. Used by ``egpu top`` / ``kubectl egpu`` and the demo's placement table.
Malformed annotations are reported in ``NodeView.problems``, never raised.

A pod's share is read from its ``egpu.io/allocation`` record alone (cards, each container's
kind, the resolved priority), never from its spec; only a record of an older extender, which
lacks the kinds and policies, is completed from the pod spec (``egpu.requests.read_pod``), as
before the record carried them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from egpu.booking import CardBooking, allocation_bookings, book_card
from egpu.config import Config
from egpu.contract import ANN_ALLOCATION, ANN_INVENTORY, ANN_USAGE
from egpu.records import Allocation, Card, Inventory, NodeUsage, RecordError
from egpu.requests import ContainerKind, read_pod


@dataclass(frozen=True)
class ShareView:
    """One container's share of one card. memory_mib: MiB, cores: %; used_mib None = unknown."""

    namespace: str
    pod: str
    container: str
    init: bool
    priority: str
    memory_mib: int
    cores: int
    used_mib: int | None = None


@dataclass
class CardView:
    """One card: capacity, bookings (MiB, %), measured use and its shares."""

    card: Card
    booked_mib: int = 0
    booked_cores: int = 0
    used_mib: int | None = None
    compute_used_percent: float | None = None
    shares: list[ShareView] = field(default_factory=list)


@dataclass
class NodeView:
    """One node with an egpu inventory."""

    name: str
    cards: list[CardView]
    problems: list[str] = field(default_factory=list)


def _meta(obj: Mapping[str, Any], key: str) -> Any:
    return (obj.get("metadata") or {}).get(key)


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj, "annotations") or {}


def cluster_view(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                 config: Config | None = None) -> list[NodeView]:
    """Build the per-node, per-card view; nodes without an inventory are left out.

    Pods that are finished (Succeeded, Failed) book nothing, as in the extender.
    """
    config = config or Config()
    views: dict[str, NodeView] = {}
    cards_by_uuid: dict[tuple[str, str], CardView] = {}
    for node in nodes:
        name = str(_meta(node, "name") or "")
        annotations = _annotations(node)
        if ANN_INVENTORY not in annotations:
            continue
        view = NodeView(name, [])
        views[name] = view
        try:
            inventory = Inventory.decode(annotations[ANN_INVENTORY])
        except RecordError as exc:
            view.problems.append(str(exc))
            continue
        for card in sorted(inventory.cards, key=lambda c: c.index):
            card_view = CardView(card)
            view.cards.append(card_view)
            cards_by_uuid[(name, card.uuid)] = card_view
        if ANN_USAGE in annotations:
            try:
                usage = NodeUsage.decode(annotations[ANN_USAGE])
            except RecordError as exc:
                view.problems.append(str(exc))
            else:
                for card_usage in usage.cards:
                    if (cv := cards_by_uuid.get((name, card_usage.uuid))) is not None:
                        cv.used_mib = card_usage.memory_used_mib
                        cv.compute_used_percent = card_usage.compute_used_percent
    for pod in pods:
        _add_pod(pod, views, cards_by_uuid, config)
    return [views[n] for n in sorted(views)]


def _add_pod(pod: Mapping[str, Any], views: dict[str, NodeView],
             cards: dict[tuple[str, str], CardView], config: Config) -> None:
    text = _annotations(pod).get(ANN_ALLOCATION)
    phase = (pod.get("status") or {}).get("phase")
    if text is None or phase in ("Succeeded", "Failed"):
        return
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    namespace, name = str(_meta(pod, "namespace") or ""), str(_meta(pod, "name") or "")
    try:
        allocation = Allocation.decode(text)
    except RecordError as exc:
        if node in views:
            views[node].problems.append(f"pod {namespace}/{name}: {exc}")
        return
    node = node or allocation.node
    policies = allocation.policies
    if policies is not None and allocation.complete:
        priority, bookings = policies[0], record_bookings(allocation)
    else:  # a record of an older extender: the pod spec tells the kinds and the priority
        request = read_pod(pod, config).request
        priority = request.priority if request else config.defaults.priority
        bookings = allocation_bookings(allocation, request)
    for uuid, booking in bookings.items():
        if (card := cards.get((node, uuid))) is not None:
            card.booked_mib += booking.memory_mib
            card.booked_cores += booking.cores
    for container in allocation.containers:
        for share in container.cards:
            if (card := cards.get((node, share.uuid))) is not None:
                card.shares.append(ShareView(namespace, name, container.name, container.init,
                                             priority, share.memory_mib, share.cores))


def record_bookings(allocation: Allocation) -> dict[str, CardBooking]:
    """Card UUID -> what the pod books there, from a record that carries its containers' kinds
    (``Allocation.complete``): ``egpu.booking.book_card`` over the containers in the record's
    order, the pod's spec order (init containers and sidecars first), as the extender writes
    them. Same result as ``allocation_bookings(allocation, read_pod(pod).request)``."""
    per_card: dict[str, list[tuple[ContainerKind, int, int]]] = {}
    for container in allocation.containers:
        kind = ContainerKind(container.kind or ContainerKind.APP)
        for share in container.cards:
            per_card.setdefault(share.uuid, []).append((kind, share.memory_mib, share.cores))
    return {uuid: book_card(entries) for uuid, entries in per_card.items()}
