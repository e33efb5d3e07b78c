"""The placement core beyond one pod on one node (those cases are data:
placement_cases.yaml, run by test_placement_cases.py): staleness as one rule for bind and
filter, bookings in a cluster view, the init rule's arithmetic, node scores, FC-10 bursts."""

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


# --- multi-card and multi-container ---------------------------------------------------------

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


# --- init containers (FC-07) ----------------------------------------------------------------

def test_init_rule_with_sidecar() -> None:
    """A sidecar runs beside the app (summed) and beside inits declared after it."""
    entries = [(ContainerKind.SIDECAR, 3000, 10), (ContainerKind.INIT, 12000, 50),
               (ContainerKind.APP, 8000, 20)]
    assert book_card(entries) == CardBooking(15000, 60, 2)
    # an init declared before the sidecar runs alone
    entries = [(ContainerKind.INIT, 12000, 50), (ContainerKind.SIDECAR, 3000, 10),
               (ContainerKind.APP, 8000, 20)]
    assert book_card(entries) == CardBooking(12000, 50, 2)


def test_placement_bookings_match_the_allocation_record() -> None:
    p_obj = pod(inits=[limits(memory=12000)], sidecars=[limits(memory=1000, cores=5)],
                containers=[limits(memory=8000, cores=20), limits(gpus=2, memory=100)])
    n = NodeState("n", tuple(card(i) for i in range(3)), NOW)
    p = placed(place(n, p_obj))
    request = read_pod(p_obj).request
    assert allocation_bookings(p.allocation, request) == p.bookings


# --- strategies ----------------------------------------------------------------------------

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


