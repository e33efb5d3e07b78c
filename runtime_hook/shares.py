"""The two records the hook reads and writes, without dataclasses (startup time).

- ``decode_pod_shares``: a pod's allocation file (the wire format of ``egpu.records.PodShares``,
  written by the node agent), checked as ``PodShares.decode`` checks it, with the same
  messages; the result has the attributes the hook reads (``namespace``, ``pod``, ``pod_uid``,
  ``priority``, ``compute_policy``, ``memory_oversubscription``,
  ``allocation.for_container(name).cards[i].uuid / memory_mib / cores``), so that the hook's
  decision (runtime_hook.plan) also takes an ``egpu.records.PodShares``.
- ``ContainerConfig`` / ``ConfigCard``: the interposer's config file; ``encode()`` writes the
  very text ``egpu.records.ContainerConfig.encode()`` writes.

egpu.records stays the one definition of these formats; tests/node/test_hook_startup.py checks
this reading of them against it (same values, same refusals, same bytes).
"""

from __future__ import annotations

from egpu.contract import COMPUTE_POLICIES, PRIORITIES, RECORD_VERSION
from runtime_hook.fastjson import dumps_indented, loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class ShareError(ValueError):
    """The allocation file is malformed (as egpu.records.RecordError); names field and value."""


def _load_object(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = loads(text)
    except (ValueError, TypeError) as exc:
        raise ShareError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ShareError(f"{what}: expected a JSON object, got {type(data).__name__}")
    version = data.get("version")
    if version != RECORD_VERSION:
        raise ShareError(
            f"{what}.version: {version!r} is not supported; allowed: {RECORD_VERSION}")
    return data


def _field(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in obj:
        raise ShareError(f"{where}.{key}: missing")
    value = obj[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ShareError(f"{where}.{key}: {value!r} is not an integer")
    if kind is not int and not isinstance(value, kind):
        raise ShareError(f"{where}.{key}: {value!r} is not a {kind.__name__}")
    return value


class CardShare:
    """What a container holds of one card: memory_mib (MiB), cores (%, 0 = none booked)."""

    __slots__ = ("cores", "index", "memory_mib", "uuid")

    def __init__(self, uuid: str, index: int, memory_mib: int, cores: int) -> None:
        self.uuid, self.index, self.memory_mib, self.cores = uuid, index, memory_mib, cores


class ContainerShare:
    """One container's entry of the pod's allocation."""

    __slots__ = ("cards", "init", "name")

    def __init__(self, name: str, init: bool, cards: tuple[CardShare, ...]) -> None:
        self.name, self.init, self.cards = name, init, cards


class Allocation:
    """The pod's ``egpu.io/allocation`` as the hook reads it."""

    __slots__ = ("containers", "node")

    def __init__(self, containers: tuple[ContainerShare, ...], node: str = "") -> None:
        self.containers, self.node = containers, node

    def for_container(self, name: str) -> ContainerShare | None:
        """The entry of container ``name``, or None when it has no share."""
        for entry in self.containers:
            if entry.name == name:
                return entry
        return None


class PodShares:
    """A pod's allocation file, as the hook reads it (see the module docstring)."""

    __slots__ = ("allocation", "compute_policy", "low_priority_floor", "memory_oversubscription",
                 "namespace", "pod", "pod_uid", "priority")

    def __init__(self, namespace: str, pod: str, pod_uid: str, priority: str,
                 compute_policy: str, memory_oversubscription: bool,
                 allocation: Allocation, low_priority_floor: int = 0) -> None:
        self.namespace, self.pod, self.pod_uid = namespace, pod, pod_uid
        self.priority, self.compute_policy = priority, compute_policy
        self.memory_oversubscription = memory_oversubscription
        self.allocation = allocation
        self.low_priority_floor = low_priority_floor


def _floor(data: dict[str, Any], where: str) -> int:
    """The optional ``low_priority_floor`` (%, 0..100; absent: 0), as egpu.records reads it."""
    value = data.get("low_priority_floor", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise ShareError(f"{where}.low_priority_floor: {value!r}; allowed: an integer 0..100")
    return value


def _card(obj: Any, where: str) -> CardShare:
    if not isinstance(obj, dict):
        raise ShareError(f"{where}: expected an object, got {obj!r}")
    cores = _field(obj, "cores", int, where)
    if not 0 <= cores <= 100:
        raise ShareError(f"{where}.cores: {cores} out of range; allowed: 0..100")
    memory = _field(obj, "memory_mib", int, where)
    if memory <= 0:
        raise ShareError(f"{where}.memory_mib: {memory} must be >= 1")
    uuid = _field(obj, "uuid", str, where)
    index = _field(obj, "index", int, where)
    if index < 0:
        raise ShareError(f"{where}.index: {index} is negative; allowed: >= 0")
    return CardShare(uuid, index, memory, cores)


def _allocation(data: dict[str, Any]) -> Allocation:
    if data.get("version") != RECORD_VERSION:
        raise ShareError(f"allocation.version: {data.get('version')!r} is not supported; "
                         f"allowed: {RECORD_VERSION}")
    containers = []
    for i, c in enumerate(_field(data, "containers", list, "allocation")):
        where = f"allocation.containers[{i}]"
        if not isinstance(c, dict):
            raise ShareError(f"{where}: expected an object, got {c!r}")
        cards = tuple(_card(s, f"{where}.cards[{j}]")
                      for j, s in enumerate(_field(c, "cards", list, where)))
        if not cards:
            raise ShareError(f"{where}.cards: empty; a container with a share has >= 1 card")
        if len({s.uuid for s in cards}) != len(cards):
            raise ShareError(f"{where}.cards: a card appears twice; cards must be distinct")
        containers.append(ContainerShare(_field(c, "name", str, where),
                                         _field(c, "init", bool, where), cards))
    node = data.get("node", "")
    if not isinstance(node, str):
        raise ShareError(f"allocation.node: {node!r} is not a string")
    return Allocation(tuple(containers), node)


def decode_pod_shares(text: str | bytes) -> PodShares:
    """Parse an allocation file as ``egpu.records.PodShares.decode`` does. Raises ShareError
    naming the bad field."""
    where = "pod-shares"
    data = _load_object(text, where)
    priority = _field(data, "priority", str, where)
    if priority not in PRIORITIES:
        raise ShareError(f"{where}.priority: {priority!r}; allowed: {', '.join(PRIORITIES)}")
    policy = _field(data, "compute_policy", str, where)
    if policy not in COMPUTE_POLICIES:
        raise ShareError(
            f"{where}.compute_policy: {policy!r}; allowed: {', '.join(COMPUTE_POLICIES)}")
    allocation = _field(data, "allocation", dict, where)
    return PodShares(
        namespace=_field(data, "namespace", str, where),
        pod=_field(data, "pod", str, where),
        pod_uid=_field(data, "pod_uid", str, where),
        priority=priority,
        compute_policy=policy,
        memory_oversubscription=_field(data, "memory_oversubscription", bool, where),
        allocation=_allocation(allocation),
        low_priority_floor=_floor(data, where),
    )


class ConfigCard:
    """One card in the interposer's config: limit in MiB, cores in % (0 = none booked)."""

    __slots__ = ("card_region", "cores", "memory_mib", "uuid")

    def __init__(self, uuid: str, memory_mib: int, cores: int, card_region: str) -> None:
        self.uuid, self.memory_mib, self.cores = uuid, memory_mib, cores
        self.card_region = card_region


class ContainerConfig:
    """The interposer's config file, ``/run/egpu/config.json`` (egpu.records.ContainerConfig)."""

    __slots__ = ("cards", "compute_policy", "container", "container_region",
                 "low_priority_floor", "memory_oversubscription", "namespace", "pod", "pod_uid",
                 "priority")

    def __init__(self, namespace: str, pod: str, pod_uid: str, container: str, priority: str,
                 compute_policy: str, memory_oversubscription: bool, container_region: str,
                 cards: tuple[ConfigCard, ...] = (), low_priority_floor: int = 0) -> None:
        self.namespace, self.pod, self.pod_uid = namespace, pod, pod_uid
        self.container, self.priority, self.compute_policy = container, priority, compute_policy
        self.memory_oversubscription = memory_oversubscription
        self.container_region = container_region
        self.cards = cards
        self.low_priority_floor = low_priority_floor

    def encode(self) -> str:
        """The text of ``egpu.records.ContainerConfig.encode()`` (``version`` first)."""
        return dumps_indented({
            "version": RECORD_VERSION,
            "namespace": self.namespace,
            "pod": self.pod,
            "pod_uid": self.pod_uid,
            "container": self.container,
            "priority": self.priority,
            "compute_policy": self.compute_policy,
            "memory_oversubscription": self.memory_oversubscription,
            "container_region": self.container_region,
            "cards": [{"uuid": c.uuid, "memory_mib": c.memory_mib, "cores": c.cores,
                       "card_region": c.card_region} for c in self.cards],
            "low_priority_floor": self.low_priority_floor,
        })
