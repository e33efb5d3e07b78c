"""Device-plugin slots: each card is advertised as ``shares_per_card`` devices.

A slot id is ``<card uuid>::<k>`` with ``k`` in ``0..shares_per_card-1`` (at most 63
characters, as v1beta1 requires; NVML UUIDs are 40). The kubelet counts slots as the
allocatable ``egpu.io/gpu``; which slot of a card a container gets carries no meaning, only
the card does.
"""

from __future__ import annotations

from dataclasses import dataclass

from egpu.records import Card

SEPARATOR = "::"
HEALTHY = "Healthy"  # v1beta1 constants
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Slot:
    """One advertised device: its id, its card's UUID, health and NUMA node (-1: unknown)."""

    id: str
    uuid: str
    healthy: bool
    numa_node: int


def slot_id(uuid: str, k: int) -> str:
    """``<uuid>::<k>``."""
    return f"{uuid}{SEPARATOR}{k}"


def card_of(device_id: str) -> str:
    """The card UUID of slot id ``device_id`` (the text before the last ``::``); a bare UUID
    is its own card."""
    return device_id.rpartition(SEPARATOR)[0] or device_id


def slots(cards: tuple[Card, ...] | list[Card], shares_per_card: int) -> list[Slot]:
    """All slots of ``cards`` in card-index order, ``shares_per_card`` each."""
    return [
        Slot(slot_id(c.uuid, k), c.uuid, c.healthy, c.numa_node)
        for c in sorted(cards, key=lambda c: c.index)
        for k in range(shares_per_card)
    ]
