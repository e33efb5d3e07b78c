"""The extender's bind when kube-scheduler binds a pod again, and when a Binding's outcome is
unclear (scheduler/extender.py, "bind").

kube-scheduler gives up on an extender bind after its httpTimeout (10 s) and schedules the pod
again, perhaps to another node, while the first bind may still land; and a Binding POST can be
written by the API server while its answer is lost (a client timeout). Bugs these catch: a
retry that replaced the first bind's reservation, so the pod ran on node A's card while the
extender booked it on node B for its whole life (A's card then taken twice); a Binding written
but answered with a timeout that freed its card, so the next pod took the same memory; a
bind that could outlast kube-scheduler's timeout.
"""

from __future__ import annotations

import asyncio
import copy
import re
import time
from pathlib import Path

import pytest

from scheduler import extender as extender_module
from scheduler.extender import BIND_BUDGET_S, BIND_CLIENT_SLACK_S, BIND_POST_MAX_S
from tests.scheduler.helpers import cards, limits, node, pod
from tests.scheduler.test_extender import FakeApi, args, bind_args, make

REPO = Path(__file__).resolve().parents[2]


def two_nodes() -> tuple[extender_module.Extender, FakeApi]:
    """Nodes A and B of one 4000 MiB card each; the watch's events come only when a test
    delivers them (``deliver``), as they come after a Binding's answer in a cluster."""
    return make([node("A", cards(1, memory=4000)), node("B", cards(1, memory=4000))],
                watch=False)


def deliver(api: FakeApi, *pods: dict) -> None:
    for p in pods:
        api.state.observe_pod(copy.deepcopy(p))


def used(ext: extender_module.Extender, name: str) -> int:
    booked = ext.state.usage(name).get("GPU-0")
    return booked.memory_mib if booked is not None else 0


async def test_a_bind_retried_while_the_first_is_in_flight_is_refused_and_moves_nothing(
        ) -> None:
    ext, api = two_nodes()
    api.delay = 0.2
    p = api.add(pod("p", containers=[limits(memory=3000)]))
    first = asyncio.ensure_future(ext.bind(bind_args(p, "A")))
    await asyncio.sleep(0.05)  # kube-scheduler gave up on the first and binds again, to B
    second = await ext.bind(bind_args(p, "B"))
    assert "still in progress" in second["Error"] and "node A" in second["Error"], second
    assert (await first)["Error"] == ""
    deliver(api, p)
    assert p["spec"]["nodeName"] == "A"
    assert ext.state.booking(p["metadata"]["uid"]).node == "A"  # type: ignore[union-attr]
    assert (used(ext, "A"), used(ext, "B")) == (3000, 0)
    q = api.add(pod("q", containers=[limits(memory=3000)]))
    assert ext.filter(args(q, ["A", "B"]))["NodeNames"] == ["B"]
    assert api.calls.count(("bind", "p")) == 1


async def test_a_bind_retried_after_the_first_landed_is_refused_as_already_bound() -> None:
    ext, api = two_nodes()
    p = api.add(pod("p", containers=[limits(memory=3000)]))
    assert (await ext.bind(bind_args(p, "A")))["Error"] == ""
    retry = await ext.bind(bind_args(p, "B"))  # before the watch brought the first's write
    assert "already bound to node A" in retry["Error"], retry
    deliver(api, p)
    assert (used(ext, "A"), used(ext, "B")) == (3000, 0)
    assert api.calls.count(("bind", "p")) == 1


async def test_a_binding_written_whose_answer_was_lost_keeps_its_card_booked() -> None:
    ext, api = two_nodes()
    api.lose_answers = 1
    p = api.add(pod("p", containers=[limits(memory=3000)]))
    q = api.add(pod("q", containers=[limits(memory=3000)]))
    # the pod read back is bound to A: the bind succeeded, whatever its answer said
    assert (await ext.bind(bind_args(p, "A")))["Error"] == ""
    assert used(ext, "A") == 3000
    refused = await ext.bind(bind_args(q, "A"))
    assert "no longer fits" in refused["Error"], refused
    deliver(api, p, q)
    assert used(ext, "A") == 3000 and "nodeName" not in q["spec"]


async def test_a_binding_the_server_timed_out_before_writing_frees_its_card() -> None:
    ext, api = two_nodes()
    api.server_timeouts = 1
    p = api.add(pod("p", containers=[limits(memory=3000)]))
    result = await ext.bind(bind_args(p, "A"))
    assert "binding failed" in result["Error"] and "504" in result["Error"], result
    assert ("get", "p") in api.calls  # the pod was read back, not guessed
    assert ext.state.booking(p["metadata"]["uid"]) is None and used(ext, "A") == 0
    assert (await ext.bind(bind_args(p, "A")))["Error"] == ""  # kube-scheduler's retry
    assert used(ext, "A") == 3000


async def test_an_unclear_binding_whose_pod_cannot_be_read_keeps_its_card_until_settled(
        ) -> None:
    ext, api = two_nodes()
    api.server_timeouts, api.fail_get = 1, True
    p = api.add(pod("p", containers=[limits(memory=3000)]))
    result = await ext.bind(bind_args(p, "A"))
    assert "unknown" in result["Error"], result
    assert used(ext, "A") == 3000  # it may have been written: nobody else takes the card
    q = api.add(pod("q", containers=[limits(memory=3000)]))
    assert "no longer fits" in (await ext.bind(bind_args(q, "A")))["Error"]
    api.fail_get = False
    # kube-scheduler's retry reads the pod: not bound, so the old reservation goes and the
    # retry books the card once
    assert (await ext.bind(bind_args(p, "A")))["Error"] == ""
    deliver(api, p)
    assert used(ext, "A") == 3000 and p["spec"]["nodeName"] == "A"


async def test_a_bind_held_at_the_gate_ends_within_the_bind_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's own wait (8 s) is longer than this budget: the budget ends it, leaving the
    POST its minimum."""
    monkeypatch.setattr(extender_module, "BIND_BUDGET_S", 0.6)
    monkeypatch.setattr(extender_module, "BIND_POST_MIN_S", 0.2)
    monkeypatch.setattr(extender_module, "BIND_CLIENT_SLACK_S", 0.1)
    ext, api = make([node("n", cards(2, memory=2000))])
    api.kubelet_admits = False
    assert (await ext.bind(bind_args(api.add(pod("a", containers=[limits(memory=2000)])),
                                     "n")))["Error"] == ""
    started = time.monotonic()
    result = await ext.bind(bind_args(api.add(pod("b", containers=[limits(memory=2000)])), "n"))
    took = time.monotonic() - started
    assert "awaiting admission" in result["Error"], result
    assert 0.25 <= took < 0.6, took  # 0.6 - 0.2 - 0.1 = 0.3 s at the gate, not 8 s


async def test_the_binding_post_is_given_what_the_budget_leaves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    timeouts: list[float] = []
    ext, api = make([node("n", cards(1, memory=4000))])
    bind = api.bind

    async def recording(*a: object, timeout_s: float = 0.0, **kw: object) -> None:
        timeouts.append(timeout_s)
        await bind(*a, timeout_s=timeout_s, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "bind", recording)
    assert (await ext.bind(bind_args(api.add(pod("p", containers=[limits(memory=100)])),
                                     "n")))["Error"] == ""
    assert timeouts == [BIND_POST_MAX_S]  # a bind that did not wait: the POST's own bound
    monkeypatch.setattr(extender_module, "BIND_BUDGET_S", 2.0)
    assert (await ext.bind(bind_args(api.add(pod("q", containers=[limits(memory=100)])),
                                     "n")))["Error"] == ""
    assert 1.0 < timeouts[1] <= 2.0 - BIND_CLIENT_SLACK_S  # what the budget leaves


def test_every_extender_config_waits_longer_for_a_bind_than_a_bind_can_take() -> None:
    """kube-scheduler must never give up on a bind the extender may still make: its extender
    httpTimeout is above the whole bind's budget (gate, POST and the client's slack), in the
    dev cluster's config (the one that still runs the extender). What egpu installs calls no
    extender: egpu-kube-scheduler's plugin binds (kube-scheduler/plugin, bindTimeout)."""
    from devcluster.cluster import scheduler_config

    found = re.findall(r"httpTimeout: (\d+)s",
                       scheduler_config("/k", extender_url="http://127.0.0.1:1"))
    assert found and all(int(s) > BIND_BUDGET_S for s in found), found
    for installed in ("manifests/scheduler/kube-scheduler-config.yaml",
                      "charts/egpu/templates/scheduler/config.yaml"):
        assert "extenders:" not in (REPO / installed).read_text(), installed
