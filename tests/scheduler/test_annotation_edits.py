"""F2: an ``egpu.io/allocation`` annotation edited (or hand-written) after binding books nothing
more and releases nothing in the cluster view (``scheduler.state.ClusterState``, what ``kubectl
egpu advise`` reads a cluster into). The shipped scheduler's own guard is the
ValidatingAdmissionPolicy that denies such edits (tests/e2e/test_scheduler_e2e.py, F2) and the
webhook's refusal of a hand-written record (tests/webhook/test_webhook_review.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from egpu.config import Config
from egpu.requests import read_pod
from scheduler.placement import Limits, Placement, PodDemand, Unfit, fit
from scheduler.state import Booking, ClusterState

from .helpers import NOW, cards, limits, node, pod

CFG = Config()
LIMITS = Limits(shares_per_card=CFG.shares_per_card, memory_ratio=1.0, cores_ratio=1.0,
                heartbeat_timeout_s=120)


def _fit(state: ClusterState, p: dict[str, Any]) -> Placement | Unfit:
    """``p`` placed on node n1 beside what the view books."""
    reading = read_pod(p, CFG)
    assert reading.request is not None, reading.errors
    view = state.node("n1")
    assert view is not None
    return fit(view, PodDemand.from_request(reading.request), LIMITS, NOW)


def _fits(state: ClusterState, p: dict[str, Any]) -> bool:
    return isinstance(_fit(state, p), Placement)


def _bind(memory: int = 20000) -> tuple[ClusterState, dict[str, Any], str]:
    """A 24576 MiB card with pod A (``memory`` MiB) placed and reserved, as a bind in flight,
    before the watch has seen it bound (``a`` unbound as created; ``text``: the record the
    Binding wrote)."""
    state = ClusterState(CFG)
    state.upsert_node(node("n1", cards(1, memory=24576)))
    a = pod("a", containers=[limits(memory=memory)], uid="uid-A")
    state.observe_pod(a)
    got = _fit(state, a)
    assert isinstance(got, Placement), got
    # the whole record the plugin's Binding writes (kube-scheduler/plugin/record.go): each
    # container's kind and the pod's resolved policies, not the older record without them
    request = read_pod(a, CFG).request
    assert request is not None
    kinds = {c.name: c.kind.value for c in request.containers}
    record = got.allocation.replace(
        containers=tuple(c.replace(kind=kinds[c.name]) for c in got.allocation.containers),
        priority=request.priority, compute_policy=request.compute_policy,
        memory_oversubscription=request.memory_oversubscription)
    state.reserve(Booking("uid-A", "default/a", "n1", record, got.bookings))
    state.bind_done("uid-A")  # the Binding was written; the watch has not shown it yet
    return state, a, record.encode()


def _bound(memory: int = 20000) -> tuple[ClusterState, dict[str, Any], str]:
    """``_bind``, then the watch's sight of A bound and Running with its record."""
    state, a, text = _bind(memory)
    a["spec"]["nodeName"] = "n1"
    a["metadata"]["annotations"]["egpu.io/allocation"] = text
    a["status"]["phase"] = "Running"
    state.observe_pod(a)
    return state, a, text


def _edited(a: dict[str, Any], text: str | None) -> dict[str, Any]:
    out = json.loads(json.dumps(a))
    if text is None:
        del out["metadata"]["annotations"]["egpu.io/allocation"]
    else:
        out["metadata"]["annotations"]["egpu.io/allocation"] = text
    return out


def _shrunk(text: str) -> str:
    data = json.loads(text)
    data["containers"][0]["cards"][0]["memory_mib"] = 1
    return json.dumps(data)


@pytest.mark.parametrize("edit", ["shrunk", "removed", "garbage"])
def test_an_edited_annotation_neither_shrinks_nor_releases_the_booking(
        edit: str, caplog: pytest.LogCaptureFixture) -> None:
    state, a, text = _bound()
    before = state.usage("n1")
    new = {"shrunk": _shrunk(text), "removed": None, "garbage": "{not json"}[edit]
    with caplog.at_level(logging.WARNING, logger="egpu.scheduler"):
        state.observe_pod(_edited(a, new))
        state.observe_pod(_edited(a, new))  # logged once
    assert state.usage("n1") == before
    assert state.booking("uid-A").allocation.encode() == text  # type: ignore[union-attr]
    warnings = [r.getMessage() for r in caplog.records if "uid-A" in r.getMessage()]
    assert len(warnings) == 1 and "default/a" in warnings[0] and "ignored" in warnings[0]
    b = pod("b", containers=[limits(memory=20000)], uid="uid-B")
    state.observe_pod(b)
    assert not _fits(state, b)  # no overbooking
    # finishing or deleting still releases it
    state.observe_pod({**_edited(a, new), "status": {"phase": "Succeeded"}})
    assert state.booking("uid-A") is None


def test_an_edit_racing_the_watch_after_the_bind_is_ignored_too() -> None:
    """The watch's first sight of the bound pod already shows an edited annotation: the
    bind's own reservation says what the pod books."""
    state, a, text = _bind()
    a["spec"]["nodeName"] = "n1"
    state.observe_pod(_edited(a, _shrunk(text)))
    assert state.booking("uid-A").allocation.encode() == text  # type: ignore[union-attr]
    state.expire_reservations(max_age_s=-1)  # even once the reservation is gone
    assert state.booking("uid-A").allocation.encode() == text  # type: ignore[union-attr]
    assert sum(u.memory_mib for u in state.usage("n1").values()) == 20000


def test_a_pod_without_egpu_resources_books_nothing_whatever_it_carries() -> None:
    state = ClusterState(CFG)
    state.upsert_node(node("n1", cards(2, memory=24576)))
    fake = json.dumps({"version": 1, "node": "n1", "containers": [{"name": "c0", "init": False,
                       "cards": [{"uuid": "GPU-0", "index": 0, "memory_mib": 10**9,
                                  "cores": 100}]}]})
    squatter = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "squatter", "namespace": "other", "uid": "uid-S",
                             "annotations": {"egpu.io/allocation": fake}},
                "spec": {"schedulerName": "nonexistent",
                         "containers": [{"name": "c0", "image": "busybox"}]},
                "status": {"phase": "Pending"}}
    state.observe_pod(squatter)
    assert state.booking("uid-S") is None and state.bookings() == {}
    c = pod("c", containers=[limits(memory=1000)], uid="uid-C")
    assert _fits(state, c)


# A tenant may still edit the pod-level egpu annotations of its running pod (only
# egpu.io/allocation is guarded): the pod then no longer reads as a valid request, but it is an
# egpu pod with the scheduler's record, which the node agent and kubectl egpu honour.
INVALID_POLICY_EDITS = [
    ("egpu.io/gpu-policy", "fullest"),
    ("egpu.io/node-policy", "nearest"),
    ("egpu.io/compute-policy", "greedy"),
    ("egpu.io/memory-oversubscription", "maybe"),
    ("egpu.io/use-gpu-type", "A10,,"),
]


def _annotated(a: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    out = json.loads(json.dumps(a))
    out["metadata"]["annotations"][key] = value
    return out


@pytest.mark.parametrize(("key", "value"), INVALID_POLICY_EDITS)
def test_a_fresh_view_still_books_a_running_pod_whose_policy_annotation_became_invalid(
        key: str, value: str) -> None:
    _, a, text = _bound()
    edited = _annotated(a, key, value)
    fresh = ClusterState(CFG)  # a view read from the cluster afresh
    fresh.replace_nodes([node("n1", cards(1, memory=24576))])
    fresh.replace_pods([edited])
    booking = fresh.booking("uid-A")
    assert booking is not None and booking.allocation.encode() == text
    assert fresh.usage("n1")["GPU-0"].memory_mib == 20000
    b = pod("b", containers=[limits(memory=20000)], uid="uid-B")
    fresh.observe_pod(b)
    assert not _fits(fresh, b)


@pytest.mark.parametrize(("key", "value"), INVALID_POLICY_EDITS)
def test_a_live_view_keeps_the_booking_of_a_pod_whose_policy_annotation_became_invalid(
        key: str, value: str, caplog: pytest.LogCaptureFixture) -> None:
    state, a, text = _bound()
    before = state.usage("n1")
    with caplog.at_level(logging.WARNING, logger="egpu.scheduler"):
        state.observe_pod(_annotated(a, key, value))  # the watch's MODIFIED event
    assert state.usage("n1") == before
    assert state.booking("uid-A").allocation.encode() == text  # type: ignore[union-attr]
    # the allocation record is intact: nothing may blame it
    assert not [r for r in caplog.records if "unreadable" in r.getMessage()]
    b = pod("b", containers=[limits(memory=20000)], uid="uid-B")
    state.observe_pod(b)
    assert not _fits(state, b)


def test_a_bound_pod_first_seen_with_an_invalid_policy_annotation_confirms_its_bind() -> None:
    """The watch's first sight of the bound pod already carries an invalid annotation: it
    confirms the bind's reservation, so the booking outlives the reservation's expiry."""
    state, a, text = _bind()
    a["spec"]["nodeName"] = "n1"
    a["metadata"]["annotations"].update({"egpu.io/allocation": text,
                                         "egpu.io/gpu-policy": "fullest"})
    state.observe_pod(a)
    assert state.reserved("uid-A") is None  # confirmed by the watch
    state.expire_reservations(max_age_s=-1)
    assert sum(u.memory_mib for u in state.usage("n1").values()) == 20000


def test_an_older_record_of_a_pod_with_invalid_annotations_books_every_container_summed() -> None:
    """Without a valid request to tell init containers from app containers, an older
    scheduler's record (no kinds) books the sum of its containers: never less than the rule."""
    record = json.dumps({"version": 1, "node": "n1", "containers": [
        {"name": "init0", "init": True,
         "cards": [{"uuid": "GPU-0", "index": 0, "memory_mib": 6000, "cores": 50}]},
        {"name": "c0", "init": False,
         "cards": [{"uuid": "GPU-0", "index": 0, "memory_mib": 4000, "cores": 30}]}]})
    p = pod("a", containers=[limits(memory=4000, cores=30)],
            inits=[limits(memory=6000, cores=50)], node="n1", allocation=record,
            annotations={"egpu.io/gpu-policy": "fullest"}, uid="uid-A", phase="Running")
    state = ClusterState(CFG)
    state.replace_nodes([node("n1", cards(1, memory=24576))])
    state.replace_pods([p])
    usage = state.usage("n1")["GPU-0"]
    assert (usage.memory_mib, usage.cores, usage.slots) == (10000, 80, 2)


def test_an_unreadable_allocation_edit_is_logged_with_what_is_unreadable(
        caplog: pytest.LogCaptureFixture) -> None:
    state, a, _ = _bound()
    with caplog.at_level(logging.WARNING, logger="egpu.scheduler"):
        state.observe_pod(_edited(a, '{"version": 1, "containers": 7}'))
    warnings = [r.getMessage() for r in caplog.records if "uid-A" in r.getMessage()]
    assert len(warnings) == 1
    # the decoder's reason, naming the field
    assert "egpu.io/allocation is unreadable: allocation.containers" in warnings[0]
