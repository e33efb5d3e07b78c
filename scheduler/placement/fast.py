"""The fast path: filter's and prioritize's answer for many nodes, and a node's score.

``check``/``checker``/``utilization_checker`` give ``fit``'s answer (tested as a property)
without building the record. The usual pod, with one share, takes one pass over a node's cards
and stops as soon as enough cards fit; on a node it does not fit, a second pass asks the fit
rule (``rule.refused``/``rule.reason``) card by card and writes the same reason as ``fit`` (no
search, no second search on the emptied node). Pods with several shares, and stale nodes or
nodes without usable cards, go through ``fit``. Hot loop of filter/prioritize (1000s of nodes
per call): keep it lean.
"""

from __future__ import annotations

from collections.abc import Callable

from egpu.booking import CardBooking, book_card
from egpu.policies import PlacementPolicy
from scheduler import strategies
from scheduler.placement.model import (
    CardState,
    Fits,
    Limits,
    NodeState,
    Placement,
    PodDemand,
    Unfit,
)
from scheduler.placement.rule import (
    MAX_CARDS_IN_REASON,
    NOTHING,
    Bounds,
    card_filter,
    filter_reason,
    fresh_heartbeats,
    is_stale,
    reason,
    refused,
    short_of_cards,
)
from scheduler.placement.search import fit


def check(node: NodeState, demand: PodDemand, limits: Limits, now: float) -> Fits | Unfit:
    """Whether ``demand`` fits ``node`` (filter and prioritize), without building the record.

    Same answer as ``fit`` (tested as a property); see ``checker``.
    """
    return checker(demand, limits, now)(node)


def checker(demand: PodDemand, limits: Limits, now: float) -> Callable[[NodeState], Fits | Unfit]:
    """``check`` for one pod over many nodes: the pod's side is prepared once."""
    run = utilization_checker(demand, limits, now)

    def wrapped(node: NodeState) -> Fits | Unfit:
        result = run(node)
        return result if isinstance(result, Unfit) else Fits(node.name, result)

    return wrapped


def utilization_checker(demand: PodDemand, limits: Limits,
                        now: float) -> Callable[[NodeState], float | Unfit]:
    """``checker`` without the ``Fits`` wrapper: the node's utilization with the pod placed
    (a float, as ``Placement.utilization``) when the pod fits, else the ``Unfit`` of ``fit``
    (see the module docstring)."""
    def slow(node: NodeState) -> float | Unfit:
        result = fit(node, demand, limits, now)
        return result.utilization if isinstance(result, Placement) else result

    if len(demand.containers) != 1:
        return slow
    container = demand.containers[0]
    share = container.share
    fixed, percentage, cores, need = (share.memory_mib, share.memory_percentage or 100,
                                      share.cores, share.gpus)
    bounds = Bounds.of(demand, limits)
    ratio = bounds.memory_ratio
    plain = ratio == 1.0
    cores_cap, slots_cap = bounds.cores, bounds.slots
    oldest, newest = fresh_heartbeats(now, limits)  # the staleness rule's clock, once
    allowed = card_filter(demand)
    card_key = strategies.get(demand.gpu_policy).card_key
    added_fixed = (fixed or 0) * need
    by_capacity: dict[int, tuple[int, int, CardBooking, bool]] = {}

    def booking_on(card: CardState) -> tuple[int, int, CardBooking, bool]:
        """On a card the pod has not used yet: the MiB bookable there, the MiB the share asks,
        the pod's booking there, and whether the card would take it emptied of other pods'
        bookings (kept by capacity in ``by_capacity``)."""
        cap = bounds.memory(card.capacity_mib)
        mib = share.memory_on(card.capacity_mib)
        new = book_card(((container.kind, mib, cores),))
        alone = not refused(card.emptied(), bounds, cap, NOTHING, new)
        entry = by_capacity[card.capacity_mib] = (cap, mib, new, alone)
        return entry

    def unfit(node: NodeState) -> float | Unfit:
        """The pod does not fit (or the fast loop could not tell): ``fit``'s answer, in one
        pass (``search._Search._try`` for one container on cards the pod has not used yet)."""
        reasons: list[str] = []  # only the first MAX_CARDS_IN_REASON are written
        refusals = 0
        fits: list[tuple[CardState, int]] = []
        emptied = 0  # cards that would take the share on the emptied node
        for card in node.cards:
            if not allowed(card):
                continue
            cap, mib, new, alone = by_capacity.get(card.capacity_mib) or booking_on(card)
            emptied += alone
            bound = refused(card, bounds, cap, NOTHING, new)
            if not bound:
                fits.append((card, mib))
                continue
            refusals += 1
            if refusals <= MAX_CARDS_IN_REASON:
                reasons.append(reason(bound, card, bounds, cap, NOTHING, new, mib, cores))
        if not fits and not refusals:  # no card allowed
            return Unfit(node.name, filter_reason(node, demand), unresolvable=True)
        if len(fits) >= need:  # not reached from the fast loop; kept for exactness
            fits.sort(key=lambda f: card_key(f[0].fullness, f[0].index))
            added = sum(mib for _, mib in fits[:need])
            return (node.booked_mib + added) / node.capacity_mib
        return Unfit(node.name, short_of_cards(container, len(fits), reasons, refusals),
                     unresolvable=emptied < need)

    # The loops below are the fit rule (``rule.refused`` with nothing held, ``Bounds.memory``)
    # inlined: they run for every card of every node. The node's staleness is the rule's own
    # ``rule.is_stale``, asked once per node. A node they do not fit goes to ``unfit`` (or
    # ``slow``), which asks the rule itself and words why; the property test check == fit
    # holds the two to one answer.
    def run(node: NodeState) -> float | Unfit:
        if is_stale(node, oldest, newest):
            return slow(node)
        if fixed is not None:  # the amount does not vary by card: stop at the need-th card
            found = 0
            for card in node.cards:
                if (card.used_slots < slots_cap
                        and card.booked_mib + fixed <= (card.capacity_mib if plain
                                                        else int(card.capacity_mib * ratio))
                        and (not cores or card.booked_cores + cores <= cores_cap)
                        and allowed(card)):
                    found += 1
                    if found == need:
                        return (node.booked_mib + added_fixed) / node.capacity_mib
            return unfit(node)
        ok: list[tuple[CardState, int]] = []
        for card in node.cards:
            if card.used_slots >= slots_cap or not allowed(card):
                continue
            capacity = card.capacity_mib
            mib = max(1, capacity * percentage // 100)
            if (card.booked_mib + mib > (capacity if plain else int(capacity * ratio))
                    or (cores and card.booked_cores + cores > cores_cap)):
                continue
            ok.append((card, mib))
        if len(ok) < need:
            return unfit(node)
        ok.sort(key=lambda o: card_key(o[0].fullness, o[0].index))
        return (node.booked_mib + sum(mib for _, mib in ok[:need])) / node.capacity_mib

    return run


def score(placement: Placement | Fits, node_policy: PlacementPolicy) -> int:
    """Node score 0..10 of a placement under the node strategy ``node_policy``."""
    return strategies.get(node_policy).node_score(placement.utilization)
