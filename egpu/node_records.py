"""The node annotations' records (dataclasses), importable from ``egpu.records`` too.

- ``Inventory`` (with ``Card``): the node annotation ``egpu.io/inventory`` (node agent ->
  scheduler, ``kubectl egpu``).
- ``NodeUsage`` (with ``CardUsage``, ``ShareUsage``): the node annotation ``egpu.io/usage``
  (node agent -> ``kubectl egpu``).

They live apart from ``egpu.records`` because they are dataclasses (``dataclasses.replace``,
``asdict`` are used on them) and the runtime hook, which imports ``egpu.records`` for every
container with a share, never reads them: ``egpu.records`` loads this module on first use.
Same conventions as there: ``encode() -> str``, ``decode(text)`` raising ``RecordError``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from egpu.contract import MAX_SHARE_MIB, RECORD_VERSION
from egpu.records import RecordError, _field, _list, _load_object, _non_negative

# The largest card size (MiB) an inventory may state: a card's whole memory is what a share of
# 100% gets, so no card larger than a share may be (MAX_SHARE_MIB, 1 EiB, far above any GPU).
# The bound also keeps placement's arithmetic finite (the scheduler multiplies a card's size by
# the float oversubscription ratio: 10**400 MiB overflowed there, failing every filter).
MAX_CARD_MIB = MAX_SHARE_MIB


def _shown(value: int) -> str:
    """An integer for a message: itself, or its digit count when it is too long to read."""
    text = str(value)
    return text if len(text) <= 20 else f"an integer of {len(text.lstrip('-'))} digits"


@dataclass(frozen=True)
class Card:
    """One physical GPU as the node agent found it. memory_mib: NVML total, MiB.
    driver_memory_limit: its driver takes a per-container memory limit (NVML r615,
    egpu.driver_limits), which the runtime hook sets to each share."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = True
    numa_node: int = -1
    driver_memory_limit: bool = False

    @classmethod
    def from_dict(cls, obj: Any, where: str) -> Card:
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: expected an object, got {obj!r}")
        uuid = _field(obj, "uuid", str, where)
        if not uuid:
            raise RecordError(f"{where}.uuid: empty")
        memory = _field(obj, "memory_mib", int, where)
        if memory <= 0:
            raise RecordError(f"{where}.memory_mib: {_shown(memory)} must be >= 1")
        if memory > MAX_CARD_MIB:
            raise RecordError(f"{where}.memory_mib: {_shown(memory)} out of range; "
                              f"allowed: 1..{MAX_CARD_MIB}")
        return cls(
            uuid=uuid,
            index=_non_negative(_field(obj, "index", int, where), f"{where}.index"),
            model=_field(obj, "model", str, where),
            memory_mib=memory,
            healthy=_field(obj, "healthy", bool, where) if "healthy" in obj else True,
            numa_node=_field(obj, "numa_node", int, where) if "numa_node" in obj else -1,
            driver_memory_limit=(_field(obj, "driver_memory_limit", bool, where)
                                 if "driver_memory_limit" in obj else False),
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
