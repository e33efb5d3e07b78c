"""What a pod books on each of its cards: Kubernetes' effective-request rule, card by card.

A pod's containers do not all run at once. App containers and sidecars (init containers with
``restartPolicy: Always``) run together, so their shares add up; each plain init container
runs alone, beside only the sidecars declared before it. On one card a pod therefore books,
for memory, cores and device-plugin slots each on its own (as Kubernetes does per resource)::

    booked = max( sum(app + sidecar shares on the card),
                  max over init containers i on the card of
                      (share_i + sum(sidecar shares declared before i on the card)) )

A slot is one container on one card (a container's share of a card takes one of the card's
``Config.shares_per_card`` device-plugin slots).

``book_card(entries)`` applies the rule to the containers of one pod on one card;
``allocation_bookings(allocation, request)`` applies it to every card of an ``Allocation``
record (the ``egpu.io/allocation`` pod annotation). Both are pure. Used by the
scheduler (placement, and rebuilding its bookings from the API) and by anything that reports
per-card bookings (node agent metrics, CLI).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from egpu.records import Allocation
from egpu.requests import ContainerKind, PodRequest


@dataclass(frozen=True, slots=True)
class CardBooking:
    """What is booked on one card: memory_mib (MiB), cores (% of the card), slots (count)."""

    memory_mib: int = 0
    cores: int = 0
    slots: int = 0

    def __add__(self, other: CardBooking) -> CardBooking:
        return CardBooking(self.memory_mib + other.memory_mib, self.cores + other.cores,
                           self.slots + other.slots)

    def __sub__(self, other: CardBooking) -> CardBooking:
        return CardBooking(self.memory_mib - other.memory_mib, self.cores - other.cores,
                           self.slots - other.slots)


def book_card(entries: Iterable[tuple[ContainerKind, int, int]]) -> CardBooking:
    """The booking of one pod on one card.

    ``entries``: ``(kind, memory_mib, cores)`` of each of the pod's containers that has a share
    of this card, in pod spec order (init containers and sidecars in their declared order come
    before app containers, as ``read_pod`` lists them). See the module docstring for the rule.
    """
    steady_mib = steady_cores = steady_slots = 0
    side_mib = side_cores = side_slots = 0
    peak_mib = peak_cores = peak_slots = 0
    for kind, mib, cores in entries:
        if kind is ContainerKind.INIT:
            peak_mib = max(peak_mib, side_mib + mib)
            peak_cores = max(peak_cores, side_cores + cores)
            peak_slots = max(peak_slots, side_slots + 1)
            continue
        steady_mib += mib
        steady_cores += cores
        steady_slots += 1
        if kind is ContainerKind.SIDECAR:
            side_mib += mib
            side_cores += cores
            side_slots += 1
    return CardBooking(max(steady_mib, peak_mib), max(steady_cores, peak_cores),
                       max(steady_slots, peak_slots))


def allocation_bookings(
    allocation: Allocation, request: PodRequest | None = None
) -> dict[str, CardBooking]:
    """Card UUID -> what the pod of ``allocation`` books on that card.

    ``request`` (``read_pod(pod).request`` of the same pod) tells sidecars from init containers
    and gives the spec order. Without it (pod spec unreadable), or for containers the request
    does not know, a container counts as an app container: its shares are summed, which never
    books less than the rule (the allocation's ``init`` flag alone cannot tell a sidecar, which
    is summed, from a plain init container, which is not).
    """
    order: dict[str, tuple[int, ContainerKind]] = {}
    if request is not None:
        order = {c.name: (i, c.kind) for i, c in enumerate(request.containers)}
    rows: list[tuple[int, int, ContainerKind, str, int, int]] = []
    for position, container in enumerate(allocation.containers):
        rank, kind = order.get(container.name, (len(order) + position, ContainerKind.APP))
        for card in container.cards:
            rows.append((rank, position, kind, card.uuid, card.memory_mib, card.cores))
    rows.sort(key=lambda r: (r[0], r[1]))
    per_card: dict[str, list[tuple[ContainerKind, int, int]]] = {}
    for _, _, kind, uuid, mib, cores in rows:
        per_card.setdefault(uuid, []).append((kind, mib, cores))
    return {uuid: book_card(entries) for uuid, entries in per_card.items()}


def record_bookings(allocation: Allocation) -> dict[str, CardBooking]:
    """Card UUID -> what the pod books there, from a record that carries its containers' kinds
    (``Allocation.complete``): ``book_card`` over the containers in the record's
    order, the pod's spec order (init containers and sidecars first), as the scheduler writes
    them. Same result as ``allocation_bookings(allocation, read_pod(pod).request)``."""
    per_card: dict[str, list[tuple[ContainerKind, int, int]]] = {}
    for container in allocation.containers:
        kind = ContainerKind(container.kind or ContainerKind.APP)
        for share in container.cards:
            per_card.setdefault(share.uuid, []).append((kind, share.memory_mib, share.cores))
    return {uuid: book_card(entries) for uuid, entries in per_card.items()}
