"""The extender's bind gate (docs/node.md, "One binding of pod to cards"): a bind whose
same-sized shares sit on other cards than those of a pod that awaits its kubelet's admission
on the node waits until the kubelet admitted that pod; pods on the same cards never wait.

Bugs these catch: a gate that never releases (a Deployment stops at the first card change), a
gate that lets a conflicting pod through (two pods the kubelet can mix up), a wait longer than
kube-scheduler's extender timeout (the scheduler gives up on a bind the extender then makes).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from egpu.records import Allocation, CardShare, ContainerAllocation
from scheduler import extender as extender_module
from scheduler.placement import admission_conflict
from tests.scheduler.helpers import cards, limits, node, pod
from tests.scheduler.test_extender import args, bind_args, make


def record(p: dict) -> Allocation:
    return Allocation.decode(p["metadata"]["annotations"]["egpu.io/allocation"])


async def test_a_pod_on_other_cards_waits_until_the_kubelet_admitted_the_waiting_ones() -> None:
    ext, api = make([node("n", cards(2, memory=4000))])
    api.kubelet_admits = False
    first = [api.add(pod(f"a{i}", containers=[limits(memory=2000)])) for i in range(2)]
    for p in first:  # binpack: both on card 0, which they fill; same cards: no wait
        assert (await ext.bind(bind_args(p, "n")))["Error"] == ""
    assert {record(p).containers[0].uuids for p in first} == {("GPU-0",)}
    later = api.add(pod("b", containers=[limits(memory=2000)]))
    bind = asyncio.ensure_future(ext.bind(bind_args(later, "n")))
    await asyncio.sleep(0.1)
    assert not bind.done() and ext.gate_waits == 1
    api.admit("a0")
    await asyncio.sleep(0.1)
    assert not bind.done()  # a1 still waits for admission on card 0
    api.admit("a1")
    assert (await asyncio.wait_for(bind, 2))["Error"] == ""
    assert record(later).containers[0].uuids == ("GPU-1",)


async def _bind_two_then_hold_a_third(ext: Any, api: Any) -> asyncio.Future[Any]:
    """Node n's two 4000 MiB cards: a0 and a1 (2000 MiB each, awaiting admission) go on
    GPU-0; b, which needs GPU-1, is held at the gate. Returns b's bind, still running."""
    for i in range(2):
        assert (await ext.bind(bind_args(api.add(pod(f"a{i}", containers=[limits(
            memory=2000)])), "n")))["Error"] == ""
    held = asyncio.ensure_future(ext.bind(bind_args(api.add(pod("b", containers=[limits(
        memory=2000)])), "n")))
    await asyncio.sleep(0.05)
    assert not held.done()
    return held


async def test_prioritize_scores_0_a_node_where_the_gate_would_hold_the_pod() -> None:
    """Bug caught: binpack scored highest the node whose card change the gate holds, so a
    Deployment's replicas queued there, each bind waiting for the kubelet to admit the pods
    before it (up to BIND_GATE_WAIT_S), while another node took it at once (the plugin
    experiment of issue 24: 2451 holds in 3000 pods without this, none with it)."""
    ext, api = make([node("n", cards(2, memory=4000)), node("m", cards(2, memory=4000))])
    api.kubelet_admits = False
    for i in range(2):  # 3000 of n's GPU-0; the kubelet has admitted neither yet
        assert (await ext.bind(bind_args(api.add(pod(f"a{i}", containers=[limits(
            memory=1500)])), "n")))["Error"] == ""
    later = api.add(pod("b", containers=[limits(memory=2000)]))  # only GPU-1 takes it
    same = api.add(pod("c", containers=[limits(memory=1000)]))  # GPU-0 takes it beside them

    def scores(p: dict[str, Any]) -> dict[str, int]:
        return {h["Host"]: h["Score"] for h in ext.prioritize(args(p, ["n", "m"]))}

    assert scores(later)["n"] == 0 < scores(later)["m"]  # b needs GPU-1: held on n
    assert scores(same)["n"] > scores(same)["m"] > 0  # c goes on GPU-0 with them: no hold
    api.admit("a0")
    assert scores(later)["n"] == 0  # a1 still awaits admission on GPU-0
    api.admit("a1")
    assert scores(later)["n"] > scores(later)["m"] > 0  # binpack again


def _uid(api: Any, name: str) -> str:
    return str(api.pods[("default", name)]["metadata"]["uid"])


async def test_a_pod_asked_about_itself_still_awaits_admission_for_the_next_pod() -> None:
    """Bug caught: the index of nodes where a pod may await admission dropped a node when the
    only pod awaiting there was the one left out of the question (its own prioritize or
    bind), so the next pod's bind saw nothing awaiting and the gate let it mix the two up."""
    ext, api = make([node("n", cards(2, memory=4000))])
    api.kubelet_admits = False
    a = api.add(pod("a", containers=[limits(memory=4000)]))
    assert (await ext.bind(bind_args(a, "n")))["Error"] == ""
    assert ext.state.awaiting_admission("n", excluding=_uid(api, "a")) == []
    assert [b.uid for b in ext.state.awaiting_admission("n")] == [_uid(api, "a")]


async def test_a_node_left_out_of_the_index_comes_back_with_each_pod_awaiting_admission(
        ) -> None:
    """Bug caught: once every pod of a node was admitted (the node left the index), a pod that
    awaits admission there again was never seen: a new bind, a bind made again with the very
    booking the pod had, or a bind that failed while the pod's observed booking still awaits
    its kubelet."""
    ext, api = make([node("n", cards(2, memory=4000))])
    a = api.add(pod("a", containers=[limits(memory=1000)]))
    assert (await ext.bind(bind_args(a, "n")))["Error"] == ""  # the kubelet admits it
    state = ext.state
    assert state.awaiting_admission("n") == []  # n leaves the index
    api.kubelet_admits = False
    b = api.add(pod("b", containers=[limits(memory=1000)]))
    assert (await ext.bind(bind_args(b, "n")))["Error"] == ""
    assert [x.uid for x in state.awaiting_admission("n")] == [_uid(api, "b")]
    api.admit("b")
    assert state.awaiting_admission("n") == []
    booking = state.booking(_uid(api, "a"))
    assert booking is not None
    state.reserve(booking)  # the same Booking object: a bind of it in flight again
    assert [x.uid for x in state.awaiting_admission("n")] == [_uid(api, "a")]
    state.unreserve(_uid(api, "a"))
    assert state.awaiting_admission("n") == []


async def test_a_held_bind_decides_again_on_changes_of_its_node_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug caught: every pod event of the cluster woke every held bind, each of which fitted
    its pod again (bench/scheduling.py: a Deployment binpacked onto a node holds its binds
    while the pods of every other node change, and those decisions took a third of the
    extender's CPU)."""
    ext, api = make([node("n", cards(2, memory=4000)), node("m", cards(2, memory=4000))])
    api.kubelet_admits = False
    decided: list[str] = []
    decide = ext._decide
    monkeypatch.setattr(ext, "_decide", lambda p, r, uid, n: decided.append(n) or decide(
        p, r, uid, n))
    held = await _bind_two_then_hold_a_third(ext, api)
    assert decided.count("n") == 3  # a0, a1, and b's first decision
    for i in range(3):  # pods of the other node come and get bound (one card: no gate)
        other = api.add(pod(f"m{i}", containers=[limits(memory=100)]))
        assert (await ext.bind(bind_args(other, "m")))["Error"] == ""
    await asyncio.sleep(0.05)
    assert decided.count("n") == 3, decided
    api.admit("a0")  # a change on n: b decides again (and stays held for a1)
    await asyncio.sleep(0.05)
    assert decided.count("n") == 4 and not held.done()
    api.admit("a1")
    assert (await asyncio.wait_for(held, 2))["Error"] == ""
    assert decided.count("n") == 5


async def test_a_held_bind_decides_again_when_its_node_loses_the_card_it_waits_for() -> None:
    """Bug caught: a held bind woke only on pod changes, so when its node's inventory lost the
    card the pod waited for, the bind stayed held for the gate's full 8 s (kube-scheduler's
    binding cycle blocked) before it said the pod no longer fits."""
    ext, api = make([node("n", cards(2, memory=4000))])
    api.kubelet_admits = False
    held = await _bind_two_then_hold_a_third(ext, api)
    ext.state.upsert_node(node("n", cards(1, memory=4000)))  # GPU-1 is gone
    result = await asyncio.wait_for(held, 1)  # not BIND_GATE_WAIT_S
    assert "no longer fits" in result["Error"], result


async def test_a_held_bind_gives_up_with_the_reason_before_the_schedulers_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extender_module, "BIND_GATE_WAIT_S", 0.2)
    ext, api = make([node("n", cards(2, memory=2000))])
    api.kubelet_admits = False
    assert (await ext.bind(bind_args(api.add(pod("a", containers=[limits(memory=2000)])),
                                     "n")))["Error"] == ""
    result = await ext.bind(bind_args(api.add(pod("b", containers=[limits(memory=2000)])), "n"))
    assert "awaiting admission" in result["Error"] and "GPU-0" in result["Error"], result
    assert ext.state.booking(api.pods[("default", "b")]["metadata"]["uid"]) is None


def test_shares_of_other_sizes_or_on_the_same_cards_never_conflict() -> None:
    def alloc(*containers: tuple[str, ...]) -> Allocation:
        return Allocation(node="n", containers=tuple(
            ContainerAllocation(f"c{i}", False, tuple(CardShare(u, 0, 1, 0) for u in cards))
            for i, cards in enumerate(containers)))
    one_a, one_b = alloc(("A",)), alloc(("B",))
    assert admission_conflict(one_a, [alloc(("A",)), alloc(("A",))]) is None
    assert admission_conflict(one_a, [alloc(("B", "C"))]) is None  # the kubelet tells sizes apart
    assert admission_conflict(one_a, [one_b]) is not None
    # one pod alone may hold one size on several cards (its containers are allocated in order)
    assert admission_conflict(alloc(("A",), ("B",)), []) is None
    assert admission_conflict(one_a, [alloc(("A",), ("B",))]) is not None
