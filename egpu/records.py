"""Versioned JSON records that egpu's parts exchange through the Kubernetes API and files.

- ``Inventory``: the node annotation ``egpu.io/inventory`` (node agent -> extender).
- ``Allocation``: the pod annotation ``egpu.io/allocation`` (extender -> device plugin, hook).
- ``ContainerConfig``: the interposer's read-only ``/run/egpu/config.json`` (hook -> C side).

Each has ``encode() -> str`` and a ``decode(text) -> record`` classmethod that raises
``RecordError`` naming the field, the value and what is allowed for anything malformed.
Units: memory in MiB, compute in % of one card.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from egpu.contract import COMPUTE_POLICIES, PRIORITIES, RECORD_VERSION


class RecordError(ValueError):
    """A record (annotation or file) is malformed; the message names the field and value."""


def _load_object(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise RecordError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{what}: expected a JSON object, got {type(data).__name__}")
    version = data.get("version")
    if version != RECORD_VERSION:
        raise RecordError(
            f"{what}.version: {version!r} is not supported; allowed: {RECORD_VERSION}")
    return data


def _field(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in obj:
        raise RecordError(f"{where}.{key}: missing")
    value = obj[key]
    # bool is an int in Python; keep the two apart so that `true` is never a MiB count.
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RecordError(f"{where}.{key}: {value!r} is not an integer")
    if kind is not int and not isinstance(value, kind):
        raise RecordError(f"{where}.{key}: {value!r} is not a {kind.__name__}")
    return value


def _non_negative(value: int, where: str) -> int:
    if value < 0:
        raise RecordError(f"{where}: {value} is negative; allowed: >= 0")
    return value


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    return _field(obj, key, list, where)


@dataclass(frozen=True)
class Card:
    """One physical GPU as the node agent found it. memory_mib: NVML total, MiB."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = True
    numa_node: int = -1

    @classmethod
    def from_dict(cls, obj: Any, where: str) -> Card:
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: expected an object, got {obj!r}")
        uuid = _field(obj, "uuid", str, where)
        if not uuid:
            raise RecordError(f"{where}.uuid: empty")
        memory = _field(obj, "memory_mib", int, where)
        if memory <= 0:
            raise RecordError(f"{where}.memory_mib: {memory} must be >= 1")
        return cls(
            uuid=uuid,
            index=_non_negative(_field(obj, "index", int, where), f"{where}.index"),
            model=_field(obj, "model", str, where),
            memory_mib=memory,
            healthy=_field(obj, "healthy", bool, where) if "healthy" in obj else True,
            numa_node=_field(obj, "numa_node", int, where) if "numa_node" in obj else -1,
        )


@dataclass(frozen=True)
class Inventory:
    """The cards of one node (annotation ``egpu.io/inventory``)."""

    cards: tuple[Card, ...]

    def encode(self) -> str:
        """JSON text: ``{"version": 1, "cards": [Card, ...]}``."""
        return json.dumps({"version": RECORD_VERSION, "cards": [asdict(c) for c in self.cards]})

    @classmethod
    def decode(cls, text: str | bytes) -> Inventory:
        """Parse the annotation text. Raises RecordError on malformed input or duplicate UUIDs."""
        data = _load_object(text, "inventory")
        cards = tuple(
            Card.from_dict(c, f"inventory.cards[{i}]")
            for i, c in enumerate(_list(data, "cards", "inventory"))
        )
        seen: set[str] = set()
        for card in cards:
            if card.uuid in seen:
                raise RecordError(f"inventory.cards: uuid {card.uuid!r} appears twice")
            seen.add(card.uuid)
        return cls(cards=cards)


@dataclass(frozen=True)
class CardShare:
    """What one container holds of one card: memory_mib (MiB) and cores (%, 0 = none booked)."""

    uuid: str
    index: int
    memory_mib: int
    cores: int

    @classmethod
    def from_dict(cls, obj: Any, where: str) -> CardShare:
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: expected an object, got {obj!r}")
        cores = _field(obj, "cores", int, where)
        if not 0 <= cores <= 100:
            raise RecordError(f"{where}.cores: {cores} out of range; allowed: 0..100")
        memory = _field(obj, "memory_mib", int, where)
        if memory <= 0:
            raise RecordError(f"{where}.memory_mib: {memory} must be >= 1")
        return cls(
            uuid=_field(obj, "uuid", str, where),
            index=_non_negative(_field(obj, "index", int, where), f"{where}.index"),
            memory_mib=memory,
            cores=cores,
        )


@dataclass(frozen=True)
class ContainerAllocation:
    """The cards given to one container of a pod; ``init`` marks an init container."""

    name: str
    init: bool
    cards: tuple[CardShare, ...]

    @property
    def uuids(self) -> tuple[str, ...]:
        """The card UUIDs in allocation order (what NVIDIA_VISIBLE_DEVICES lists)."""
        return tuple(c.uuid for c in self.cards)


@dataclass(frozen=True)
class Allocation:
    """The pod annotation ``egpu.io/allocation``: one entry per container with a share."""

    containers: tuple[ContainerAllocation, ...]
    node: str = ""

    def for_container(self, name: str) -> ContainerAllocation | None:
        """The entry of container ``name``, or None when it has no share."""
        return next((c for c in self.containers if c.name == name), None)

    def encode(self) -> str:
        """JSON text: ``{"version": 1, "node": str, "containers": [...]}``."""
        return json.dumps(
            {
                "version": RECORD_VERSION,
                "node": self.node,
                "containers": [
                    {"name": c.name, "init": c.init, "cards": [asdict(s) for s in c.cards]}
                    for c in self.containers
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str | bytes) -> Allocation:
        """Parse the annotation text. Raises RecordError naming the bad field."""
        data = _load_object(text, "allocation")
        containers = []
        for i, c in enumerate(_list(data, "containers", "allocation")):
            where = f"allocation.containers[{i}]"
            if not isinstance(c, dict):
                raise RecordError(f"{where}: expected an object, got {c!r}")
            cards = tuple(
                CardShare.from_dict(s, f"{where}.cards[{j}]")
                for j, s in enumerate(_list(c, "cards", where))
            )
            if not cards:
                raise RecordError(f"{where}.cards: empty; a container with a share has >= 1 card")
            if len({s.uuid for s in cards}) != len(cards):
                raise RecordError(f"{where}.cards: a card appears twice; cards must be distinct")
            containers.append(
                ContainerAllocation(
                    name=_field(c, "name", str, where),
                    init=_field(c, "init", bool, where),
                    cards=cards,
                )
            )
        node = data.get("node", "")
        if not isinstance(node, str):
            raise RecordError(f"allocation.node: {node!r} is not a string")
        return cls(containers=tuple(containers), node=node)


@dataclass(frozen=True)
class ConfigCard:
    """One card in the interposer's config: limit in MiB, cores in % (0 = none booked)."""

    uuid: str
    memory_mib: int
    cores: int
    card_region: str


@dataclass(frozen=True)
class ContainerConfig:
    """The interposer's config file, ``/run/egpu/config.json`` in the container (read-only).

    Written by the runtime hook; read by libinterpose (libinterpose/src/config.c mirrors it).
    """

    namespace: str
    pod: str
    pod_uid: str
    container: str
    priority: str
    compute_policy: str
    memory_oversubscription: bool
    container_region: str
    cards: tuple[ConfigCard, ...] = field(default_factory=tuple)
    low_priority_floor: int = 0  # %, a low-priority share's floor (the node's config)

    def encode(self) -> str:
        """JSON text with ``version`` first; see docs/design.md for the schema."""
        body = asdict(self)
        return json.dumps({"version": RECORD_VERSION, **body}, indent=1)

    @classmethod
    def decode(cls, text: str | bytes) -> ContainerConfig:
        """Parse the file. Raises RecordError naming the bad field."""
        data = _load_object(text, "config")
        priority = _field(data, "priority", str, "config")
        if priority not in PRIORITIES:
            raise RecordError(f"config.priority: {priority!r}; allowed: {', '.join(PRIORITIES)}")
        policy = _field(data, "compute_policy", str, "config")
        if policy not in COMPUTE_POLICIES:
            raise RecordError(
                f"config.compute_policy: {policy!r}; allowed: {', '.join(COMPUTE_POLICIES)}"
            )
        cards = []
        for i, c in enumerate(_list(data, "cards", "config")):
            where = f"config.cards[{i}]"
            if not isinstance(c, dict):
                raise RecordError(f"{where}: expected an object, got {c!r}")
            cards.append(
                ConfigCard(
                    uuid=_field(c, "uuid", str, where),
                    memory_mib=_field(c, "memory_mib", int, where),
                    cores=_field(c, "cores", int, where),
                    card_region=_field(c, "card_region", str, where),
                )
            )
        return cls(
            namespace=_field(data, "namespace", str, "config"),
            pod=_field(data, "pod", str, "config"),
            pod_uid=_field(data, "pod_uid", str, "config"),
            container=_field(data, "container", str, "config"),
            priority=priority,
            compute_policy=policy,
            memory_oversubscription=_field(data, "memory_oversubscription", bool, "config"),
            container_region=_field(data, "container_region", str, "config"),
            cards=tuple(cards),
            low_priority_floor=_floor(data, "config"),
        )


def _floor(data: dict[str, Any], where: str) -> int:
    """The optional ``low_priority_floor`` (%, 0..100; absent in files of older agents: 0)."""
    value = data.get("low_priority_floor", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise RecordError(f"{where}.low_priority_floor: {value!r}; allowed: an integer 0..100")
    return value


@dataclass(frozen=True)
class PodShares:
    """A pod's allocation file on its node, ``<NODE_PRIVATE_DIR>/allocations/<pod-uid>.json``.

    Written by the node agent when it sees a pod bound to its node with an ``egpu.io/allocation``
    annotation; read by the runtime hook, which builds each container's ``ContainerConfig``
    from it. The policies are the pod's resolved values (egpu.requests.read_pod).
    """

    namespace: str
    pod: str
    pod_uid: str
    priority: str
    compute_policy: str
    memory_oversubscription: bool
    allocation: Allocation
    low_priority_floor: int = 0  # %, from the node's config (lowPriorityFloorPercent)

    def encode(self) -> str:
        """JSON text: ``{"version": 1, "namespace", "pod", "pod_uid", "priority",
        "compute_policy", "memory_oversubscription", "low_priority_floor",
        "allocation": <Allocation JSON>}``."""
        body = {
            "version": RECORD_VERSION,
            "namespace": self.namespace,
            "pod": self.pod,
            "pod_uid": self.pod_uid,
            "priority": self.priority,
            "compute_policy": self.compute_policy,
            "memory_oversubscription": self.memory_oversubscription,
            "low_priority_floor": self.low_priority_floor,
            "allocation": json.loads(self.allocation.encode()),
        }
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> PodShares:
        """Parse the file. Raises RecordError naming the bad field."""
        data = _load_object(text, "pod-shares")
        priority = _field(data, "priority", str, "pod-shares")
        if priority not in PRIORITIES:
            raise RecordError(
                f"pod-shares.priority: {priority!r}; allowed: {', '.join(PRIORITIES)}"
            )
        policy = _field(data, "compute_policy", str, "pod-shares")
        if policy not in COMPUTE_POLICIES:
            raise RecordError(
                f"pod-shares.compute_policy: {policy!r}; allowed: {', '.join(COMPUTE_POLICIES)}"
            )
        allocation = _field(data, "allocation", dict, "pod-shares")
        return cls(
            namespace=_field(data, "namespace", str, "pod-shares"),
            pod=_field(data, "pod", str, "pod-shares"),
            pod_uid=_field(data, "pod_uid", str, "pod-shares"),
            priority=priority,
            compute_policy=policy,
            memory_oversubscription=_field(data, "memory_oversubscription", bool, "pod-shares"),
            allocation=Allocation.decode(json.dumps(allocation)),
            low_priority_floor=_floor(data, "pod-shares"),
        )


@dataclass(frozen=True)
class ShareUsage:
    """Measured use of one container's share of one card: memory_used_mib (MiB), compute (%)."""

    pod_uid: str
    container: str
    uuid: str
    memory_used_mib: int
    compute_used_percent: float


@dataclass(frozen=True)
class CardUsage:
    """Measured use of one card: memory_used_mib (MiB, all processes), compute (% of the card)."""

    uuid: str
    memory_used_mib: int
    compute_used_percent: float


@dataclass(frozen=True)
class NodeUsage:
    """The node annotation ``egpu.io/usage``, refreshed by the node agent with the heartbeat.

    Read by ``egpu top`` / ``kubectl egpu`` so that usage shows through the API alone.
    """

    cards: tuple[CardUsage, ...]
    shares: tuple[ShareUsage, ...] = ()

    def encode(self) -> str:
        """JSON text: ``{"version": 1, "cards": [...], "shares": [...]}``."""
        return json.dumps({"version": RECORD_VERSION, "cards": [asdict(c) for c in self.cards],
                           "shares": [asdict(s) for s in self.shares]}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> NodeUsage:
        """Parse the annotation text. Raises RecordError naming the bad field."""
        data = _load_object(text, "usage")

        def number(obj: dict[str, Any], key: str, where: str) -> float:
            value = obj.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RecordError(f"{where}.{key}: {value!r} is not a number")
            return float(value)

        cards = []
        for i, c in enumerate(_list(data, "cards", "usage")):
            where = f"usage.cards[{i}]"
            if not isinstance(c, dict):
                raise RecordError(f"{where}: expected an object, got {c!r}")
            cards.append(CardUsage(_field(c, "uuid", str, where),
                                   _field(c, "memory_used_mib", int, where),
                                   number(c, "compute_used_percent", where)))
        shares = []
        for i, s in enumerate(data.get("shares") or []):
            where = f"usage.shares[{i}]"
            if not isinstance(s, dict):
                raise RecordError(f"{where}: expected an object, got {s!r}")
            shares.append(ShareUsage(_field(s, "pod_uid", str, where),
                                     _field(s, "container", str, where),
                                     _field(s, "uuid", str, where),
                                     _field(s, "memory_used_mib", int, where),
                                     number(s, "compute_used_percent", where)))
        return cls(tuple(cards), tuple(shares))
