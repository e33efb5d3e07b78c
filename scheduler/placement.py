"""The placement core: fit a pod's shares onto one node, card by card (pure; no I/O).

Plain data in, a decision out. ``fit(node, demand, limits, now)`` returns a ``Placement`` (which
container gets which cards, with the ``egpu.io/allocation`` record and what the pod books per
card) or an ``Unfit`` with a reason a user can act on. ``score(placement)`` ranks a node 0..10.

A card takes a share when all of these hold (units: MiB, % of one card's compute, slots):

- the node's inventory is readable and its heartbeat is at most ``heartbeat_timeout_s`` old;
- the card is healthy, passes the pod's model filters (``use/nouse-gpu-type``, token rule of
  ``egpu.requests.model_matches``) and UUID filters (``use/nouse-gpu-uuid``);
- memory: ``booked_mib + pod_mib <= capacity_mib`` (x ``memory_ratio``, floored, only for pods
  with ``egpu.io/memory-oversubscription: "true"``); a share given in % books
  ``Share.memory_on(capacity_mib)``;
- cores: ``booked_cores + pod_cores <= floor(100 x cores_ratio)``;
- slots: ``used_slots + pod_slots <= shares_per_card``;

where ``booked_*``/``used_slots`` are the other pods' bookings on the card and ``pod_*`` is what
this pod books on it under the effective-request rule of ``egpu.booking.book_card``
(max(sum of app + sidecar shares, each init share + the sidecars before it)). A bound is only
checked when the pod adds to it, so a card already past a bound (config changed) still takes
shares that add nothing there.

A container asking for ``gpus`` cards gets that many distinct cards; containers of one pod may
share a card (their shares add up on it). Search: app and sidecar containers first (most cards
first), then init containers preferring cards the pod already uses; for each container the
cards that fit are ordered by the card strategy (``scheduler.strategies``) and combinations are
tried depth first with backtracking, at most ``SEARCH_BUDGET`` combinations per node. A pod
with init containers is first searched with its inits kept on its steady containers' cards
(``_search``).

``Unfit.unresolvable`` is true when the pod would not fit even on the node emptied of other
pods' bookings (wrong model, share larger than the card, stale node): preempting cannot help.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

from egpu.booking import CardBooking, book_card
from egpu.config import Config
from egpu.records import Allocation, CardShare, ContainerAllocation
from egpu.requests import ContainerKind, PodRequest, Share, model_matches
from scheduler import strategies

SEARCH_BUDGET = 2000  # combinations tried per node before giving up
INIT_REUSE_BUDGET = 200  # of those, first spent looking for inits on the pod's own cards
_MAX_CARDS_IN_REASON = 4


@dataclass(frozen=True, slots=True)
class CardState:
    """One card as the placement sees it: identity, capacity (MiB), and others' bookings."""

    uuid: str
    index: int
    model: str
    capacity_mib: int
    healthy: bool = True
    booked_mib: int = 0
    booked_cores: int = 0  # % of the card's compute
    used_slots: int = 0

    @property
    def fullness(self) -> float:
        """Booked MiB / capacity MiB (may exceed 1 under memory oversubscription)."""
        return self.booked_mib / self.capacity_mib

    def label(self) -> str:
        """``card 3 (NVIDIA A10, 23028 MiB)``."""
        return f"card {self.index} ({self.model}, {self.capacity_mib} MiB)"


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node: its cards, its heartbeat (unix seconds; None: never) and any inventory problem.

    ``problem`` is "" when the inventory annotation was read, else why the node takes no shares.
    ``capacity_mib`` and ``booked_mib``: totals over the healthy cards (derived, not passed).
    """

    name: str
    cards: tuple[CardState, ...] = ()
    heartbeat: float | None = None
    problem: str = ""
    capacity_mib: int = field(default=0, init=False)
    booked_mib: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        healthy = [c for c in self.cards if c.healthy]
        object.__setattr__(self, "capacity_mib", sum(c.capacity_mib for c in healthy))
        object.__setattr__(self, "booked_mib", sum(c.booked_mib for c in healthy))

    @property
    def utilization(self) -> float:
        """Booked / capacity MiB over the healthy cards (1.0 when there are none)."""
        return self.booked_mib / self.capacity_mib if self.capacity_mib else 1.0


@dataclass(frozen=True, slots=True)
class Limits:
    """Cluster-wide bounds from the config (see ``egpu.config`` for the keys)."""

    shares_per_card: int = 10
    memory_ratio: float = 1.5
    cores_ratio: float = 1.0
    heartbeat_timeout_s: float = 120.0

    @classmethod
    def from_config(cls, config: Config) -> Limits:
        """Limits of ``config`` (sharesPerCard, the two ratios, heartbeatTimeoutSeconds)."""
        return cls(config.shares_per_card, config.memory_oversubscription_ratio,
                   config.cores_oversubscription_ratio, float(config.heartbeat_timeout_seconds))


@dataclass(frozen=True, slots=True)
class ContainerDemand:
    """One container with a share; ``order`` is its position in the pod spec (inits first)."""

    name: str
    kind: ContainerKind
    share: Share
    order: int


@dataclass(frozen=True)
class PodDemand:
    """What placement needs of a pod: its shares (in placement order), filters and policies."""

    containers: tuple[ContainerDemand, ...]
    oversubscribe: bool = False
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    gpu_policy: str = "binpack"
    node_policy: str = "binpack"

    @classmethod
    def from_request(cls, request: PodRequest) -> PodDemand:
        """Normalize a ``PodRequest``: app and sidecar containers (most cards first), then inits."""
        rows = [ContainerDemand(c.name, c.kind, c.share, i)
                for i, c in enumerate(request.containers)]
        steady = sorted((r for r in rows if r.kind is not ContainerKind.INIT),
                        key=lambda r: (-r.share.gpus, r.order))
        inits = [r for r in rows if r.kind is ContainerKind.INIT]
        return cls(
            containers=(*steady, *inits),
            oversubscribe=request.memory_oversubscription,
            use_types=request.use_gpu_types,
            nouse_types=request.nouse_gpu_types,
            use_uuids=frozenset(request.use_gpu_uuids),
            nouse_uuids=frozenset(request.nouse_gpu_uuids),
            gpu_policy=request.gpu_policy,
            node_policy=request.node_policy,
        )


@dataclass(frozen=True)
class Placement:
    """A pod fitted on a node.

    allocation: the ``egpu.io/allocation`` record (node set, containers in spec order).
    bookings: card UUID -> what the pod books there (effective-request rule).
    utilization: the node's booked/capacity MiB over its healthy cards with the pod placed.
    """

    node: str
    allocation: Allocation
    bookings: dict[str, CardBooking] = field(default_factory=dict)
    utilization: float = 0.0


@dataclass(frozen=True, slots=True)
class Fits:
    """The pod fits the node (``check``); utilization as in ``Placement``, for scoring."""

    node: str
    utilization: float


@dataclass(frozen=True)
class Unfit:
    """Why a pod does not fit a node; ``unresolvable``: not even on the emptied node."""

    node: str
    reason: str
    unresolvable: bool = False


@functools.lru_cache(maxsize=4096)
def _model_ok(model: str, use: tuple[str, ...], nouse: tuple[str, ...]) -> bool:
    if use and not model_matches(model, use):
        return False
    return not (nouse and model_matches(model, nouse))


def card_allowed(card: CardState, demand: PodDemand) -> bool:
    """True when the card is healthy and passes the pod's model and UUID filters."""
    if not card.healthy:
        return False
    if demand.use_uuids and card.uuid not in demand.use_uuids:
        return False
    if card.uuid in demand.nouse_uuids:
        return False
    return _model_ok(card.model, demand.use_types, demand.nouse_types)


def stale_reason(node: NodeState, now: float, limits: Limits) -> str:
    """Why the node's inventory cannot be trusted now ("" when it can)."""
    if node.problem:
        return node.problem
    if node.heartbeat is None:
        return "no inventory heartbeat (annotation egpu.io/inventory-heartbeat missing)"
    age = now - node.heartbeat
    if age > limits.heartbeat_timeout_s:
        return (f"inventory heartbeat is {age:.0f} s old (limit "
                f"{limits.heartbeat_timeout_s:.0f} s): the node agent is not reporting")
    return ""


def _models(cards: Sequence[CardState]) -> str:
    counts = Counter(c.model for c in cards)
    return ", ".join(f"{n} x {model}" for model, n in sorted(counts.items()))


def _filter_reason(node: NodeState, demand: PodDemand) -> str:
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


def _ask_text(container: ContainerDemand) -> str:
    return f"container {container.name!r} asks {container.share.describe()}"


class _Search:
    """Depth-first search of one pod's containers over one node's allowed cards."""

    def __init__(self, cards: Sequence[CardState], demand: PodDemand, limits: Limits, *,
                 inits_on_own_cards: bool = False, budget: int = SEARCH_BUDGET) -> None:
        self.inits_on_own_cards = inits_on_own_cards
        self.budget = budget
        self.cards = cards
        self.demand = demand
        self.mem_caps = [
            int(c.capacity_mib * limits.memory_ratio) if demand.oversubscribe else c.capacity_mib
            for c in cards
        ]
        self.cores_cap = int(100 * limits.cores_ratio)
        self.slots_cap = limits.shares_per_card
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
        entries = sorted((*self.entries[pos], (c.order, c.kind, mib, c.share.cores)))
        new = book_card((k, m, cr) for _, k, m, cr in entries)
        old = self.use[pos]
        cap = self.mem_caps[pos]
        if new.memory_mib > old.memory_mib and card.booked_mib + new.memory_mib > cap:
            if new.memory_mib > cap:
                return None, f"{card.label()}: {mib} MiB asked > {cap} MiB bookable"
            free = max(0, cap - card.booked_mib - old.memory_mib)
            return None, f"{card.label()}: {free} MiB free, {mib} MiB asked"
        if new.cores > old.cores and card.booked_cores + new.cores > self.cores_cap:
            free = max(0, self.cores_cap - card.booked_cores - old.cores)
            return None, f"{card.label()}: {free}% cores free, {c.share.cores}% asked"
        if new.slots > old.slots and card.used_slots + new.slots > self.slots_cap:
            return None, f"{card.label()}: all {self.slots_cap} share slots taken"
        return new, ""

    def _takes_all(self, pos: int, group: list[ContainerDemand]) -> bool:
        """Whether card ``pos`` also has room for all of ``group`` (summed) on top."""
        card = self.cards[pos]
        use = self.use[pos]
        mib = sum(x.share.memory_on(card.capacity_mib) for x in group)
        cores = sum(x.share.cores for x in group)
        return (card.booked_mib + use.memory_mib + mib <= self.mem_caps[pos]
                and (not cores or card.booked_cores + use.cores + cores <= self.cores_cap)
                and card.used_slots + use.slots + len(group) <= self.slots_cap)

    def _fail(self, depth: int, text: str) -> None:
        if depth > self.failure_depth:
            self.failure_depth, self.failure = depth, text

    def run(self, depth: int = 0) -> bool:
        """Place containers[depth:]; True when all are placed (results in ``chosen``)."""
        containers = self.demand.containers
        if depth == len(containers):
            return True
        c = containers[depth]
        together = [x for x in containers[depth:] if x.kind is not ContainerKind.INIT
                    and x.share.gpus == 1] if self.card_strategy.keep_together else []
        fits: list[tuple[tuple[object, ...], int, CardBooking]] = []
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
            key = self.card_strategy.card_key(fullness, card.index)
            if c.kind is ContainerKind.INIT:  # reuse the pod's own cards first
                key = (0 if self.use[pos].slots else 1, *key)
            elif together:  # binpack: a card that takes all of them first, then the pod's own
                key = (0 if self._takes_all(pos, together) else 1,
                       0 if self.use[pos].slots else 1, *key)
            fits.append((key, pos, new))
        if len(fits) < c.share.gpus:
            shown = "; ".join(reasons[:_MAX_CARDS_IN_REASON])
            more = len(reasons) - _MAX_CARDS_IN_REASON
            shown += f"; and {more} more cards" if more > 0 else ""
            together = " beside the pod's other containers" if depth else ""
            need = f"{c.share.gpus} distinct cards" if c.share.gpus > 1 else "a card"
            self._fail(depth, f"{_ask_text(c)}: needs {need}{together}, {len(fits)} fit "
                              f"({shown})")
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


def _search(cards: Sequence[CardState], demand: PodDemand, limits: Limits) -> _Search:
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
    search = _Search(cards, demand, limits)
    search.run()
    return search


def fit(node: NodeState, demand: PodDemand, limits: Limits, now: float) -> Placement | Unfit:
    """Fit ``demand`` on ``node`` at time ``now`` (unix seconds). Never raises for bad data."""
    stale = stale_reason(node, now, limits)
    if stale:
        return Unfit(node.name, stale, unresolvable=True)
    allowed = [c for c in node.cards if card_allowed(c, demand)]
    if not allowed:
        return Unfit(node.name, _filter_reason(node, demand), unresolvable=True)
    search = _search(allowed, demand, limits)
    if len(search.chosen) != len(demand.containers):
        emptied = [replace(c, booked_mib=0, booked_cores=0, used_slots=0) for c in allowed]
        unresolvable = len(_search(emptied, demand, limits).chosen) != len(demand.containers)
        return Unfit(node.name, search.failure, unresolvable)

    containers = []
    for c in sorted(demand.containers, key=lambda c: c.order):
        shares = tuple(CardShare(allowed[pos].uuid, allowed[pos].index, mib, c.share.cores)
                       for pos, mib in search.chosen[c.name])
        containers.append(ContainerAllocation(c.name, c.kind is not ContainerKind.APP, shares))
    bookings = {allowed[pos].uuid: use for pos, use in enumerate(search.use) if use.slots}
    booked = node.booked_mib + sum(b.memory_mib for b in bookings.values())
    return Placement(node.name, Allocation(tuple(containers), node=node.name), bookings,
                     booked / node.capacity_mib if node.capacity_mib else 1.0)


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
    (a float, as ``Placement.utilization``) when the pod fits, else the ``Unfit`` of ``fit``.

    The usual pod, with one share, takes one pass over the cards and stops as soon as enough
    cards fit; on a node it does not fit, a second pass writes the same reason as ``fit``
    (no search, no second search on the emptied node). Pods with several shares, and stale
    nodes or nodes without usable cards, go through ``fit``. Hot loop of filter/prioritize
    (1000s of nodes per call): keep it lean.
    """
    def slow(node: NodeState) -> float | Unfit:
        result = fit(node, demand, limits, now)
        return result.utilization if isinstance(result, Placement) else result

    if len(demand.containers) != 1:
        return slow
    container = demand.containers[0]
    share = container.share
    fixed, percentage, cores, need = (share.memory_mib, share.memory_percentage or 100,
                                      share.cores, share.gpus)
    ratio = limits.memory_ratio if demand.oversubscribe else 1.0
    plain = ratio == 1.0
    cores_cap, slots_cap = int(100 * limits.cores_ratio), limits.shares_per_card
    timeout = limits.heartbeat_timeout_s
    use_uuids, nouse_uuids = demand.use_uuids, demand.nouse_uuids
    by_uuid = bool(use_uuids or nouse_uuids)
    use_types, nouse_types = demand.use_types, demand.nouse_types
    typed = bool(use_types or nouse_types)
    model_ok: dict[str, bool] = {}
    card_key = strategies.get(demand.gpu_policy).card_key
    added_fixed = (fixed or 0) * need

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

    def unfit(node: NodeState) -> float | Unfit:
        """The pod does not fit (or the fast loop could not tell): ``fit``'s answer, in one
        pass (``_Search._try`` for one container on cards the pod has not used yet)."""
        cards = [card for card in node.cards if allowed(card)]
        if not cards:
            return Unfit(node.name, _filter_reason(node, demand), unresolvable=True)
        reasons: list[str] = []  # only the first _MAX_CARDS_IN_REASON are written
        refused = 0
        fits: list[tuple[CardState, int]] = []
        emptied = 0  # cards that would take the share on the emptied node
        for card in cards:
            capacity = card.capacity_mib
            mib = fixed if fixed is not None else max(1, capacity * percentage // 100)
            cap = capacity if plain else int(capacity * ratio)
            if mib <= cap and (not cores or cores <= cores_cap) and slots_cap >= 1:
                emptied += 1
            if card.booked_mib + mib > cap:
                refused += 1
                if refused > _MAX_CARDS_IN_REASON:
                    continue
                if mib > cap:
                    reasons.append(f"{card.label()}: {mib} MiB asked > {cap} MiB bookable")
                else:
                    free = max(0, cap - card.booked_mib)
                    reasons.append(f"{card.label()}: {free} MiB free, {mib} MiB asked")
            elif cores and card.booked_cores + cores > cores_cap:
                refused += 1
                if refused <= _MAX_CARDS_IN_REASON:
                    free = max(0, cores_cap - card.booked_cores)
                    reasons.append(f"{card.label()}: {free}% cores free, {cores}% asked")
            elif card.used_slots + 1 > slots_cap:
                refused += 1
                if refused <= _MAX_CARDS_IN_REASON:
                    reasons.append(f"{card.label()}: all {slots_cap} share slots taken")
            else:
                fits.append((card, mib))
        if len(fits) >= need:  # not reached from the fast loop; kept for exactness
            fits.sort(key=lambda f: card_key(f[0].fullness, f[0].index))
            added = sum(mib for _, mib in fits[:need])
            return (node.booked_mib + added) / node.capacity_mib
        shown = "; ".join(reasons)
        more = refused - _MAX_CARDS_IN_REASON
        shown += f"; and {more} more cards" if more > 0 else ""
        wanted = f"{need} distinct cards" if need > 1 else "a card"
        return Unfit(node.name, f"{_ask_text(container)}: needs {wanted}, {len(fits)} fit "
                                f"({shown})", unresolvable=emptied < need)

    def run(node: NodeState) -> float | Unfit:
        heartbeat = node.heartbeat
        if node.problem or heartbeat is None or now - heartbeat > timeout:
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


def score(placement: Placement | Fits, node_policy: str) -> int:
    """Node score 0..10 of a placement under the node strategy ``node_policy``."""
    return strategies.get(node_policy).node_score(placement.utilization)
