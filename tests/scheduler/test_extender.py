"""The extender verbs over a ClusterState, and the cluster view's bookkeeping (no HTTP)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from egpu.booking import CardBooking
from egpu.config import Config
from egpu.records import Allocation
from egpu.requests import read_pod
from scheduler.extender import BindError, Extender
from scheduler.placement import Limits, Placement, PodDemand, fit
from scheduler.state import Booking, ClusterState
from tests.scheduler.helpers import NOW, cards, limits, node, pod

CONFIG = Config(shares_per_card=4)


class FakeApi:
    """A pod store that plays the API server; ``watch`` feeds changes back to the state."""

    def __init__(self, state: ClusterState, watch: bool = True) -> None:
        self.state = state
        self.watch = watch
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_bind = False
        self.delay = 0.0
        # the next N Bindings are written, then their answer is lost (a client timeout)
        self.lose_answers = 0
        # the next N Bindings time out on the server before anything is written (504)
        self.server_timeouts = 0
        self.fail_get = False  # GETs get no answer
        # the node's kubelet admits a bound pod at once (status.startTime in the same event);
        # False: pods stay awaiting admission until ``admit`` (the bind gate's tests)
        self.kubelet_admits = True

    def add(self, p: dict[str, Any]) -> dict[str, Any]:
        self.pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
        self.state.observe_pod(copy.deepcopy(p))
        return p

    def _emit(self, p: dict[str, Any]) -> None:
        if self.watch:
            self.state.observe_pod(copy.deepcopy(p))

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", name))
        if self.fail_get:
            raise BindError("ReadTimeoutError: read timed out")
        return copy.deepcopy(self.pods.get((namespace, name)))

    async def bind(self, namespace: str, name: str, uid: str, node_name: str,
                   annotations: dict[str, str] | None = None, timeout_s: float = 4.0) -> None:
        """One write, as pods/binding does: nodeName and the annotations together; 409 for a
        UID that does not match or a pod already bound, as the API server answers."""
        self.calls.append(("bind", name))
        await asyncio.sleep(self.delay)
        if self.fail_bind:
            raise BindError("HTTP 409: pod already bound", 409)
        if self.server_timeouts:
            self.server_timeouts -= 1
            raise BindError("HTTP 504: the server was unable to return a response in time", 504)
        p = self.pods[(namespace, name)]
        if p["metadata"]["uid"] != uid:
            raise BindError("HTTP 409: precondition failed: UID", 409)
        if p["spec"].get("nodeName"):
            raise BindError(f"HTTP 409: pod {name} is already assigned to node "
                            f"{p['spec']['nodeName']}", 409)
        p["spec"]["nodeName"] = node_name
        p["metadata"].setdefault("annotations", {}).update(annotations or {})
        if self.kubelet_admits:
            p.setdefault("status", {})["startTime"] = "2026-01-01T00:00:00Z"
        self._emit(p)
        if self.lose_answers:
            self.lose_answers -= 1
            raise BindError("ReadTimeoutError: read timed out (4.5 s)")

    def admit(self, name: str, namespace: str = "default") -> None:
        """The node's kubelet admitted the pod: it writes the pod's status."""
        p = self.pods[(namespace, name)]
        p.setdefault("status", {}).update(phase="Pending", startTime="2026-01-01T00:00:00Z")
        self._emit(p)


def make(nodes: list[dict[str, Any]], watch: bool = True) -> tuple[Extender, FakeApi]:
    state = ClusterState(CONFIG)
    state.replace_nodes(nodes)
    api = FakeApi(state, watch)
    return Extender(state, CONFIG, api, clock=lambda: NOW), api


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "NodeNames": names}


def bind_args(p: dict[str, Any], node_name: str) -> dict[str, Any]:
    meta = p["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node_name}


# --- filter ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["dra", "extender", None])
def test_filter_places_no_share_on_a_node_of_the_dra_pool(mode: str | None) -> None:
    """A node whose agent serves DRA only (--no-device-plugin) says egpu.io/allocation-mode:
    dra: its cards are booked by claims the extender cannot see, so it is unresolvable for the
    extender whatever its inventory says; "extender" (or no annotation: older agents) is as
    before."""
    n = node("pool", cards(2))
    if mode is not None:
        n["metadata"]["annotations"]["egpu.io/allocation-mode"] = mode
    ext, _ = make([n])
    result = ext.filter(args(pod(containers=[limits(memory=4000)]), ["pool"]))
    if mode == "dra":
        assert result["NodeNames"] == []
        reason = result["FailedAndUnresolvableNodes"]["pool"]
        assert "egpu.io/allocation-mode: dra" in reason and "device plugin" in reason, reason
    else:
        assert result["NodeNames"] == ["pool"], result


def test_filter_sorts_nodes_into_passed_failed_and_unresolvable() -> None:
    ext, api = make([node("a10", cards(2)), node("t4", cards(8, "Tesla T4", 15360)),
                     node("stale", cards(1), heartbeat=NOW - 600), node("cpu", None)])
    busy = api.add(pod("busy", containers=[limits(memory=23028)],
                       annotations={"egpu.io/use-gpu-type": "A10"}))
    ext.state.reserve(_booking(ext, busy, "a10"))
    p = pod(containers=[limits(memory=16000)])
    result = ext.filter(args(p, ["a10", "t4", "stale", "cpu", "ghost"]))
    assert result["NodeNames"] == ["a10"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"t4", "stale", "cpu", "ghost"}
    assert "16000 MiB asked > 15360 MiB bookable" in result["FailedAndUnresolvableNodes"]["t4"]
    assert "heartbeat" in result["FailedAndUnresolvableNodes"]["stale"]
    assert "egpu.io/inventory missing" in result["FailedAndUnresolvableNodes"]["cpu"]
    assert "no egpu inventory" in result["FailedAndUnresolvableNodes"]["ghost"]
    # fill the second A10 card: now a resolvable failure naming the cards
    other = api.add(pod("other", containers=[limits(memory=23028)]))
    ext.state.reserve(_booking(ext, other, "a10"))
    result = ext.filter(args(p, ["a10"]))
    assert result["NodeNames"] == [] and "0 MiB free, 16000 MiB asked" in result["FailedNodes"][
        "a10"]


def _booking(ext: Extender, p: dict[str, Any], node_name: str) -> Booking:
    """Fit ``p`` on ``node_name`` now: the booking a bind would reserve."""
    request = read_pod(p, CONFIG).request
    assert request is not None
    placed = fit(ext.state.node(node_name), PodDemand.from_request(request),
                 Limits.from_config(CONFIG), NOW)
    assert isinstance(placed, Placement)
    return Booking(p["metadata"]["uid"], "x", node_name, placed.allocation, placed.bookings)


def test_filter_reasons_carry_no_percent_sign() -> None:
    """kube-scheduler formats its FailedScheduling event with the reasons as the format
    string: a "%" there shows as "%!c(MISSING)" in `kubectl describe pod`."""
    ext, _ = make([node("t4", cards(1, "Tesla T4", 15360))])
    result = ext.filter(args(pod(containers=[limits(memory=24000, cores=50)]), ["t4"]))
    reason = result["FailedAndUnresolvableNodes"]["t4"]
    assert "%" not in reason and "50 percent cores" in reason, reason


def test_filter_passes_pods_without_egpu_resources() -> None:
    ext, _ = make([node("a", cards(1))])
    p = pod(containers=[{"nvidia.com/gpu": 1}])
    assert ext.filter(args(p, ["a", "b"]))["NodeNames"] == ["a", "b"]


def test_filter_fails_invalid_pods_everywhere_with_the_reason() -> None:
    ext, _ = make([node("a", cards(1))])
    p = pod(containers=[limits(cores=150)])
    result = ext.filter(args(p, ["a"]))
    assert result["NodeNames"] == []
    assert "egpu.io/gpu-cores='150'" in result["FailedAndUnresolvableNodes"]["a"]


def test_filter_with_whole_nodes_when_not_node_cache_capable() -> None:
    ext, _ = make([node("a", cards(1)), node("b", cards(1, "Tesla T4", 15360))])
    p = pod(containers=[limits(memory=16000)])
    nodes = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
    result = ext.filter({"Pod": p, "Nodes": nodes})
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["a"]
    assert "NodeNames" not in result


def test_prioritize_scores_by_node_policy() -> None:
    ext, api = make([node("full", cards(1, memory=10000)), node("empty", cards(1, memory=10000))])
    filler = api.add(pod("f", containers=[limits(memory=8000)]))
    ext.state.reserve(_booking(ext, filler, "full"))
    binpack = pod(containers=[limits(memory=1000)])
    spread = pod(containers=[limits(memory=1000)], annotations={"egpu.io/node-policy": "spread"})
    assert ext.prioritize(args(binpack, ["full", "empty"])) == [
        {"Host": "full", "Score": 9}, {"Host": "empty", "Score": 1}]
    assert ext.prioritize(args(spread, ["full", "empty"])) == [
        {"Host": "full", "Score": 1}, {"Host": "empty", "Score": 9}]


def test_prioritize_reuses_filter_placements() -> None:
    ext, _ = make([node("a", cards(2))])
    p = pod()
    ext.filter(args(p, ["a"]))
    (answers,) = [m for _, _, m in ext._cache.values()]
    cached = answers["a"]
    assert isinstance(cached, float)
    ext.prioritize(args(p, ["a"]))
    twin = pod(uid="twin")  # another replica of the same template
    ext.filter(args(twin, ["a"]))
    assert answers["a"] is cached and len(ext._cache) == 1
    ext.state.upsert_node(node("a", cards(3)))  # the node changed: computed again
    ext.filter(args(p, ["a"]))
    assert answers["a"] is not cached


# --- bind ----------------------------------------------------------------------------------

async def test_bind_writes_the_allocation_with_the_binding_in_one_call() -> None:
    ext, api = make([node("n", cards(2))])
    p = api.add(pod("p", containers=[limits(memory=4000, cores=10)]))
    assert await ext.bind(bind_args(p, "n")) == {"Error": ""}
    assert api.calls == [("bind", "p")]
    stored = api.pods[("default", "p")]
    allocation = Allocation.decode(stored["metadata"]["annotations"]["egpu.io/allocation"])
    assert allocation.node == "n" and allocation.containers[0].cards[0].memory_mib == 4000
    assert stored["spec"]["nodeName"] == "n"
    assert sum(u.memory_mib for u in ext.state.usage("n").values()) == 4000


async def test_non_egpu_pod_is_bound_without_annotation() -> None:
    ext, api = make([node("n", cards(1))])
    p = api.add(pod("plain", containers=[{}]))
    assert await ext.bind(bind_args(p, "n")) == {"Error": ""}
    stored = api.pods[("default", "plain")]
    assert stored["spec"]["nodeName"] == "n"
    assert "egpu.io/allocation" not in stored["metadata"]["annotations"]


@pytest.mark.parametrize("delay", [0.0, 0.01])
async def test_fc10_concurrent_binds_never_double_book(delay: float) -> None:
    """FC-10: the only free card has 24576 MiB; 3 pods of 12288 MiB bind at once: 2 win."""
    for _ in range(10):
        inv = cards(1, "NVIDIA L40", 24576)
        ext, api = make([node("n", inv)])
        api.delay = delay
        pods = [api.add(pod(f"p{i}", containers=[limits(memory=12288)])) for i in range(3)]
        # all three pass filter before any bind (what kube-scheduler does in a burst)
        assert all(ext.filter(args(p, ["n"]))["NodeNames"] == ["n"] for p in pods)
        results = await asyncio.gather(*(ext.bind(bind_args(p, "n")) for p in pods))
        assert sum(1 for r in results if not r["Error"]) == 2
        loser = next(r for r in results if r["Error"])
        assert "no longer fits" in loser["Error"] and "0 MiB free" in loser["Error"]
        assert ext.state.usage("n")[inv[0].uuid] == CardBooking(24576, 0, 2)


async def test_fc10_eight_cards_sixteen_pods_at_once() -> None:
    ext, api = make([node("n", cards(8, "NVIDIA H100 80GB HBM3", 81559))])
    api.delay = 0.001
    pods = [api.add(pod(f"p{i}", containers=[limits(memory=40000)])) for i in range(17)]
    results = await asyncio.gather(*(ext.bind(bind_args(p, "n")) for p in pods))
    assert sum(1 for r in results if not r["Error"]) == 16
    assert all(u == CardBooking(80000, 0, 2) for u in ext.state.usage("n").values())


async def test_filter_sees_binds_in_flight() -> None:
    ext, api = make([node("n", cards(1, memory=24576))])
    api.delay = 0.05
    a = api.add(pod("a", containers=[limits(memory=20000)]))
    b = api.add(pod("b", containers=[limits(memory=20000)]))
    task = asyncio.create_task(ext.bind(bind_args(a, "n")))
    await asyncio.sleep(0.01)  # a's Binding is in flight
    assert ext.filter(args(b, ["n"]))["NodeNames"] == []
    assert (await task)["Error"] == ""


async def test_failed_binding_drops_the_reservation_and_writes_nothing() -> None:
    ext, api = make([node("n", cards(1))])
    api.fail_bind = True
    p = api.add(pod("p", containers=[limits(memory=4000)]))
    result = await ext.bind(bind_args(p, "n"))
    assert "binding failed" in result["Error"]
    assert api.calls == [("bind", "p")]
    assert "egpu.io/allocation" not in api.pods[("default", "p")]["metadata"]["annotations"]
    assert ext.state.bookings() == {}
    assert all(u == CardBooking() for u in ext.state.usage("n").values())
    # the card is free again for the next pod
    api.fail_bind = False
    q = api.add(pod("q", containers=[limits(memory=23028)]))
    assert (await ext.bind(bind_args(q, "n")))["Error"] == ""


async def test_bind_refuses_a_node_that_no_longer_fits() -> None:
    ext, api = make([node("n", cards(1, memory=1000))])
    p = api.add(pod("p", containers=[limits(memory=2000)]))
    result = await ext.bind(bind_args(p, "n"))
    assert "no longer fits" in result["Error"] and api.calls == []


async def test_bind_of_an_unknown_pod() -> None:
    ext, _ = make([node("n", cards(1))])
    p = pod("ghost")
    assert "not found" in (await ext.bind(bind_args(p, "n")))["Error"]


async def test_reservation_survives_stale_watch_events() -> None:
    """A watch event from before the Binding (no annotation) must not release a fresh booking."""
    ext, api = make([node("n", cards(1, memory=24576))], watch=False)
    p = api.add(pod("p", containers=[limits(memory=20000)]))
    assert (await ext.bind(bind_args(p, "n")))["Error"] == ""
    ext.state.observe_pod(pod("p", uid=p["metadata"]["uid"], containers=[limits(memory=20000)]))
    assert sum(u.memory_mib for u in ext.state.usage("n").values()) == 20000
    # the watch catches up: the reservation is confirmed and replaced by the observed booking
    ext.state.observe_pod(copy.deepcopy(api.pods[("default", "p")]))
    assert ext.state._reserved == {}
    assert sum(u.memory_mib for u in ext.state.usage("n").values()) == 20000


async def test_a_pod_does_not_compete_with_its_own_earlier_booking() -> None:
    """A pod annotated but never bound (written by an older two-write extender, or by hand)."""
    ext, api = make([node("n", cards(1, memory=24576))])
    p = api.add(pod("p", containers=[limits(memory=20000)]))
    ext.state.reserve(_booking(ext, p, "n"))
    text = ext.state.booking(p["metadata"]["uid"]).allocation.encode()
    ext.state.unreserve(p["metadata"]["uid"])
    p["metadata"]["annotations"]["egpu.io/allocation"] = text  # unbound, annotated
    api.add(p)
    assert sum(u.memory_mib for u in ext.state.usage("n").values()) == 20000
    assert ext.filter(args(p, ["n"]))["NodeNames"] == ["n"]
    other = pod("o", containers=[limits(memory=20000)])
    assert ext.filter(args(other, ["n"]))["NodeNames"] == []
    assert (await ext.bind(bind_args(p, "n")))["Error"] == ""
    assert sum(u.memory_mib for u in ext.state.usage("n").values()) == 20000


# --- the cluster view -------------------------------------------------------------------------

def _annotated(name: str, ext: Extender, node_name: str, **kw: Any) -> dict[str, Any]:
    p = pod(name, containers=[limits(memory=5000)], node=node_name, **kw)
    booking = _booking(ext, p, node_name)
    p["metadata"]["annotations"]["egpu.io/allocation"] = booking.allocation.encode()
    return p


def test_restart_rebuilds_the_same_bookings_from_the_api() -> None:
    ext, _ = make([node("n", cards(2))])
    pods = [_annotated(f"p{i}", ext, "n") for i in range(3)]
    for p in pods:
        ext.state.observe_pod(p)
    before = ext.state.usage("n")
    again = ClusterState(CONFIG)
    again.replace_nodes([node("n", cards(2))])
    again.replace_pods(json.loads(json.dumps(pods)))
    assert again.usage("n") == before and sum(u.memory_mib for u in before.values()) == 15000


def test_deleted_pod_is_released_by_uid_even_without_annotations() -> None:
    ext, _ = make([node("n", cards(1))])
    p = _annotated("p", ext, "n")
    ext.state.observe_pod(p)
    ext.state.delete_pod(p["metadata"]["uid"])  # the DELETE event's object is not read
    assert ext.state.usage("n") == {"GPU-0": CardBooking()}


def test_terminating_pod_keeps_its_booking_finished_pod_releases() -> None:
    ext, _ = make([node("n", cards(1))])
    p = _annotated("p", ext, "n")
    ext.state.observe_pod(p)
    p["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    ext.state.observe_pod(p)
    assert ext.state.usage("n")["GPU-0"].memory_mib == 5000
    ext.state.observe_pod({**p, "status": {"phase": "Succeeded"}})
    assert ext.state.usage("n")["GPU-0"].memory_mib == 0


def test_relist_releases_pods_that_vanished() -> None:
    ext, _ = make([node("n", cards(1))])
    a, b = _annotated("a", ext, "n"), _annotated("b", ext, "n")
    ext.state.replace_pods([a, b])
    ext.state.replace_pods([a])
    assert ext.state.usage("n")["GPU-0"].memory_mib == 5000


def test_node_annotation_changes_are_seen() -> None:
    ext, _ = make([node("n", cards(1), heartbeat=NOW - 1000)])
    p = pod()
    assert ext.filter(args(p, ["n"]))["NodeNames"] == []
    ext.state.upsert_node(node("n", cards(1), heartbeat=NOW))
    assert ext.filter(args(p, ["n"]))["NodeNames"] == ["n"]
    ext.state.delete_node("n")
    assert ext.filter(args(p, ["n"]))["FailedAndUnresolvableNodes"]


# --- a node the extender cannot evaluate fails alone ---------------------------------------

def _absurd_node(name: str) -> dict[str, Any]:
    from egpu.records import Card
    return node(name, [Card("GPU-x", 0, "NVIDIA A10", 10**400)])


def test_a_node_whose_inventory_names_an_absurd_card_size_is_unresolvable_alone() -> None:
    """10**400 MiB overflowed the oversubscription bound's float product, and the exception
    failed the whole filter (HTTP 500) for every oversubscribing pod of the cluster."""
    ext, _ = make([node("good", cards(2)), _absurd_node("bad")])
    p = pod(containers=[limits(memory=1000)],
            annotations={"egpu.io/memory-oversubscription": "true"})
    result = ext.filter(args(p, ["good", "bad"]))
    assert result["NodeNames"] == ["good"]
    reason = result["FailedAndUnresolvableNodes"]["bad"]
    assert reason.startswith("egpu inventory unreadable: inventory.cards[0].memory_mib: "
                             "an integer of 401 digits out of range; allowed: 1.."), reason
    scores = ext.prioritize(args(p, ["good", "bad"]))  # answers, scoring the node 0
    assert {s["Host"]: s["Score"] for s in scores}["bad"] == 0


def test_a_node_whose_evaluation_raises_fails_that_node_alone_unresolvably_and_is_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An internal error is no reason preemption could remove: the node lands in
    FailedAndUnresolvableNodes. Bug caught: it was reported in FailedNodes, so
    kube-scheduler's DefaultPreemption could evict lower-priority pods of a node egpu can
    never place the pod on."""
    import scheduler.extender as extender_module
    real = extender_module.utilization_checker

    def broken(*a: Any, **kw: Any) -> Any:
        run = real(*a, **kw)

        def wrapped(view: Any) -> Any:
            if view.name == "bad":
                raise OverflowError("int too large to convert to float")
            return run(view)
        return wrapped

    monkeypatch.setattr(extender_module, "utilization_checker", broken)
    ext, _ = make([node("good", cards(1)), node("bad", cards(1))])
    p = pod(containers=[limits(memory=1000)])
    with caplog.at_level("ERROR", logger="egpu.scheduler"):
        result = ext.filter(args(p, ["good", "bad"]))
        scores = ext.prioritize(args(p, ["good", "bad"]))
    assert result["NodeNames"] == ["good"] and result["Error"] == ""
    assert "bad" not in result["FailedNodes"]
    reason = result["FailedAndUnresolvableNodes"]["bad"]
    assert "OverflowError" in reason and "int too large to convert to float" in reason
    assert {s["Host"]: s["Score"] for s in scores}["bad"] == 0
    logged = [r for r in caplog.records if "bad" in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback is in the log


async def test_bind_answers_an_error_when_fitting_the_node_raises(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import scheduler.extender as extender_module

    def broken(*a: Any, **kw: Any) -> Any:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(extender_module, "fit", broken)
    ext, api = make([node("n", cards(1))])
    p = api.add(pod(containers=[limits(memory=1000)]))
    with caplog.at_level("ERROR", logger="egpu.scheduler"):
        result = await ext.bind(bind_args(p, "n"))
    assert "OverflowError" in result["Error"] and "node n" in result["Error"]
    assert ext.state.reserved(p["metadata"]["uid"]) is None  # nothing booked
    assert not api.pods[("default", p["metadata"]["name"])]["spec"].get("nodeName")
    assert any(r.exc_info for r in caplog.records)
