"""Versioned JSON records that egpu's parts exchange through the Kubernetes API and files.

- ``Allocation``: the pod annotation ``egpu.io/allocation``, everything decided at placement
  (egpu's scheduler -> node agent, exporter, ``kubectl egpu``): each container's cards and kind, and
  the pod's resolved priority, compute policy and memory oversubscription.
- ``PodShares``: the pod's allocation file on its node (node agent -> runtime hook).
- ``ContainerConfig``: the interposer's read-only ``/run/egpu/config.json`` (hook -> C side).
- ``Inventory``, ``NodeUsage`` (with ``Card``, ``CardUsage``, ``ShareUsage``): the node
  annotations ``egpu.io/inventory`` and ``egpu.io/usage``, defined in ``egpu.node_records``
  and importable from here (loaded on first use).

Each has ``encode() -> str`` and a ``decode(text) -> record`` classmethod that raises
``RecordError`` naming the field, the value and what is allowed for anything malformed.
Units: memory in MiB, compute in % of one card.

This module is the only decoder of these formats, the runtime hook's included (it runs for
every container a node creates), so it is light to import: ``json`` and ``egpu.contract``
only, no ``dataclasses`` or ``typing`` at run time. Its records are immutable values
(``_Record``): equality, hash and repr over their fields, ``replace(**changes)``.
"""

from __future__ import annotations

import json

from egpu.contract import COMPUTE_POLICIES, PRIORITIES, RECORD_VERSION, is_file_name

TYPE_CHECKING = False  # no typing at run time: the hook's startup (see the docstring)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, ClassVar, Self

    from egpu.node_records import Card, CardUsage, Inventory, NodeUsage, ShareUsage

__all__ = [
    "CONTAINER_KINDS",
    "KIND_APP",
    "KIND_INIT",
    "KIND_SIDECAR",
    "Allocation",
    "Card",
    "CardShare",
    "CardUsage",
    "ConfigCard",
    "ContainerAllocation",
    "ContainerConfig",
    "Inventory",
    "NodeUsage",
    "PodShares",
    "RecordError",
    "ShareUsage",
]

# A container's kind in the allocation: the values of egpu.requests.ContainerKind (app
# containers, init containers, sidecars = init containers with restartPolicy Always).
KIND_APP = "container"
KIND_INIT = "init"
KIND_SIDECAR = "sidecar"
CONTAINER_KINDS = (KIND_APP, KIND_INIT, KIND_SIDECAR)

_NODE_RECORDS = ("Card", "CardUsage", "Inventory", "NodeUsage", "ShareUsage")


def __getattr__(name: str) -> Any:
    """The node records (``egpu.node_records``, dataclasses), loaded on first use."""
    if name in _NODE_RECORDS:
        from egpu import node_records

        value = getattr(node_records, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RecordError(ValueError):
    """A record (annotation or file) is malformed; the message names the field and value."""


def _load_object(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise RecordError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{what}: expected a JSON object, got {type(data).__name__}")
    _check_version(data, what)
    return data


def _check_version(data: dict[str, Any], what: str) -> None:
    version = data.get("version")
    # an int, not a bool or a float that equals it: `true` or 1.0 is no version egpu writes
    if type(version) is not int or version != RECORD_VERSION:
        raise RecordError(
            f"{what}.version: {version!r} is not supported; allowed: {RECORD_VERSION}")


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


def _choice(obj: dict[str, Any], key: str, allowed: tuple[str, ...], where: str) -> str | None:
    """The optional string ``key`` of ``obj``, one of ``allowed``; None when absent."""
    if key not in obj:
        return None
    value: str = _field(obj, key, str, where)
    if value not in allowed:
        raise RecordError(f"{where}.{key}: {value!r}; allowed: {', '.join(allowed)}")
    return value


def _non_negative(value: int, where: str) -> int:
    if value < 0:
        raise RecordError(f"{where}: {value} is negative; allowed: >= 0")
    return value


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value: list[Any] = _field(obj, key, list, where)
    return value


class _Record:
    """An immutable value over ``_FIELDS`` (the constructor's parameters, in order): what a
    frozen dataclass gives (equality, hash, repr, copy and pickle), without importing
    ``dataclasses`` (the hook's startup). ``replace(**changes)`` is ``dataclasses.replace``."""

    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *values: Any) -> None:
        for name, value in zip(self._FIELDS, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is "
                             "immutable (use replace())")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, _Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[type[Self], tuple[Any, ...]]:
        return type(self), self._values()

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (field name -> value)."""
        values = dict(zip(self._FIELDS, self._values(), strict=True))
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        values.update(changes)
        return type(self)(*values.values())


class CardShare(_Record):
    """What one container holds of one card: memory_mib (MiB) and cores (%, 0 = none booked)."""

    __slots__ = ("cores", "index", "memory_mib", "uuid")
    _FIELDS = ("uuid", "index", "memory_mib", "cores")
    uuid: str
    index: int
    memory_mib: int
    cores: int

    def __init__(self, uuid: str, index: int, memory_mib: int, cores: int) -> None:
        super().__init__(uuid, index, memory_mib, cores)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: ``{"uuid", "index", "memory_mib", "cores"}``."""
        return {"uuid": self.uuid, "index": self.index, "memory_mib": self.memory_mib,
                "cores": self.cores}

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


class ContainerAllocation(_Record):
    """The cards given to one container of a pod.

    ``init``: an init container (sidecars included: they are declared among the init
    containers). ``kind``: ``KIND_APP``, ``KIND_INIT`` or ``KIND_SIDECAR``, as the scheduler
    read the pod at placement; None in records written before the allocation carried it.
    ``share``: the folder name of the accounting region the container draws on when it is not
    its own (``<pod-uid>_<container>``): a ResourceClaim's requests, shared by every container
    naming them (``egpu.contract.claim_share_dir_name``); None for a container's own share."""

    __slots__ = ("cards", "init", "kind", "name", "share")
    _FIELDS = ("name", "init", "cards", "kind", "share")
    name: str
    init: bool
    cards: tuple[CardShare, ...]
    kind: str | None
    share: str | None

    def __init__(self, name: str, init: bool, cards: tuple[CardShare, ...],
                 kind: str | None = None, share: str | None = None) -> None:
        super().__init__(name, init, cards, kind, share)

    @property
    def uuids(self) -> tuple[str, ...]:
        """The card UUIDs in allocation order (what NVIDIA_VISIBLE_DEVICES lists)."""
        return tuple(c.uuid for c in self.cards)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: ``{"name", "kind" (when known), "init", "cards", "share" (when
        set)}``."""
        body: dict[str, Any] = {"name": self.name}
        if self.kind is not None:
            body["kind"] = self.kind
        body["init"] = self.init
        body["cards"] = [s.to_dict() for s in self.cards]
        if self.share is not None:
            body["share"] = self.share
        return body

    @classmethod
    def from_dict(cls, obj: Any, where: str) -> ContainerAllocation:
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: expected an object, got {obj!r}")
        cards = tuple(
            CardShare.from_dict(s, f"{where}.cards[{j}]")
            for j, s in enumerate(_list(obj, "cards", where))
        )
        if not cards:
            raise RecordError(f"{where}.cards: empty; a container with a share has >= 1 card")
        if len({s.uuid for s in cards}) != len(cards):
            raise RecordError(f"{where}.cards: a card appears twice; cards must be distinct")
        name = _field(obj, "name", str, where)
        init = _field(obj, "init", bool, where)
        kind = _choice(obj, "kind", CONTAINER_KINDS, where)
        if kind is not None and init != (kind != KIND_APP):
            raise RecordError(f"{where}.init: {init!r} does not match kind {kind!r} (an "
                              f"init container or sidecar has init true, an app container "
                              "false)")
        share = obj.get("share")
        if share is not None and (not isinstance(share, str) or not is_file_name(share)):
            raise RecordError(f"{where}.share: {share!r}; allowed: a folder name (no '/', "
                              "not '.' or '..', not empty)")
        return cls(name=name, init=init, cards=cards, kind=kind, share=share)


def sum_card_shares(groups: Iterable[Iterable[CardShare]]) -> tuple[CardShare, ...]:
    """The shares of ``groups`` (each a request's cards) summed per card, in first-seen order:
    what one container holds when it names several requests (an init container's request and
    its headroom request pinned to the same card)."""
    per_card: dict[str, CardShare] = {}
    for group in groups:
        for c in group:
            held = per_card.get(c.uuid)
            per_card[c.uuid] = c if held is None else CardShare(
                c.uuid, c.index, held.memory_mib + c.memory_mib, held.cores + c.cores)
    return tuple(per_card.values())


class Allocation(_Record):
    """The pod annotation ``egpu.io/allocation``: one entry per container with a share, and
    the pod's policies as resolved at placement (``priority``, ``compute_policy``,
    ``memory_oversubscription``; None in records written before the allocation carried
    them: ``complete`` says whether this one does)."""

    __slots__ = ("compute_policy", "containers", "memory_oversubscription", "node", "priority")
    _FIELDS = ("containers", "node", "priority", "compute_policy", "memory_oversubscription")
    containers: tuple[ContainerAllocation, ...]
    node: str
    priority: str | None
    compute_policy: str | None
    memory_oversubscription: bool | None

    def __init__(self, containers: tuple[ContainerAllocation, ...], node: str = "",
                 priority: str | None = None, compute_policy: str | None = None,
                 memory_oversubscription: bool | None = None) -> None:
        super().__init__(containers, node, priority, compute_policy, memory_oversubscription)

    def for_container(self, name: str) -> ContainerAllocation | None:
        """The entry of container ``name``, or None when it has no share."""
        return next((c for c in self.containers if c.name == name), None)

    @property
    def policies(self) -> tuple[str, str, bool] | None:
        """``(priority, compute_policy, memory_oversubscription)`` as resolved at placement;
        None when the record does not carry all three (a record of an older scheduler)."""
        if (self.priority is None or self.compute_policy is None
                or self.memory_oversubscription is None):
            return None
        return self.priority, self.compute_policy, self.memory_oversubscription

    @property
    def complete(self) -> bool:
        """Whether the record carries every fact decided at placement: each container's kind
        and the three policies (a record of an older scheduler does not)."""
        return self.policies is not None and all(c.kind is not None for c in self.containers)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (see ``encode``); the policies only where known."""
        body: dict[str, Any] = {"version": RECORD_VERSION, "node": self.node}
        for key in ("priority", "compute_policy", "memory_oversubscription"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        body["containers"] = [c.to_dict() for c in self.containers]
        return body

    def encode(self) -> str:
        """JSON text: ``{"version": 1, "node": str, "priority", "compute_policy",
        "memory_oversubscription", "containers": [{"name", "kind", "init", "cards"}]}``."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Allocation:
        """Parse the annotation text. Raises RecordError naming the bad field. A record of an
        older scheduler (no kinds, no policies) reads with those fields None."""
        return cls.from_dict(_load_object(text, "allocation"))

    @classmethod
    def from_dict(cls, data: Any) -> Allocation:
        """The record from its parsed JSON object (version included)."""
        where = "allocation"
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(data).__name__}")
        _check_version(data, where)
        containers = tuple(
            ContainerAllocation.from_dict(c, f"{where}.containers[{i}]")
            for i, c in enumerate(_list(data, "containers", where))
        )
        node = data.get("node", "")
        if not isinstance(node, str):
            raise RecordError(f"{where}.node: {node!r} is not a string")
        oversubscription = (_field(data, "memory_oversubscription", bool, where)
                            if "memory_oversubscription" in data else None)
        return cls(containers=containers, node=node,
                   priority=_choice(data, "priority", PRIORITIES, where),
                   compute_policy=_choice(data, "compute_policy", COMPUTE_POLICIES, where),
                   memory_oversubscription=oversubscription)


class ConfigCard(_Record):
    """One card in the interposer's config: limit in MiB, cores in % (0 = none booked).
    memory_percentage (1..100): a raw container's limit as a % of the card, whose size the
    hook does not know; then memory_mib is 0 and the file holds only the percentage."""

    __slots__ = ("card_region", "cores", "memory_mib", "memory_percentage", "uuid")
    _FIELDS = ("uuid", "memory_mib", "cores", "card_region", "memory_percentage")
    uuid: str
    memory_mib: int
    cores: int
    card_region: str
    memory_percentage: int

    def __init__(self, uuid: str, memory_mib: int, cores: int, card_region: str,
                 memory_percentage: int = 0) -> None:
        super().__init__(uuid, memory_mib, cores, card_region, memory_percentage)

    def to_json(self) -> dict[str, Any]:
        """The file's object: ``memory_mib``, or ``memory_percentage`` instead when set."""
        body = {name: getattr(self, name) for name in self._FIELDS}
        body.pop("memory_mib" if self.memory_percentage else "memory_percentage")
        return body


class ContainerConfig(_Record):
    """The interposer's config file, ``/run/egpu/config.json`` in the container (read-only).

    Written by the runtime hook; read by libinterpose (libinterpose/src/config.c mirrors it).
    """

    __slots__ = ("cards", "compute_policy", "container", "container_region",
                 "low_priority_floor", "memory_oversubscription", "namespace", "pod", "pod_uid",
                 "priority")
    _FIELDS = ("namespace", "pod", "pod_uid", "container", "priority", "compute_policy",
               "memory_oversubscription", "container_region", "cards", "low_priority_floor")
    namespace: str
    pod: str
    pod_uid: str
    container: str
    priority: str
    compute_policy: str
    memory_oversubscription: bool
    container_region: str
    cards: tuple[ConfigCard, ...]
    low_priority_floor: int  # %, a low-priority share's floor (the node's config)

    def __init__(self, namespace: str, pod: str, pod_uid: str, container: str, priority: str,
                 compute_policy: str, memory_oversubscription: bool, container_region: str,
                 cards: tuple[ConfigCard, ...] = (), low_priority_floor: int = 0) -> None:
        super().__init__(namespace, pod, pod_uid, container, priority, compute_policy,
                         memory_oversubscription, container_region, cards, low_priority_floor)

    def encode(self) -> str:
        """JSON text with ``version`` first, then the fields in order; see docs/design.md."""
        body: dict[str, Any] = {"version": RECORD_VERSION}
        for name in self._FIELDS:
            body[name] = getattr(self, name)
        body["cards"] = [c.to_json() for c in self.cards]
        return json.dumps(body, indent=1)

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
            by_percentage = "memory_percentage" in c
            cards.append(
                ConfigCard(
                    uuid=_field(c, "uuid", str, where),
                    memory_mib=0 if by_percentage else _field(c, "memory_mib", int, where),
                    cores=_field(c, "cores", int, where),
                    card_region=_field(c, "card_region", str, where),
                    memory_percentage=(_field(c, "memory_percentage", int, where)
                                       if by_percentage else 0),
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


class PodShares(_Record):
    """A pod's allocation file on its node, ``<NODE_PRIVATE_DIR>/allocations/<pod-uid>.json``.

    Written by the node agent when it sees a pod bound to its node with an ``egpu.io/allocation``
    annotation; read by the runtime hook, which builds each container's ``ContainerConfig``
    from it. The policies are the pod's resolved values: those of the allocation record (for a
    record of an older scheduler, the node agent's reading of the pod).
    """

    __slots__ = ("allocation", "compute_policy", "low_priority_floor", "memory_oversubscription",
                 "namespace", "pod", "pod_uid", "priority")
    _FIELDS = ("namespace", "pod", "pod_uid", "priority", "compute_policy",
               "memory_oversubscription", "allocation", "low_priority_floor")
    namespace: str
    pod: str
    pod_uid: str
    priority: str
    compute_policy: str
    memory_oversubscription: bool
    allocation: Allocation
    low_priority_floor: int  # %, from the node's config (lowPriorityFloorPercent)

    def __init__(self, namespace: str, pod: str, pod_uid: str, priority: str,
                 compute_policy: str, memory_oversubscription: bool, allocation: Allocation,
                 low_priority_floor: int = 0) -> None:
        super().__init__(namespace, pod, pod_uid, priority, compute_policy,
                         memory_oversubscription, allocation, low_priority_floor)

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
            "allocation": self.allocation.to_dict(),
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
            allocation=Allocation.from_dict(allocation),
            low_priority_floor=_floor(data, "pod-shares"),
        )
