"""How many cards a set of pods needs: every pod placed again on emptied nodes with the
placement's own ``fit`` and ``score`` (pure; ``kubectl egpu advise`` compares the shares as
booked with the shares it recommends, the same way both times).

The pods go largest first (MiB over all their cards), each to the node ``score`` ranks
highest under the pod's node policy, as the scheduler's Score would pick; a pod that fits
no node is counted, not dropped silently. Units: MiB, %.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from egpu.booking import CardBooking
from scheduler.placement.fast import score
from scheduler.placement.model import Limits, NodeState, Placement, PodDemand
from scheduler.placement.search import fit


@dataclass(frozen=True)
class Repacked:
    """``cards``: cards that hold at least one share; ``unplaced``: pods that fit nowhere."""

    cards: int
    unplaced: int


def emptied(node: NodeState, now: float) -> NodeState:
    """The node without bookings, its heartbeat ``now`` (a repack asks "would it fit", not
    "is the agent alive")."""
    return NodeState(node.name, tuple(c.emptied() for c in node.cards), now, node.problem)


def _demand_mib(demand: PodDemand) -> int:
    return sum((c.share.memory_mib or 0) * c.share.gpus for c in demand.containers)


def _booked(node: NodeState, placement: Placement) -> NodeState:
    cards = []
    for card in node.cards:
        add = placement.bookings.get(card.uuid, CardBooking())
        cards.append(replace(card, booked_mib=card.booked_mib + add.memory_mib,
                             booked_cores=card.booked_cores + add.cores,
                             used_slots=card.used_slots + add.slots))
    return NodeState(node.name, tuple(cards), node.heartbeat, node.problem)


def repack(nodes: Sequence[NodeState], pods: Sequence[PodDemand], limits: Limits,
           now: float) -> Repacked:
    """Place ``pods`` on ``nodes`` emptied of every booking (module docstring)."""
    state = {n.name: emptied(n, now) for n in nodes if not n.problem}
    unplaced = 0
    for demand in sorted(pods, key=_demand_mib, reverse=True):
        best: Placement | None = None
        for node in state.values():
            found = fit(node, demand, limits, now)
            if isinstance(found, Placement) and (
                    best is None or score(found, demand.node_policy) > score(
                        best, demand.node_policy)):
                best = found
        if best is None:
            unplaced += 1
            continue
        state[best.node] = _booked(state[best.node], best)
    cards = sum(1 for n in state.values() for c in n.cards if c.used_slots)
    return Repacked(cards, unplaced)
