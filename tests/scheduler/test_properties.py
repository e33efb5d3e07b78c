"""Properties of the placement core and the booking ledger (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egpu.booking import CardBooking, allocation_bookings
from egpu.config import Config
from egpu.records import Card
from egpu.requests import read_pod
from scheduler import strategies
from scheduler.placement import (
    CardState,
    Fits,
    Limits,
    NodeState,
    Placement,
    PodDemand,
    check,
    fit,
)
from scheduler.state import Booking, ClusterState
from tests.scheduler.helpers import NOW, node, pod

CONFIG = Config(shares_per_card=4, memory_oversubscription_ratio=1.5,
                cores_oversubscription_ratio=1.0)
LIMITS = Limits.from_config(CONFIG)

share = st.fixed_dictionaries(
    {"egpu.io/gpu": st.integers(1, 3)},
    optional={"egpu.io/gpu-memory": st.integers(1, 12000),
              "egpu.io/gpu-cores": st.integers(1, 100)},
)
percent_share = st.fixed_dictionaries({"egpu.io/gpu": st.integers(1, 2),
                                       "egpu.io/gpu-memory-percentage": st.integers(1, 100)})
container = st.one_of(share, percent_share)

pod_spec = st.fixed_dictionaries({
    "containers": st.lists(container, min_size=1, max_size=3),
    "inits": st.lists(container, max_size=2),
    "sidecars": st.lists(container, max_size=1),
    "oversub": st.booleans(),
    "policy": st.sampled_from(["binpack", "spread"]),
})

node_cards = st.lists(st.sampled_from([8000, 15360, 16384, 24576]), min_size=1, max_size=4)


def _pod(spec: dict[str, Any], name: str, oversub: bool | None = None) -> dict[str, Any]:
    ann = {"egpu.io/gpu-policy": spec["policy"]}
    if spec["oversub"] if oversub is None else oversub:
        ann["egpu.io/memory-oversubscription"] = "true"
    return pod(name, containers=spec["containers"], inits=spec["inits"],
               sidecars=spec["sidecars"], annotations=ann, uid=name)


def _cluster(capacities: list[list[int]]) -> tuple[ClusterState, dict[str, dict[str, int]]]:
    state = ClusterState(CONFIG)
    caps: dict[str, dict[str, int]] = {}
    for n, card_caps in enumerate(capacities):
        cards = [Card(f"N{n}-{i}", i, "NVIDIA L40", cap) for i, cap in enumerate(card_caps)]
        state.upsert_node(node(f"n{n}", cards))
        caps[f"n{n}"] = {c.uuid: c.memory_mib for c in cards}
    return state, caps


def _check_ledger(state: ClusterState, caps: dict[str, dict[str, int]], any_oversub: bool) -> None:
    totals: dict[tuple[str, str], CardBooking] = {}
    for booking in state.bookings().values():
        for uuid, amount in booking.cards.items():
            key = (booking.node, uuid)
            totals[key] = totals.get(key, CardBooking()) + amount
    for name, card_caps in caps.items():
        usage = state.usage(name)
        for uuid, cap in card_caps.items():
            used = usage.get(uuid, CardBooking())
            assert used == totals.get((name, uuid), CardBooking())  # ledger = sum of bookings
            bound = int(cap * CONFIG.memory_oversubscription_ratio) if any_oversub else cap
            assert 0 <= used.memory_mib <= bound, (uuid, used, cap)
            assert 0 <= used.cores <= 100
            assert 0 <= used.slots <= CONFIG.shares_per_card


def _shrunk(text: str) -> str:
    """The allocation with every card's memory and cores cut to 1 (a user's edit)."""
    data = json.loads(text)
    for entry in data["containers"]:
        for card in entry["cards"]:
            card["memory_mib"], card["cores"] = 1, 0
    return json.dumps(data)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), pod_spec, st.sampled_from(["reserve", "observe"])),
        st.tuples(st.just("remove"), st.integers(0, 50),
                  st.sampled_from(["delete", "finished", "annotation-gone", "annotation-edited",
                                   "unreserve"])),
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacities=st.lists(node_cards, min_size=1, max_size=3), steps=ops,
       allow_oversub=st.booleans())
def test_never_overbooks_whatever_the_order_of_adds_and_removes(
    capacities: list[list[int]], steps: list[tuple[Any, ...]], allow_oversub: bool
) -> None:
    state, caps = _cluster(capacities)
    live: list[dict[str, Any]] = []
    for n, (op, arg, how) in enumerate(steps):
        if op == "add":
            p = _pod(arg, f"p{n}", oversub=arg["oversub"] and allow_oversub)
            d = PodDemand.from_request(read_pod(p, CONFIG).request)  # type: ignore[arg-type]
            for name in caps:
                result = fit(state.node(name), d, LIMITS, NOW)
                if isinstance(result, Placement):
                    booking = Booking(p["metadata"]["uid"], p["metadata"]["name"], name,
                                      result.allocation, result.bookings)
                    if how == "reserve":
                        state.reserve(booking)
                    else:
                        p["metadata"]["annotations"]["egpu.io/allocation"] = (
                            result.allocation.encode())
                        p["spec"]["nodeName"] = name
                        state.observe_pod(p)
                    live.append(p)
                    break
        elif live:
            p = live.pop(arg % len(live))
            uid = p["metadata"]["uid"]
            if how == "delete":
                state.delete_pod(uid)
            elif how == "finished":
                state.observe_pod({**p, "status": {"phase": "Succeeded"}})
                state.unreserve(uid)
            elif how in ("annotation-gone", "annotation-edited"):
                # F2: a removed or edited annotation releases and shrinks nothing (the first
                # allocation seen stands until the pod is deleted or finishes)
                before = state.booking(uid)
                edited = {**p["metadata"]["annotations"]} if how == "annotation-edited" else {}
                if edited.get("egpu.io/allocation"):
                    edited["egpu.io/allocation"] = _shrunk(edited["egpu.io/allocation"])
                state.observe_pod({**p, "metadata": {**p["metadata"], "annotations": edited}})
                state.unreserve(uid)
                if p["metadata"]["annotations"].get("egpu.io/allocation"):  # it was observed
                    assert state.booking(uid) == before
                live.append(p)  # still booked until deleted
            else:
                state.unreserve(uid)
                state.delete_pod(uid)
        _check_ledger(state, caps, allow_oversub)
    for p in live:
        state.delete_pod(p["metadata"]["uid"])
    assert state.bookings() == {}
    for name in caps:
        assert all(u == CardBooking() for u in state.usage(name).values())


@settings(max_examples=200, deadline=None)
@given(card_caps=node_cards, spec=pod_spec,
       booked=st.lists(st.tuples(st.integers(0, 30000), st.integers(0, 100), st.integers(0, 4)),
                       min_size=4, max_size=4))
def test_a_placement_is_valid_and_books_what_the_record_says(
    card_caps: list[int], spec: dict[str, Any], booked: list[tuple[int, int, int]]
) -> None:
    cards = tuple(CardState(f"G{i}", i, "L40", cap, True, *booked[i])
                  for i, cap in enumerate(card_caps))
    n = NodeState("n", cards, NOW)
    p = _pod(spec, "p")
    request = read_pod(p, CONFIG).request
    assert request is not None
    result = fit(n, PodDemand.from_request(request), LIMITS, NOW)
    if not isinstance(result, Placement):
        return
    for c in request.containers:
        got = result.allocation.for_container(c.name)
        assert got is not None and len(set(got.uuids)) == c.share.gpus
    assert allocation_bookings(result.allocation, request) == result.bookings
    bound = 1.5 if request.memory_oversubscription else 1.0
    for card in cards:
        add = result.bookings.get(card.uuid)
        if add is None:
            continue
        if add.memory_mib:
            assert card.booked_mib + add.memory_mib <= int(card.capacity_mib * bound)
        if add.cores:
            assert card.booked_cores + add.cores <= 100
        assert card.used_slots + add.slots <= CONFIG.shares_per_card


@settings(max_examples=200, deadline=None)
@given(booked=st.lists(st.integers(0, 24000), min_size=1, max_size=8),
       ask=st.integers(1, 24000), policy=st.sampled_from(["binpack", "spread"]))
def test_binpack_takes_the_fullest_card_that_fits_spread_the_emptiest(
    booked: list[int], ask: int, policy: str
) -> None:
    cards = tuple(CardState(f"G{i}", i, "L40", 24576, True, b) for i, b in enumerate(booked))
    p = pod(containers=[{"egpu.io/gpu-memory": ask}], annotations={"egpu.io/gpu-policy": policy})
    d = PodDemand.from_request(read_pod(p, CONFIG).request)  # type: ignore[arg-type]
    result = fit(NodeState("n", cards, NOW), d, LIMITS, NOW)
    fitting = [c for c in cards if c.booked_mib + ask <= c.capacity_mib]
    if not fitting:
        assert not isinstance(result, Placement)
        return
    assert isinstance(result, Placement)
    chosen = result.allocation.containers[0].cards[0].index
    pick = (max(fitting, key=lambda c: (c.fullness, -c.index)) if policy == "binpack"
            else min(fitting, key=lambda c: (c.fullness, c.index)))
    assert chosen == pick.index


@settings(max_examples=200, deadline=None)
@given(booked=st.lists(st.integers(0, 20000), min_size=2, max_size=6), ask=st.integers(1, 4000))
def test_node_scores_order_nodes_by_fullness(booked: list[int], ask: int) -> None:
    """binpack ranks a fuller node never below an emptier one; spread the other way round."""
    d = PodDemand.from_request(read_pod(pod(containers=[{"egpu.io/gpu-memory": ask}]),
                                        CONFIG).request)  # type: ignore[arg-type]
    placements = []
    for i, b in enumerate(booked):
        result = fit(NodeState(f"n{i}", (CardState("G", 0, "L40", 24576, True, b),), NOW),
                     d, LIMITS, NOW)
        assert isinstance(result, Placement)
        placements.append(result)
    placements.sort(key=lambda r: r.utilization)
    bp = [strategies.get("binpack").node_score(r.utilization) for r in placements]
    sp = [strategies.get("spread").node_score(r.utilization) for r in placements]
    assert bp == sorted(bp) and sp == sorted(sp, reverse=True)
    assert all(0 <= s <= 10 for s in bp + sp)


@settings(max_examples=300, deadline=None)
@given(card_caps=node_cards, spec=pod_spec, single=st.booleans(),
       booked=st.lists(st.tuples(st.integers(0, 30000), st.integers(0, 100), st.integers(0, 4)),
                       min_size=4, max_size=4),
       healthy=st.lists(st.booleans(), min_size=4, max_size=4),
       use_type=st.sampled_from(["", "L40", "A10"]))
def test_check_agrees_with_fit(
    card_caps: list[int], spec: dict[str, Any], single: bool,
    booked: list[tuple[int, int, int]], healthy: list[bool], use_type: str,
) -> None:
    """The fast path (filter, prioritize) answers exactly what the full search (bind) does."""
    if single:
        spec = {**spec, "containers": spec["containers"][:1], "inits": [], "sidecars": []}
    cards = tuple(CardState(f"G{i}", i, "NVIDIA L40" if i % 2 else "NVIDIA A10", cap,
                            healthy[i], *booked[i]) for i, cap in enumerate(card_caps))
    p = _pod(spec, "p")
    if use_type:
        p["metadata"]["annotations"]["egpu.io/use-gpu-type"] = use_type
    request = read_pod(p, CONFIG).request
    assert request is not None
    d = PodDemand.from_request(request)
    n = NodeState("n", cards, NOW)
    full, fast = fit(n, d, LIMITS, NOW), check(n, d, LIMITS, NOW)
    if isinstance(full, Placement):
        assert isinstance(fast, Fits) and fast.utilization == full.utilization
    else:
        assert fast == full
