"""Per node and card: what is booked, what is used, and which shares sit there (pure).

``cluster_view(nodes, pods, config, claims)`` takes Node, Pod and ResourceClaim objects as
JSON-like dicts (as the API returns them) and returns ``NodeView``s: each card's capacity,
booked MiB and cores, measured use (node annotation ``egpu.io/usage``) and the shares placed
on it, from both allocation paths. Used by ``egpu top`` / ``kubectl egpu`` and the demo's
placement table. Malformed annotations and claims are reported in ``NodeView.problems``, never
raised. ``NodeView.config``: the config the node's agent runs (annotation ``egpu.io/config``:
``<generation> <source>``; "" before an agent published it).

- egpu scheduler's shares: a pod's ``egpu.io/allocation`` record alone (cards, each
  container's kind, the resolved priority and compute policy), never its spec; only a record
  of an older scheduler, which lacks the kinds and policies, is completed from the pod spec
  (``egpu.requests.read_pod``), as before the record carried them. Booked by Kubernetes'
  effective-request rule (``egpu.booking``).
- DRA shares: each allocated ResourceClaim of driver ``gpu.egpu.io`` (``claims``, resource.k8s.io
  v1) books the consumed capacity of each of its results on the card the device names (the
  node's inventory: ``egpu.dra.slices.device_name``), as the kube-scheduler's allocator counts
  it, whether or not a pod uses it yet. A pod that uses the claim (its ``spec.resourceClaims``
  and ``status.resourceClaimStatuses``, or ``status.extendedResourceClaimStatus``) shows one
  share per container and card, read by the decoder the node agent prepares claims with
  (``egpu.dra.allocation``); priority and compute policy from the claim's ShareConfig. A claim
  that no active pod uses (or whose pod the node agent would refuse: a problem) shows as one
  share per card without pod or container.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from egpu.booking import allocation_bookings, record_bookings
from egpu.config import Config
from egpu.contract import ANN_ALLOCATION, ANN_CONFIG, ANN_INVENTORY, ANN_USAGE
from egpu.dra.allocation import (
    ClaimDevice,
    ClaimError,
    claim_devices,
    claim_pool,
    claim_ref,
    container_cards,
    pod_claim_names,
    pod_use,
    share_config,
)
from egpu.dra.shareconfig import ShareConfig, ShareConfigError
from egpu.records import Allocation, Card, Inventory, NodeUsage, RecordError
from egpu.requests import read_pod

PATH_EXTENDER = "extender"  # ShareView.path: the pod's egpu.io/allocation
PATH_DRA = "dra"  # ShareView.path: a ResourceClaim of driver gpu.egpu.io


@dataclass(frozen=True)
class ShareView:
    """One container's share of one card. memory_mib: MiB, cores: %; used_mib None = unknown.
    ``priority`` (high | low) and ``compute_policy`` (strict | elastic; "" when unknown: the
    claim's ShareConfig is malformed) as resolved for the pod. ``path``: ``extender`` or
    ``dra``; ``claim``: the ResourceClaim's name (in ``namespace``) of a DRA share, "" for
    the scheduler's. A claim that no active pod uses has ``pod`` and ``container`` "" (it still
    books its card)."""

    namespace: str
    pod: str
    container: str
    init: bool
    priority: str
    memory_mib: int
    cores: int
    used_mib: int | None = None
    compute_policy: str = ""
    path: str = PATH_EXTENDER
    claim: str = ""


@dataclass
class CardView:
    """One card: capacity, bookings (MiB, %) of both paths, measured use and its shares.
    ``booked_mib`` / ``booked_cores``: the total (extender + DRA); ``dra_booked_mib`` /
    ``dra_booked_cores``: the part ResourceClaims book."""

    card: Card
    booked_mib: int = 0
    booked_cores: int = 0
    used_mib: int | None = None
    compute_used_percent: float | None = None
    shares: list[ShareView] = field(default_factory=list)
    dra_booked_mib: int = 0
    dra_booked_cores: int = 0


@dataclass
class NodeView:
    """One node with an egpu inventory."""

    name: str
    cards: list[CardView]
    problems: list[str] = field(default_factory=list)
    config: str = ""  # the agent's "<generation> <source>" (egpu.io/config), "" if not said


def _meta(obj: Mapping[str, Any], key: str) -> Any:
    return (obj.get("metadata") or {}).get(key)


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj, "annotations") or {}


def cluster_view(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                 config: Config | None = None,
                 claims: Iterable[Mapping[str, Any]] = ()) -> list[NodeView]:
    """Build the per-node, per-card view (module docstring), nodes sorted by name; nodes
    without an inventory are left out. ``nodes``, ``pods``, ``claims``: Node, Pod and
    ResourceClaim (resource.k8s.io/v1) objects as the API returns them in JSON; ``claims`` of
    other drivers or not allocated are ignored.

    Pods that are finished (Succeeded, Failed) book nothing on the extender path, as in the
    scheduler; a claim books until the kube-scheduler's allocation is gone. Never raises for
    what the objects say: a malformed record, claim or ShareConfig is a problem of its node.
    """
    config = config or Config()
    pods = list(pods)
    views: dict[str, NodeView] = {}
    inventories: dict[str, tuple[Card, ...]] = {}
    cards_by_uuid: dict[tuple[str, str], CardView] = {}
    for node in nodes:
        name = str(_meta(node, "name") or "")
        annotations = _annotations(node)
        if ANN_INVENTORY not in annotations:
            continue
        view = NodeView(name, [], config=str(annotations.get(ANN_CONFIG, "")))
        views[name] = view
        try:
            inventory = Inventory.decode(annotations[ANN_INVENTORY])
        except RecordError as exc:
            view.problems.append(str(exc))
            continue
        inventories[name] = inventory.cards
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
    _add_claims(claims, pods, views, inventories, cards_by_uuid)
    return [views[n] for n in sorted(views)]


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _add_pod(pod: Mapping[str, Any], views: dict[str, NodeView],
             cards: dict[tuple[str, str], CardView], config: Config) -> None:
    text = _annotations(pod).get(ANN_ALLOCATION)
    if text is None or _finished(pod):
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
        priority, compute_policy = policies[0], str(policies[1])
        bookings = record_bookings(allocation)
    else:  # a record of an older scheduler: the pod spec tells the kinds and the priority
        request = read_pod(pod, config).request
        priority = request.priority if request else config.defaults.priority
        compute_policy = str(request.compute_policy if request
                             else config.defaults.compute_policy)
        bookings = allocation_bookings(allocation, request)
    for uuid, booking in bookings.items():
        if (card := cards.get((node, uuid))) is not None:
            card.booked_mib += booking.memory_mib
            card.booked_cores += booking.cores
    for container in allocation.containers:
        for share in container.cards:
            if (card := cards.get((node, share.uuid))) is not None:
                card.shares.append(ShareView(namespace, name, container.name, container.init,
                                             priority, share.memory_mib, share.cores,
                                             compute_policy=compute_policy))


@dataclass(frozen=True)
class _PlacedClaim:
    node: str
    devices: tuple[ClaimDevice, ...]
    config: ShareConfig | None  # None: malformed (a problem of the node)


def _add_claims(claims: Iterable[Mapping[str, Any]], pods: list[Mapping[str, Any]],
                views: dict[str, NodeView], inventories: dict[str, tuple[Card, ...]],
                cards: dict[tuple[str, str], CardView]) -> None:
    """Book each allocated claim of driver gpu.egpu.io on its cards, then show its shares per
    pod container (module docstring)."""
    placed: dict[tuple[str, str], _PlacedClaim] = {}
    for claim in claims:
        node = claim_pool(claim)
        if node is None or node not in inventories:
            continue  # not allocated, another driver's, or a node without (a valid) inventory
        meta = claim.get("metadata") or {}
        try:
            devices = claim_devices(claim, node, inventories[node], healthy_only=False)
        except ClaimError as exc:
            views[node].problems.append(str(exc))
            continue
        config: ShareConfig | None
        try:
            config = share_config(claim, devices)
        except ShareConfigError as exc:
            views[node].problems.append(f"ResourceClaim {claim_ref(claim)}: {exc}")
            config = None
        for device in devices:
            card = cards[(node, device.uuid)]
            card.booked_mib += device.memory_mib
            card.booked_cores += device.cores
            card.dra_booked_mib += device.memory_mib
            card.dra_booked_cores += device.cores
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        placed[key] = _PlacedClaim(node, devices, config)
    used: set[tuple[str, str]] = set()
    for pod in pods:
        if _finished(pod):
            continue
        namespace, name = str(_meta(pod, "namespace") or ""), str(_meta(pod, "name") or "")
        for claim_name in pod_claim_names(pod):
            found = placed.get((namespace, claim_name))
            if found is None:
                continue
            try:
                use = pod_use(pod, claim_name, found.devices)
            except ClaimError as exc:  # the node agent refuses it too: the claim shows alone
                views[found.node].problems.append(str(exc))
                continue
            if use is None:
                continue
            used.add((namespace, claim_name))
            for container in use.containers:
                for share in container.cards:
                    _add_dra_share(cards, found, namespace, name, container.name,
                                   container.init, share.uuid, share.memory_mib, share.cores,
                                   claim_name)
    for (namespace, claim_name), found in placed.items():
        if (namespace, claim_name) not in used:
            for share in container_cards(found.devices, None):
                _add_dra_share(cards, found, namespace, "", "", False, share.uuid,
                               share.memory_mib, share.cores, claim_name)


def _add_dra_share(cards: dict[tuple[str, str], CardView], found: _PlacedClaim, namespace: str,
                   pod: str, container: str, init: bool, uuid: str, memory_mib: int, cores: int,
                   claim: str) -> None:
    config = found.config
    cards[(found.node, uuid)].shares.append(ShareView(
        namespace, pod, container, init, config.priority if config else "?", memory_mib, cores,
        compute_policy=config.compute_policy if config else "", path=PATH_DRA, claim=claim))


