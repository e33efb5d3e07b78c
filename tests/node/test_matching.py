"""node_agent.deviceplugin.matching: each container gets its own pod's share (FC-12)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from egpu.contract import (
    ENV_ALLOCATION_ERROR,
    ENV_CONTAINER,
    ENV_DEVICES,
    ENV_MEMORY_LIMIT_MIB,
    ENV_POD_UID,
    NVIDIA_VISIBLE_DEVICES,
)
from egpu.records import Card, CardShare, ContainerAllocation
from node_agent.deviceplugin.matching import (
    Ambiguous,
    Matched,
    Pending,
    Unmatched,
    allocate_envs,
    match,
    preferred,
)
from node_agent.deviceplugin.slots import card_of, slot_id, slots

UUIDS = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)]


def pending(uid: str, cards: list[int], mib: int = 4096, seen: int = 0,
            name: str = "main") -> Pending:
    share = ContainerAllocation(name, False, tuple(
        CardShare(UUIDS[i], i, mib, 20) for i in cards))
    return Pending(uid, "ns", f"pod-{uid}", share, seen)


def test_slots_are_per_card_and_carry_the_card() -> None:
    cards = tuple(Card(UUIDS[i], i, "NVIDIA A10", 24576, numa_node=i % 2) for i in (1, 0))
    ids = [s.id for s in slots(cards, 3)]
    assert ids[:3] == [slot_id(UUIDS[0], k) for k in range(3)] and len(ids) == 6
    assert {card_of(i) for i in ids} == {UUIDS[0], UUIDS[1]}
    assert all(len(i) <= 63 for i in ids)


def test_same_size_pods_on_two_cards_allocated_in_opposite_order() -> None:
    a, b = pending("a", [0], seen=1), pending("b", [1], seen=2)
    first = match([slot_id(UUIDS[1], 3)], [a, b])
    assert isinstance(first, Matched) and first.pending.pod_uid == "b"
    second = match([slot_id(UUIDS[0], 0)], [a])
    assert isinstance(second, Matched) and second.pending.pod_uid == "a"
    envs = allocate_envs(first, [slot_id(UUIDS[1], 3)])
    assert envs[NVIDIA_VISIBLE_DEVICES] == UUIDS[1]
    assert envs[ENV_POD_UID] == "b" and envs[ENV_CONTAINER] == "main"
    assert envs[ENV_MEMORY_LIMIT_MIB] == "4096"


def test_eight_card_pod_gets_eight_distinct_cards_in_allocation_order() -> None:
    big = pending("big", [3, 1, 0, 2, 7, 6, 5, 4])
    ids = [slot_id(u, 0) for u in UUIDS]
    result = match(ids, [big, pending("small", [0])])
    assert isinstance(result, Matched)
    visible = allocate_envs(result, ids)[NVIDIA_VISIBLE_DEVICES].split(",")
    assert visible == [UUIDS[i] for i in (3, 1, 0, 2, 7, 6, 5, 4)]
    assert len(set(visible)) == 8


def test_two_slots_on_one_card_are_refused() -> None:
    result = match([slot_id(UUIDS[0], 0), slot_id(UUIDS[0], 1)], [pending("a", [0, 1])])
    assert isinstance(result, Unmatched) and "distinct cards" in result.message


def test_no_pending_pod_on_those_cards_is_a_clear_failure() -> None:
    result = match([slot_id(UUIDS[2], 0)], [pending("a", [0])], node="n1")
    assert isinstance(result, Unmatched)
    envs = allocate_envs(result, [slot_id(UUIDS[2], 0)])
    assert "no pod bound on node n1" in envs[ENV_ALLOCATION_ERROR]
    assert envs[NVIDIA_VISIBLE_DEVICES] == "void" and envs[ENV_DEVICES]


def test_two_pods_on_the_same_card_are_ambiguous_cards_only() -> None:
    result = match([slot_id(UUIDS[0], 5)], [pending("a", [0], 1000), pending("b", [0], 8000)])
    assert isinstance(result, Ambiguous) and len(result.candidates) == 2
    envs = allocate_envs(result, [slot_id(UUIDS[0], 5)])
    assert envs[NVIDIA_VISIBLE_DEVICES] == UUIDS[0]
    assert ENV_POD_UID not in envs and ENV_MEMORY_LIMIT_MIB not in envs


def test_preferred_picks_the_first_seen_pending_pods_cards() -> None:
    available = [slot_id(u, k) for u in UUIDS[:4] for k in range(2)]
    chosen = preferred(available, [], 2, [pending("late", [2, 3], seen=5),
                                          pending("early", [1, 0], seen=1)])
    assert [card_of(c) for c in chosen] == [UUIDS[1], UUIDS[0]]


def test_preferred_without_candidate_spreads_over_distinct_cards() -> None:
    available = [slot_id(u, k) for u in UUIDS[:3] for k in range(2)]
    chosen = preferred(available, [], 3, [])
    assert len({card_of(c) for c in chosen}) == 3


@given(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True),
       st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True), max_size=5))
def test_a_match_is_never_another_card_set(request: list[int], others: list[list[int]]) -> None:
    ids = [slot_id(UUIDS[i], 0) for i in request]
    candidates = [pending(f"p{i}", cards) for i, cards in enumerate(others)]
    result = match(ids, candidates)
    if isinstance(result, Matched):
        assert result.pending.cards == {UUIDS[i] for i in request}
    if isinstance(result, Ambiguous):
        assert all(c.cards == {UUIDS[i] for i in request} for c in result.candidates)
        assert set(result.uuids) == {UUIDS[i] for i in request}
