"""scheduler.placement.repack: the cards a set of pods needs, placed again by egpu's
own fit and score (what `kubectl egpu advise` compares). Bugs caught: a repack that ignores
the slot limit or the memory ratio (it would promise cards a real placement cannot free), a
pod that fits nowhere dropped silently, bookings of the live cluster counted in."""

from __future__ import annotations

from scheduler.placement import CardState, Limits, NodeState
from scheduler.placement.repack import repack
from tests.scheduler.helpers import NOW, pod
from tests.scheduler.test_placement import demand

LIMITS = Limits(shares_per_card=4, memory_ratio=1.0, cores_ratio=1.0, heartbeat_timeout_s=120)


def nodes(count: int, cards: int, booked_mib: int = 0) -> list[NodeState]:
    return [NodeState(f"n{n}", tuple(CardState(f"GPU-{n}-{c}", c, "NVIDIA A10", 24000,
                                               booked_mib=booked_mib, used_slots=1)
                                     for c in range(cards)), heartbeat=NOW - 3600)
            for n in range(count)]


def shares(count: int, mib: int, cores: int = 0) -> list:
    limits = {"egpu.io/gpu": 1, "egpu.io/gpu-memory": mib}
    if cores:
        limits["egpu.io/gpu-cores"] = cores
    return [demand(pod(f"p{i}", containers=[limits])) for i in range(count)]


def test_smaller_shares_pack_onto_fewer_cards() -> None:
    """8 shares of 8000 MiB: 3 per 24000 MiB card -> 3 cards; at 5000 MiB: 4 per card (the
    slot limit, not memory: 4 x 5000 = 20000) -> 2 cards. The live bookings and a stale
    heartbeat are not the repack's business."""
    fleet = nodes(2, 4, booked_mib=20000)
    assert repack(fleet, shares(8, 8000), LIMITS, NOW).cards == 3
    assert repack(fleet, shares(8, 5000), LIMITS, NOW).cards == 2


def test_cores_bind_like_memory() -> None:
    """1000 MiB shares of 60% cores: one per card (cores_ratio 1.0) -> 5 cards; at 30%: 3 per
    card by cores, 4 by slots -> 3 per card -> 2 cards."""
    fleet = nodes(2, 4)
    assert repack(fleet, shares(5, 1000, 60), LIMITS, NOW).cards == 5
    assert repack(fleet, shares(5, 1000, 30), LIMITS, NOW).cards == 2


def test_a_pod_that_fits_nowhere_is_counted() -> None:
    result = repack(nodes(1, 1), shares(2, 20000), LIMITS, NOW)
    assert (result.cards, result.unplaced) == (1, 1)
