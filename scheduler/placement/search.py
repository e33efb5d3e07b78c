"""The search: fit all of a pod's shares on one node's cards, and the record it yields.

A container asking for ``gpus`` cards gets that many distinct cards; containers of one pod may
share a card (their shares add up on it under the effective-request rule of
``egpu.booking.book_card``: max(sum of app + sidecar shares, each init share + the sidecars
before it)). Whether a card takes a share is the fit rule's (``rule.refused``).

Order: app and sidecar containers first (most cards first), then init containers preferring
cards the pod already uses; for each container the cards that fit are ordered by the card
strategy (``scheduler.strategies``: binpack fullest first, spread emptiest first) and
combinations are tried depth first with backtracking, at most ``SEARCH_BUDGET`` combinations
per node. A pod with init containers is first searched with its inits kept on its steady
containers' cards (``search_cards``).

``Unfit.unresolvable`` is true when the pod would not fit even on the node emptied of other
pods' bookings (wrong model, share larger than the card, stale node): preempting cannot help.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from egpu.booking import CardBooking, book_card
from egpu.records import Allocation, CardShare, ContainerAllocation
from egpu.requests import ContainerKind
from scheduler import strategies
from scheduler.placement.kubelet import reuse_conflict
from scheduler.placement.model import (
    CardState,
    ContainerDemand,
    Limits,
    NodeState,
    Placement,
    PodDemand,
    Unfit,
)
from scheduler.placement.rule import (
    Bounds,
    card_filter,
    filter_reason,
    reason,
    refused,
    short_of_cards,
    stale_reason,
)

SEARCH_BUDGET = 2000  # combinations tried per node before giving up
INIT_REUSE_BUDGET = 200  # of those, first spent looking for inits on the pod's own cards

# a card that takes the container: its strategy sort key, its position, the pod's new booking
_Fit = tuple[tuple[float, ...], int, CardBooking]


class _Search:
    """Depth-first search of one pod's containers over one node's allowed cards."""

    def __init__(self, cards: Sequence[CardState], demand: PodDemand, limits: Limits, *,
                 inits_on_own_cards: bool = False, budget: int = SEARCH_BUDGET) -> None:
        self.inits_on_own_cards = inits_on_own_cards
        self.budget = budget
        self.cards = cards
        self.demand = demand
        self.bounds = bounds = Bounds.of(demand, limits)
        self.mem_caps = [bounds.memory(c.capacity_mib) for c in cards]
        self.card_strategy = strategies.get(demand.gpu_policy)
        self.entries: list[list[tuple[int, ContainerKind, int, int]]] = [[] for _ in cards]
        self.use: list[CardBooking] = [CardBooking() for _ in cards]
        self.chosen: dict[str, list[tuple[int, int]]] = {}  # container -> [(card pos, MiB)]
        self.tries = 0
        self.failure = ""
        self.failure_depth = -1

    def _try(self, pos: int, c: ContainerDemand) -> tuple[CardBooking | None, str]:
        """The pod's new booking on card ``pos`` with ``c`` added, or None and why not."""
        card = self.cards[pos]
        mib = c.share.memory_on(card.capacity_mib)
        before = self.entries[pos]
        if before:  # the pod's other containers on this card, in spec order
            entries = sorted((*before, (c.order, c.kind, mib, c.share.cores)))
            new = book_card((k, m, cr) for _, k, m, cr in entries)
        else:
            new = book_card(((c.kind, mib, c.share.cores),))
        held, cap = self.use[pos], self.mem_caps[pos]
        bound = refused(card, self.bounds, cap, held, new)
        if bound:
            return None, reason(bound, card, self.bounds, cap, held, new, mib, c.share.cores)
        return new, ""

    def _takes_all(self, pos: int, group: list[ContainerDemand]) -> bool:
        """Whether card ``pos`` also has room for all of ``group`` (summed) on top."""
        card = self.cards[pos]
        use = self.use[pos]
        bounds = self.bounds
        mib = sum(x.share.memory_on(card.capacity_mib) for x in group)
        cores = sum(x.share.cores for x in group)
        return (card.booked_mib + use.memory_mib + mib <= self.mem_caps[pos]
                and (not cores or card.booked_cores + use.cores + cores <= bounds.cores)
                and card.used_slots + use.slots + len(group) <= bounds.slots)

    def _fail(self, depth: int, text: str) -> None:
        if depth > self.failure_depth:
            self.failure_depth, self.failure = depth, text

    def _fits(self, depth: int, c: ContainerDemand) -> tuple[list[_Fit], list[str]]:
        """The cards that take ``c`` now, with their sort keys, and why each other one not."""
        containers = self.demand.containers
        together = [x for x in containers[depth:] if x.kind is not ContainerKind.INIT
                    and x.share.gpus == 1] if self.card_strategy.keep_together else []
        fits: list[_Fit] = []
        reasons: list[str] = []
        for pos, card in enumerate(self.cards):
            if (self.inits_on_own_cards and c.kind is ContainerKind.INIT
                    and not self.use[pos].slots):
                continue
            new, why = self._try(pos, c)
            if new is None:
                reasons.append(why)
                continue
            fullness = (card.booked_mib + self.use[pos].memory_mib) / card.capacity_mib
            key: tuple[float, ...] = self.card_strategy.card_key(fullness, card.index)
            if c.kind is ContainerKind.INIT:  # reuse the pod's own cards first
                key = (0 if self.use[pos].slots else 1, *key)
            elif together:  # binpack: a card that takes all of them first, then the pod's own
                key = (0 if self._takes_all(pos, together) else 1,
                       0 if self.use[pos].slots else 1, *key)
            fits.append((key, pos, new))
        return fits, reasons

    def _kubelet_agrees(self) -> bool:
        """Whether the kubelet, reusing init containers' slots, gives every container the
        cards chosen (scheduler.placement.kubelet.reuse_conflict); the reason is kept."""
        ordered = sorted(self.demand.containers, key=lambda c: c.order)
        why = reuse_conflict([(c.kind is ContainerKind.INIT,
                               frozenset(pos for pos, _ in self.chosen[c.name]))
                              for c in ordered], [c.name for c in ordered])
        if why is None:
            return True
        self._fail(len(ordered), f"no placement that the kubelet would hand out as chosen: "
                                 f"{why}")
        return False

    def run(self, depth: int = 0) -> bool:
        """Place containers[depth:]; True when all are placed (results in ``chosen``)."""
        containers = self.demand.containers
        if depth == len(containers):
            return self._kubelet_agrees()
        c = containers[depth]
        fits, reasons = self._fits(depth, c)
        if len(fits) < c.share.gpus:
            self._fail(depth, short_of_cards(c, len(fits), reasons, len(reasons),
                                             beside=depth > 0))
            return False
        fits.sort(key=lambda f: f[0])
        for combo in combinations(fits, c.share.gpus):
            self.tries += 1
            if self.tries > self.budget:
                self._fail(len(containers), f"no placement found within {self.budget} tries")
                return False
            saved = [(pos, self.use[pos]) for _, pos, _ in combo]
            picks = []
            for _, pos, new in combo:
                card = self.cards[pos]
                mib = c.share.memory_on(card.capacity_mib)
                self.entries[pos].append((c.order, c.kind, mib, c.share.cores))
                self.use[pos] = new
                picks.append((pos, mib))
            self.chosen[c.name] = picks
            if self.run(depth + 1):
                return True
            for pos, old in saved:
                self.entries[pos].pop()
                self.use[pos] = old
            del self.chosen[c.name]
        return False


def search_cards(cards: Sequence[CardState], demand: PodDemand, limits: Limits) -> _Search:
    """The pod's placement on these cards. A pod with init containers and steady ones is
    first placed with its inits on cards its steady containers use (an init there costs only
    what it asks beyond them: FC-07's max rule), searching the steady containers' cards for
    such a placement; only when there is none (within INIT_REUSE_BUDGET tries) may an init
    take a card of its own, which books it a second card for the pod's whole life."""
    kinds = {c.kind is ContainerKind.INIT for c in demand.containers}
    if kinds == {True, False}:
        first = _Search(cards, demand, limits, inits_on_own_cards=True, budget=INIT_REUSE_BUDGET)
        if first.run():
            return first
    found = _Search(cards, demand, limits)
    found.run()
    return found


def fit(node: NodeState, demand: PodDemand, limits: Limits, now: float) -> Placement | Unfit:
    """Fit ``demand`` on ``node`` at time ``now`` (unix seconds). Never raises for bad data."""
    stale = stale_reason(node, now, limits)
    if stale:
        return Unfit(node.name, stale, unresolvable=True)
    allowed = list(filter(card_filter(demand), node.cards))
    if not allowed:
        return Unfit(node.name, filter_reason(node, demand), unresolvable=True)
    found = search_cards(allowed, demand, limits)
    if len(found.chosen) != len(demand.containers):
        emptied = [c.emptied() for c in allowed]
        unresolvable = len(search_cards(emptied, demand, limits).chosen) != len(demand.containers)
        return Unfit(node.name, found.failure, unresolvable)

    containers = []
    for c in sorted(demand.containers, key=lambda c: c.order):
        shares = tuple(CardShare(allowed[pos].uuid, allowed[pos].index, mib, c.share.cores)
                       for pos, mib in found.chosen[c.name])
        containers.append(ContainerAllocation(c.name, c.kind is not ContainerKind.APP, shares))
    bookings = {allowed[pos].uuid: use for pos, use in enumerate(found.use) if use.slots}
    booked = node.booked_mib + sum(b.memory_mib for b in bookings.values())
    return Placement(node.name, Allocation(tuple(containers), node=node.name), bookings,
                     booked / node.capacity_mib if node.capacity_mib else 1.0)
