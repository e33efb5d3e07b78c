"""The placement core: each filter reason, the init rule, strategies, and the field cases."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from egpu.booking import CardBooking, allocation_bookings, book_card
from egpu.config import Config
from egpu.requests import ContainerKind, read_pod
from scheduler import strategies
from scheduler.placement import (
    CardState,
    Limits,
    NodeState,
    Placement,
    PodDemand,
    Unfit,
    fit,
    score,
)
from scheduler.state import Booking, ClusterState
from tests.scheduler.helpers import NOW, cards, limits, node, pod

LIMITS = Limits(shares_per_card=10, memory_ratio=1.5, cores_ratio=1.0, heartbeat_timeout_s=120)


def card(i: int, model: str = "NVIDIA A10", cap: int = 23028, **kw: object) -> CardState:
    return CardState(f"GPU-{i}", i, model, cap, **kw)  # type: ignore[arg-type]


def demand(p: dict, config: Config | None = None) -> PodDemand:
    reading = read_pod(p, config or Config())
    assert reading.request is not None, reading.errors
    return PodDemand.from_request(reading.request)


def place(n: NodeState, p: dict, lim: Limits = LIMITS) -> Placement | Unfit:
    return fit(n, demand(p), lim, NOW)


def unfit(result: Placement | Unfit) -> Unfit:
    assert isinstance(result, Unfit), result
    return result


def placed(result: Placement | Unfit) -> Placement:
    assert isinstance(result, Placement), result
    return result


# --- node-level reasons ------------------------------------------------------------------

def test_stale_heartbeat_is_unresolvable() -> None:
    n = NodeState("n", (card(0),), heartbeat=NOW - 121)
    r = unfit(place(n, pod()))
    assert r.unresolvable and "121 s old" in r.reason and "limit 120 s" in r.reason


def test_fresh_heartbeat_within_timeout_fits() -> None:
    placed(place(NodeState("n", (card(0),), heartbeat=NOW - 119), pod()))


def test_missing_heartbeat() -> None:
    r = unfit(place(NodeState("n", (card(0),), heartbeat=None), pod()))
    assert "heartbeat" in r.reason and r.unresolvable


def test_a_heartbeat_from_the_future_beyond_the_clock_skew_is_stale() -> None:
    """A node whose clock runs ahead would stay fresh long after its agent died (its
    heartbeat's age is negative): one more than HEARTBEAT_FUTURE_SKEW_S ahead is stale, in the
    full search (bind) and on the fast path (filter, prioritize) alike."""
    from scheduler.placement import check
    from scheduler.placement.rule import HEARTBEAT_FUTURE_SKEW_S
    n = NodeState("n", (card(0),), heartbeat=NOW + HEARTBEAT_FUTURE_SKEW_S + 1)
    for r in (unfit(place(n, pod())), unfit(check(n, demand(pod()), LIMITS, NOW))):
        assert r.unresolvable
        assert "61 s in the future" in r.reason and "clock" in r.reason, r.reason


def test_a_heartbeat_slightly_ahead_of_the_clock_is_fresh() -> None:
    from scheduler.placement import check
    from scheduler.placement.rule import HEARTBEAT_FUTURE_SKEW_S
    n = NodeState("n", (card(0),), heartbeat=NOW + HEARTBEAT_FUTURE_SKEW_S)
    placed(place(n, pod()))
    assert not isinstance(check(n, demand(pod()), LIMITS, NOW), Unfit)


@pytest.mark.parametrize(("heartbeat", "problem", "stale"), [
    (NOW - 120, "", False), (NOW - 120.5, "", True), (NOW + 60, "", False),
    (NOW + 60.5, "", True), (NOW, "", False), (None, "", True), (NOW, "bad inventory", True),
])
def test_staleness_is_one_rule_for_bind_filter_and_wording(
        heartbeat: float | None, problem: str, stale: bool) -> None:
    """``rule.is_stale`` is the staleness rule: ``stale_reason`` words exactly the nodes it
    calls stale, and the full search (bind) and the fast path (filter) both follow it, at the
    timeout's and the clock skew's edges alike."""
    from scheduler.placement import check
    from scheduler.placement.rule import fresh_heartbeats, is_stale, stale_reason
    n = NodeState("n", (card(0),), heartbeat=heartbeat, problem=problem)
    assert is_stale(n, *fresh_heartbeats(NOW, LIMITS)) is stale
    assert bool(stale_reason(n, NOW, LIMITS)) is stale
    for r in (place(n, pod()), check(n, demand(pod()), LIMITS, NOW)):
        assert isinstance(r, Unfit) is stale, r
        if isinstance(r, Unfit):
            assert r.unresolvable and r.reason == stale_reason(n, NOW, LIMITS)


def test_inventory_problem_is_reported() -> None:
    r = unfit(place(NodeState("n", (), NOW, problem="egpu inventory unreadable: x"), pod()))
    assert r.reason == "egpu inventory unreadable: x" and r.unresolvable


def test_no_cards() -> None:
    assert "no GPU cards" in unfit(place(NodeState("n", (), NOW), pod())).reason


def test_unhealthy_cards_only() -> None:
    r = unfit(place(NodeState("n", (card(0, healthy=False),), NOW), pod()))
    assert "no healthy card" in r.reason and r.unresolvable


def test_unhealthy_card_skipped() -> None:
    n = NodeState("n", (card(0, healthy=False), card(1)), NOW)
    p = placed(place(n, pod()))
    assert p.allocation.containers[0].uuids == ("GPU-1",)


def test_use_gpu_type_token_rule() -> None:
    n = NodeState("n", (card(0, "NVIDIA A100-SXM4-80GB", 81920),), NOW)
    r = unfit(place(n, pod(annotations={"egpu.io/use-gpu-type": "A10"})))
    assert "use-gpu-type A10" in r.reason and "NVIDIA A100-SXM4-80GB" in r.reason
    assert r.unresolvable
    placed(place(n, pod(annotations={"egpu.io/use-gpu-type": "a100"})))


def test_nouse_gpu_type() -> None:
    n = NodeState("n", (card(0), card(1, "Tesla T4", 15360)), NOW)
    p = placed(place(n, pod(annotations={"egpu.io/nouse-gpu-type": "A10"})))
    assert p.allocation.containers[0].uuids == ("GPU-1",)
    r = unfit(place(NodeState("n", (card(0),), NOW),
                    pod(annotations={"egpu.io/nouse-gpu-type": "A10"})))
    assert "nouse-gpu-type A10" in r.reason


def test_uuid_filters() -> None:
    n = NodeState("n", (card(0), card(1), card(2)), NOW)
    p = placed(place(n, pod(annotations={"egpu.io/use-gpu-uuid": "GPU-2"})))
    assert p.allocation.containers[0].uuids == ("GPU-2",)
    p = placed(place(n, pod(annotations={"egpu.io/nouse-gpu-uuid": "GPU-0,GPU-1"})))
    assert p.allocation.containers[0].uuids == ("GPU-2",)
    r = unfit(place(n, pod(annotations={"egpu.io/use-gpu-uuid": "GPU-9"})))
    assert "use-gpu-uuid" in r.reason and r.unresolvable


# --- card-level reasons ------------------------------------------------------------------

def test_memory_free_reason_names_card_free_and_asked() -> None:
    n = NodeState("n", (card(0, booked_mib=20000),), NOW)
    r = unfit(place(n, pod(containers=[limits(memory=4000)])))
    assert "card 0 (NVIDIA A10, 23028 MiB): 3028 MiB free, 4000 MiB asked" in r.reason
    assert not r.unresolvable


def test_share_larger_than_card_is_unresolvable() -> None:
    r = unfit(place(NodeState("n", (card(0),), NOW), pod(containers=[limits(memory=30000)])))
    assert "30000 MiB asked > 23028 MiB bookable" in r.reason and r.unresolvable


def test_cores_reason() -> None:
    n = NodeState("n", (card(0, booked_cores=80),), NOW)
    r = unfit(place(n, pod(containers=[limits(memory=100, cores=30)])))
    assert "20% cores free, 30% asked" in r.reason and not r.unresolvable
    placed(place(n, pod(containers=[limits(memory=100, cores=20)])))


def test_no_cores_asked_fits_a_card_with_all_cores_booked() -> None:
    placed(place(NodeState("n", (card(0, booked_cores=100),), NOW), pod()))


def test_cores_oversubscription_ratio() -> None:
    n = NodeState("n", (card(0, booked_cores=100),), NOW)
    lim = replace(LIMITS, cores_ratio=1.5)
    placed(place(n, pod(containers=[limits(memory=100, cores=50)]), lim))
    unfit(place(n, pod(containers=[limits(memory=100, cores=51)]), lim))


def test_slots_reason() -> None:
    n = NodeState("n", (card(0, used_slots=10),), NOW)
    r = unfit(place(n, pod()))
    assert "all 10 share slots taken" in r.reason and not r.unresolvable


def test_memory_percentage_books_share_of_that_card() -> None:
    n = NodeState("n", (card(0, "Tesla T4", 15360),), NOW)
    p = placed(place(n, pod(containers=[limits(gpus=None, percentage=25, cores=10)])))
    share = p.allocation.containers[0].cards[0]
    assert (share.memory_mib, share.cores) == (3840, 10)
    h100 = NodeState("n", (card(0, "NVIDIA H100 80GB HBM3", 81559),), NOW)
    assert placed(place(h100, pod(containers=[limits(percentage=25)]))).bookings[
        "GPU-0"].memory_mib == 20389


def test_no_memory_given_books_the_whole_card() -> None:
    n = NodeState("n", (card(0, booked_mib=1),), NOW)
    unfit(place(n, pod(containers=[limits(gpus=1)])))
    p = placed(place(NodeState("n", (card(0),), NOW), pod(containers=[limits(gpus=1)])))
    assert p.bookings["GPU-0"].memory_mib == 23028


def test_memory_oversubscription_only_for_pods_that_ask() -> None:
    n = NodeState("n", (card(0, "H", 20000, booked_mib=10000),), NOW)
    ask = [limits(memory=15000)]
    r = unfit(place(n, pod(containers=ask)))
    assert "10000 MiB free" in r.reason
    placed(place(n, pod(containers=ask,
                        annotations={"egpu.io/memory-oversubscription": "true"})))
    # 20000 x 1.5 = 30000 bookable: 10000 + 21000 is too much
    unfit(place(n, pod(containers=[limits(memory=21000)],
                       annotations={"egpu.io/memory-oversubscription": "true"})))


def test_card_past_its_bound_takes_shares_that_add_nothing() -> None:
    """Cores booked past 100 (config lowered later): a share without cores still fits."""
    n = NodeState("n", (card(0, booked_cores=150),), NOW)
    placed(place(n, pod(containers=[limits(memory=100)])))


# --- multi-card and multi-container ---------------------------------------------------------

def test_multi_card_container_gets_distinct_cards() -> None:
    n = NodeState("n", tuple(card(i) for i in range(4)), NOW)
    p = placed(place(n, pod(containers=[limits(gpus=2, memory=30000 // 2, cores=30)])))
    uuids = p.allocation.containers[0].uuids
    assert len(set(uuids)) == 2


def test_multi_card_container_needs_enough_cards() -> None:
    n = NodeState("n", (card(0), card(1, booked_mib=20000)), NOW)
    r = unfit(place(n, pod(containers=[limits(gpus=2, memory=10000)])))
    assert "needs 2 distinct cards, 1 fit" in r.reason and not r.unresolvable
    r = unfit(place(NodeState("n", (card(0),), NOW), pod(containers=[limits(gpus=2)])))
    assert r.unresolvable


def test_two_containers_summed_on_one_card_binpack() -> None:
    """shared/inputs/pods/04: 4000+10% and 6000+10% on one card under binpack."""
    n = NodeState("n", (card(0), card(1)), NOW)
    p = placed(place(n, pod(containers=[limits(memory=4000, cores=10),
                                        limits(memory=6000, cores=10)],
                            annotations={"egpu.io/gpu-policy": "binpack"})))
    assert p.bookings == {"GPU-0": CardBooking(10000, 20, 2)}


def test_two_containers_spread_use_two_cards() -> None:
    n = NodeState("n", (card(0), card(1)), NOW)
    p = placed(place(n, pod(containers=[limits(memory=4000), limits(memory=6000)],
                            annotations={"egpu.io/gpu-policy": "spread"})))
    assert set(p.bookings) == {"GPU-0", "GPU-1"}


def test_backtracking_finds_the_placement_greedy_misses() -> None:
    """Spread puts the first (small) container on the emptiest card; the big one then needs it."""
    n = NodeState("n", (card(0, cap=10000), card(1, cap=10000, booked_mib=4000)), NOW)
    p = placed(place(n, pod(containers=[limits(memory=6000), limits(memory=9000)],
                            annotations={"egpu.io/gpu-policy": "spread"})))
    by_name = {c.name: c.uuids for c in p.allocation.containers}
    assert by_name == {"c0": ("GPU-1",), "c1": ("GPU-0",)}


def test_fc11_two_containers_use_two_slots_and_sum_memory() -> None:
    """FC-11: 4 shares per card, one 16384 MiB card; P = 2 x 4000 MiB; then Q asks 1000."""
    lim = replace(LIMITS, shares_per_card=4)
    state = ClusterState(Config(shares_per_card=4))
    state.upsert_node(node("n", cards(1, memory=16384)))
    p = pod("P", containers=[limits(memory=4000), limits(memory=4000)])
    got = placed(fit(state.node("n"), demand(p), lim, NOW))
    assert got.bookings == {"GPU-0": CardBooking(8000, 0, 2)}
    state.reserve(Booking("P", "default/P", "n", got.allocation, got.bookings))
    q = placed(fit(state.node("n"), demand(pod("Q", containers=[limits(memory=1000)])), lim, NOW))
    state.reserve(Booking("Q", "default/Q", "n", q.allocation, q.bookings))
    assert state.usage("n") == {"GPU-0": CardBooking(9000, 0, 3)}
    # one slot left: a two-container pod needs two
    r = unfit(fit(state.node("n"), demand(pod(containers=[limits(memory=100)] * 2)), lim, NOW))
    assert "share slots taken" in r.reason


def test_fc11_two_by_10000_never_on_one_16384_card() -> None:
    n = NodeState("n", (card(0, "H", 16384),), NOW)
    r = unfit(place(n, pod(containers=[limits(memory=10000), limits(memory=10000)])))
    assert r.unresolvable and "beside the pod's other containers" in r.reason
    two = NodeState("n", (card(0, "H", 16384), card(1, "H", 16384)), NOW)
    p = placed(place(two, pod(containers=[limits(memory=10000), limits(memory=10000)])))
    assert all(b.memory_mib == 10000 for b in p.bookings.values()) and len(p.bookings) == 2


# --- init containers (FC-07) ----------------------------------------------------------------

def test_fc07_init_rule_books_max_of_init_and_app() -> None:
    """shared/inputs/pods/06: init 12000 MiB/100%, app 8000 MiB/20% -> 12000 MiB, 100%."""
    n = NodeState("n", (card(0, "NVIDIA A100-SXM4-40GB", 40960),), NOW)
    p = placed(place(n, pod(inits=[limits(memory=12000, cores=100)],
                            containers=[limits(memory=8000, cores=20)])))
    assert p.bookings == {"GPU-0": CardBooking(12000, 100, 1)}
    kinds = {c.name: c.init for c in p.allocation.containers}
    assert kinds == {"init0": True, "c0": False}


def test_fc07_variant_init_only() -> None:
    n = NodeState("n", (card(0, "H", 40960),), NOW)
    p = placed(place(n, pod(inits=[limits(memory=12000)], containers=[{}])))
    assert p.bookings == {"GPU-0": CardBooking(12000, 0, 1)}


def test_init_rule_with_sidecar() -> None:
    """A sidecar runs beside the app (summed) and beside inits declared after it."""
    entries = [(ContainerKind.SIDECAR, 3000, 10), (ContainerKind.INIT, 12000, 50),
               (ContainerKind.APP, 8000, 20)]
    assert book_card(entries) == CardBooking(15000, 60, 2)
    # an init declared before the sidecar runs alone
    entries = [(ContainerKind.INIT, 12000, 50), (ContainerKind.SIDECAR, 3000, 10),
               (ContainerKind.APP, 8000, 20)]
    assert book_card(entries) == CardBooking(12000, 50, 2)


def test_init_prefers_the_pods_cards() -> None:
    """Spread would pick the empty card; the init container reuses the app's card instead."""
    n = NodeState("n", (card(0, booked_mib=5000), card(1)), NOW)
    p = placed(place(n, pod(inits=[limits(memory=4000)], containers=[limits(memory=8000)],
                            annotations={"egpu.io/gpu-policy": "binpack"})))
    assert len(p.bookings) == 1
    p = placed(place(n, pod(inits=[limits(memory=4000)], containers=[limits(memory=8000)],
                            annotations={"egpu.io/gpu-policy": "spread"})))
    assert p.bookings == {"GPU-1": CardBooking(8000, 0, 1)}


def test_init_on_other_card_when_the_pods_card_is_full() -> None:
    n = NodeState("n", (card(0, cap=10000), card(1, cap=20000)), NOW)
    p = placed(place(n, pod(inits=[limits(memory=15000)], containers=[limits(memory=9000)],
                            annotations={"egpu.io/gpu-policy": "spread"})))
    assert p.bookings["GPU-1"].memory_mib >= 15000


def test_fc07_binpack_picks_a_card_where_the_init_joins_the_app() -> None:
    """Binpack alone would put the 8000 MiB app on the fullest card (10000 MiB free), where
    the 12000 MiB init cannot follow, and book the pod a second card for its whole life;
    the app goes where both fit instead: one card, max(12000, 8000) booked (seen in the e2e
    run of shared/inputs/pods/06 when other pods had filled a card that far)."""
    n = NodeState("n", (card(0, cap=40960, booked_mib=30960), card(1, cap=40960)), NOW)
    p = placed(place(n, pod(inits=[limits(memory=12000, cores=100)],
                            containers=[limits(memory=8000, cores=20)])))
    assert p.bookings == {"GPU-1": CardBooking(12000, 100, 1)}
    # where no card takes both, the init cannot have a card of its own: the kubelet hands
    # the app container the init's slot (its reuse pool), not the app's card
    n = NodeState("n", (card(0, cap=9000), card(1, cap=40960, booked_cores=50)), NOW)
    r = unfit(place(n, pod(inits=[limits(memory=10000)],
                           containers=[limits(memory=9000, cores=100)])))
    assert "the kubelet" in r.reason and "reuses" in r.reason, r.reason


def test_the_kubelet_reuse_of_init_slots_decides_the_next_containers_cards() -> None:
    """The kubelet's device manager gives the container after a regular init container that
    init's slots first (v1.37 devicesToAllocate). Catches a placement that puts the init on
    a card its next container does not use (the app would run on the init's card with the
    app's share booked elsewhere) or a wider init before a narrower container (the kubelet
    picks an arbitrary subset)."""
    n = NodeState("n", tuple(card(i, cap=40960) for i in range(4)), NOW)
    p = placed(place(n, pod(inits=[limits(memory=1000)],
                            containers=[limits(gpus=2, memory=1000), limits(memory=1000)])))
    by_name = {c.name: set(c.uuids) for c in p.allocation.containers}
    assert by_name["init0"] <= by_name["c0"], by_name
    r = unfit(place(n, pod(inits=[limits(gpus=2, memory=1000)],
                           containers=[limits(memory=1000)])))
    assert "arbitrary" in r.reason and r.unresolvable, r
    # a sidecar takes the pool and empties it: the app after it gets cards of its own
    p = placed(place(n, pod(inits=[limits(memory=1000)], sidecars=[limits(memory=1000)],
                            containers=[limits(memory=30000)])))
    steps = [(c.kind, set(c.uuids)) for c in p.allocation.containers]
    assert steps[0][1] <= steps[1][1], steps


def test_placement_bookings_match_the_allocation_record() -> None:
    p_obj = pod(inits=[limits(memory=12000)], sidecars=[limits(memory=1000, cores=5)],
                containers=[limits(memory=8000, cores=20), limits(gpus=2, memory=100)])
    n = NodeState("n", tuple(card(i) for i in range(3)), NOW)
    p = placed(place(n, p_obj))
    request = read_pod(p_obj).request
    assert allocation_bookings(p.allocation, request) == p.bookings


# --- strategies ----------------------------------------------------------------------------

def test_binpack_takes_fullest_card_spread_the_emptiest() -> None:
    n = NodeState("n", (card(0, booked_mib=1000), card(1, booked_mib=9000), card(2)), NOW)
    bp = placed(place(n, pod(annotations={"egpu.io/gpu-policy": "binpack"})))
    sp = placed(place(n, pod(annotations={"egpu.io/gpu-policy": "spread"})))
    assert bp.allocation.containers[0].uuids == ("GPU-1",)
    assert sp.allocation.containers[0].uuids == ("GPU-2",)


def test_binpack_skips_the_fullest_card_when_it_does_not_fit() -> None:
    n = NodeState("n", (card(0, booked_mib=1000), card(1, booked_mib=22500)), NOW)
    bp = placed(place(n, pod(annotations={"egpu.io/gpu-policy": "binpack"})))
    assert bp.allocation.containers[0].uuids == ("GPU-0",)


def test_default_policy_comes_from_config() -> None:
    n = NodeState("n", (card(0, booked_mib=1000), card(1)), NOW)
    cfg = Config(defaults=replace(Config().defaults, gpu_policy="spread"))
    d = demand(pod(), cfg)
    assert placed(fit(n, d, LIMITS, NOW)).allocation.containers[0].uuids == ("GPU-1",)


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_node_scores_are_monotone_and_in_range(policy: str) -> None:
    s = strategies.get(policy)
    values = [s.node_score(u / 20) for u in range(0, 31)]
    assert all(0 <= v <= 10 for v in values)
    pairs = list(itertools.pairwise(values))
    assert all(a <= b for a, b in pairs) if policy == "binpack" else all(a >= b for a, b in pairs)


def test_node_score_uses_utilization_after_placement() -> None:
    full = NodeState("a", (card(0, cap=10000, booked_mib=8000),), NOW)
    empty = NodeState("b", (card(0, cap=10000),), NOW)
    d = demand(pod(containers=[limits(memory=1000)]))
    a, b = placed(fit(full, d, LIMITS, NOW)), placed(fit(empty, d, LIMITS, NOW))
    assert (score(a, "binpack"), score(b, "binpack")) == (9, 1)
    assert (score(a, "spread"), score(b, "spread")) == (1, 9)


def test_unknown_strategy() -> None:
    with pytest.raises(KeyError, match="allowed: binpack, spread"):
        strategies.get("random")


# --- FC-10 at the core ---------------------------------------------------------------------

def _burst(state: ClusterState, node_name: str, pods: list[dict]) -> list[str]:
    """Fit and reserve each pod in turn on ``node_name`` (what bind does); names that fit."""
    got = []
    for p in pods:
        result = fit(state.node(node_name), demand(p), LIMITS, NOW)
        if isinstance(result, Placement):
            uid = p["metadata"]["uid"]
            state.reserve(Booking(uid, p["metadata"]["name"], node_name, result.allocation,
                                  result.bookings))
            got.append(p["metadata"]["name"])
    return got


def test_fc10_only_free_card_24576_takes_exactly_two_of_three() -> None:
    for _ in range(50):
        state = ClusterState()
        inv = [*cards(1, "NVIDIA L40", 24576, "FREE"), *cards(3, "NVIDIA L40", 24576, "BUSY")]
        state.upsert_node(node("n", inv))
        for i in range(3):  # the other cards are full
            filler = pod(f"f{i}", containers=[limits(memory=24576)],
                         annotations={"egpu.io/use-gpu-uuid": f"BUSY-{i}"})
            assert _burst(state, "n", [filler])
        got = _burst(state, "n", [pod(f"p{i}", containers=[limits(memory=12288)])
                                  for i in range(3)])
        assert len(got) == 2
        assert state.usage("n")["FREE-0"] == CardBooking(24576, 0, 2)


def test_fc10_eight_h100_sixteen_pods_of_40000() -> None:
    state = ClusterState()
    state.upsert_node(node("n", cards(8, "NVIDIA H100 80GB HBM3", 81559)))
    got = _burst(state, "n", [pod(f"p{i}", containers=[limits(memory=40000)]) for i in range(17)])
    assert len(got) == 16
    assert all(u == CardBooking(80000, 0, 2) for u in state.usage("n").values())


def test_binpack_keeps_a_pods_shares_on_one_card_when_one_card_takes_them() -> None:
    """inputs/pods/04: a nearly full card takes the small share only; binpack keeps the pod
    together on a card that takes both, spread does not care."""
    n = NodeState("n", (card(0, booked_mib=18000), card(1, booked_mib=2000), card(2)), NOW)
    two = [limits(memory=4000, cores=10), limits(memory=6000, cores=10)]
    p = placed(place(n, pod(containers=two, annotations={"egpu.io/gpu-policy": "binpack"})))
    assert p.bookings == {"GPU-1": CardBooking(10000, 20, 2)}
    p = placed(place(n, pod(containers=two, annotations={"egpu.io/gpu-policy": "spread"})))
    assert len(p.bookings) == 2


def test_binpack_keeps_the_pod_together_when_a_fuller_card_takes_only_the_last_share() -> None:
    """The fuller card 0 has room for the 6000 MiB share but not for both: both go to card 1
    (the first share to a card that takes them all, the last one beside it)."""
    n = NodeState("n", (card(0, cap=24576, booked_mib=24576 - 8000), card(1, cap=24576)), NOW)
    two = [limits(memory=4000, cores=10), limits(memory=6000, cores=10)]
    p = placed(place(n, pod(containers=two, annotations={"egpu.io/gpu-policy": "binpack"})))
    assert p.bookings == {"GPU-1": CardBooking(10000, 20, 2)}
    three = [limits(memory=2000), limits(memory=3000), limits(memory=6000)]
    p = placed(place(n, pod(containers=three, annotations={"egpu.io/gpu-policy": "binpack"})))
    assert p.bookings == {"GPU-1": CardBooking(11000, 0, 3)}
