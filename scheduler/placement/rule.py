"""The fit rule: which cards a pod may use, whether a card takes a share, and why not.

The only place that decides and words a card's refusal; the search (``search``) and the fast
path (``fast``) both ask it. Units: MiB, % of one card's compute, share slots.

A card is *allowed* when it is healthy and passes the pod's model filters
(``use/nouse-gpu-type``, token rule of ``egpu.requests.model_matches``) and UUID filters
(``use/nouse-gpu-uuid``); a node is usable when its inventory was read and its heartbeat is
at most ``heartbeat_timeout_s`` old and at most ``HEARTBEAT_FUTURE_SKEW_S`` ahead of the
scheduler's clock (``is_stale``, worded by ``stale_reason``).

An allowed card takes the pod's booking ``new`` (the pod's whole booking on the card with the
share added, ``egpu.booking.book_card``) on top of ``held`` (the pod's booking there before)
unless a bound refuses (``refused``):

- memory: ``booked_mib + new.memory_mib <= Bounds.memory(capacity_mib)`` (capacity x
  ``memory_ratio``, floored, only for pods with ``egpu.io/memory-oversubscription: "true"``);
- cores: ``booked_cores + new.cores <= floor(100 x cores_ratio)``;
- slots: ``used_slots + new.slots <= shares_per_card``;

where ``booked_*``/``used_slots`` are the other pods' bookings on the card. A bound is only
checked when the pod adds to it (``new > held`` there), so a card already past a bound (config
changed) still takes shares that add nothing there. ``reason`` words a refusal;
``short_of_cards`` words a container that found too few cards.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from egpu.booking import CardBooking
from egpu.requests import model_matches
from scheduler.placement.model import CardState, ContainerDemand, Limits, NodeState, PodDemand

MAX_CARDS_IN_REASON = 4  # refused cards written out in one reason; the rest are counted
NOTHING: Final = CardBooking()  # the pod holds nothing on a card yet

# the bound that refuses a card (``refused``); "" when none does
MEMORY: Final = "memory"
CORES: Final = "cores"
SLOTS: Final = "slots"


class Bounds(NamedTuple):
    """What one card may hold for one pod: ``memory`` (of its capacity), ``cores``, ``slots``.

    ``memory_ratio`` is 1.0 unless the pod asked memory oversubscription (then the config's).
    (A named tuple: built for every ``fit``, cheaply.)
    """

    memory_ratio: float
    cores: int
    slots: int

    @classmethod
    def of(cls, demand: PodDemand, limits: Limits) -> Bounds:
        """The bounds ``limits`` set for ``demand`` (its oversubscription opt-in)."""
        return cls(limits.memory_ratio if demand.oversubscribe else 1.0,
                   int(100 * limits.cores_ratio), limits.shares_per_card)

    def memory(self, capacity_mib: int) -> int:
        """MiB bookable on a card of ``capacity_mib`` MiB."""
        ratio = self.memory_ratio
        return capacity_mib if ratio == 1.0 else int(capacity_mib * ratio)


def refused(card: CardState, bounds: Bounds, cap: int, held: CardBooking,
            new: CardBooking) -> str:
    """The bound that refuses the pod's booking on ``card`` growing from ``held`` to ``new``:
    ``MEMORY``, ``CORES`` or ``SLOTS``; "" when the card takes it (the module's rule).

    ``cap``: ``bounds.memory(card.capacity_mib)``, which callers keep per card."""
    if new.memory_mib > held.memory_mib and card.booked_mib + new.memory_mib > cap:
        return MEMORY
    if new.cores > held.cores and card.booked_cores + new.cores > bounds.cores:
        return CORES
    if new.slots > held.slots and card.used_slots + new.slots > bounds.slots:
        return SLOTS
    return ""


def reason(bound: str, card: CardState, bounds: Bounds, cap: int, held: CardBooking,
           new: CardBooking, mib: int, cores: int) -> str:
    """Why ``card`` refuses (``bound``, from ``refused``) a share asking ``mib`` MiB and
    ``cores`` % there: ``card 0 (NVIDIA A10, 23028 MiB): 3028 MiB free, 4000 MiB asked``."""
    if bound == MEMORY:
        if new.memory_mib > cap:
            return f"{card.label()}: {mib} MiB asked > {cap} MiB bookable"
        free = max(0, cap - card.booked_mib - held.memory_mib)
        return f"{card.label()}: {free} MiB free, {mib} MiB asked"
    if bound == CORES:
        free = max(0, bounds.cores - card.booked_cores - held.cores)
        return f"{card.label()}: {free}% cores free, {cores}% asked"
    return f"{card.label()}: all {bounds.slots} share slots taken"


def short_of_cards(container: ContainerDemand, fitted: int, reasons: Sequence[str],
                   refusals: int, *, beside: bool = False) -> str:
    """Why ``container`` found fewer cards than it asks: ``fitted`` cards took it, ``refusals``
    refused it (the first ``reasons`` are written out, at most MAX_CARDS_IN_REASON);
    ``beside``: it was placed after other containers of the pod."""
    shown = "; ".join(reasons[:MAX_CARDS_IN_REASON])
    more = refusals - MAX_CARDS_IN_REASON
    shown += f"; and {more} more cards" if more > 0 else ""
    gpus = container.share.gpus
    need = f"{gpus} distinct cards" if gpus > 1 else "a card"
    where = " beside the pod's other containers" if beside else ""
    return (f"container {container.name!r} asks {container.share.describe()}: "
            f"needs {need}{where}, {fitted} fit ({shown})")


@functools.lru_cache(maxsize=4096)
def _model_ok(model: str, use: tuple[str, ...], nouse: tuple[str, ...]) -> bool:
    if use and not model_matches(model, use):
        return False
    return not (nouse and model_matches(model, nouse))


def card_filter(demand: PodDemand) -> Callable[[CardState], bool]:
    """The pod's card filter: True for a healthy card that passes its model and UUID filters
    (prepared once per pod; called for every card of every node)."""
    use_uuids, nouse_uuids = demand.use_uuids, demand.nouse_uuids
    by_uuid = bool(use_uuids or nouse_uuids)
    use_types, nouse_types = demand.use_types, demand.nouse_types
    typed = bool(use_types or nouse_types)
    model_ok: dict[str, bool] = {}

    def allowed(card: CardState) -> bool:
        if not card.healthy:
            return False
        if by_uuid and ((use_uuids and card.uuid not in use_uuids)
                        or card.uuid in nouse_uuids):
            return False
        if typed:
            ok = model_ok.get(card.model)
            if ok is None:
                ok = model_ok[card.model] = _model_ok(card.model, use_types, nouse_types)
            return ok
        return True

    return allowed


def card_allowed(card: CardState, demand: PodDemand) -> bool:
    """True when the card is healthy and passes the pod's model and UUID filters."""
    return card_filter(demand)(card)


# How far (s) a node's heartbeat may be ahead of the scheduler's clock and still count as
# fresh: ordinary clock skew between NTP-synced hosts. A heartbeat further ahead is stale, or
# a node whose clock runs ahead would stay fresh for that long after its node agent died.
HEARTBEAT_FUTURE_SKEW_S: Final = 60.0


def fresh_heartbeats(now: float, limits: Limits) -> tuple[float, float]:
    """The heartbeats (unix seconds) fresh at ``now``, oldest and newest, both included: at most
    ``limits.heartbeat_timeout_s`` old and at most ``HEARTBEAT_FUTURE_SKEW_S`` ahead of ``now``.
    (Computed once per clock reading, for ``is_stale`` on many nodes.)"""
    return now - limits.heartbeat_timeout_s, now + HEARTBEAT_FUTURE_SKEW_S


def is_stale(node: NodeState, oldest: float, newest: float) -> bool:
    """Whether the node's inventory cannot be trusted: it has a problem, it has no heartbeat, or
    the heartbeat is outside ``oldest``..``newest`` (``fresh_heartbeats``). The staleness rule,
    written only here: ``stale_reason`` words it, the fast path asks it once per node (a bool,
    no message: it is cheap)."""
    heartbeat = node.heartbeat
    if node.problem or heartbeat is None:
        return True
    return not oldest <= heartbeat <= newest


def stale_reason(node: NodeState, now: float, limits: Limits) -> str:
    """Why the node's inventory cannot be trusted now ("" when it can; the rule is
    ``is_stale``)."""
    oldest, newest = fresh_heartbeats(now, limits)
    if not is_stale(node, oldest, newest):
        return ""
    if node.problem:
        return node.problem
    heartbeat = node.heartbeat
    if heartbeat is None:
        return "no inventory heartbeat (annotation egpu.io/inventory-heartbeat missing)"
    age = now - heartbeat
    if heartbeat > newest:
        return (f"inventory heartbeat is {-age:.0f} s in the future (more than "
                f"{HEARTBEAT_FUTURE_SKEW_S:.0f} s ahead of the scheduler's clock): the node's "
                "clock is wrong, so whether its node agent is reporting cannot be told")
    return (f"inventory heartbeat is {age:.0f} s old (limit "
            f"{limits.heartbeat_timeout_s:.0f} s): the node agent is not reporting")


def _models(cards: Sequence[CardState]) -> str:
    counts = Counter(c.model for c in cards)
    return ", ".join(f"{n} x {model}" for model, n in sorted(counts.items()))


def filter_reason(node: NodeState, demand: PodDemand) -> str:
    """Why no card of ``node`` is allowed for ``demand`` (none in the inventory, none healthy,
    or none passes the pod's filters)."""
    healthy = [c for c in node.cards if c.healthy]
    if not node.cards:
        return "the node has no GPU cards in its inventory"
    if not healthy:
        return f"no healthy card ({len(node.cards)} unhealthy)"
    parts = []
    if demand.use_types:
        parts.append(f"use-gpu-type {','.join(demand.use_types)}")
    if demand.nouse_types:
        parts.append(f"nouse-gpu-type {','.join(demand.nouse_types)}")
    if demand.use_uuids:
        parts.append("use-gpu-uuid")
    if demand.nouse_uuids:
        parts.append("nouse-gpu-uuid")
    return f"no card passes {' and '.join(parts) or 'the filters'} (cards: {_models(healthy)})"
