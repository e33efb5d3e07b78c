"""The extender's ``egpu.io/allocation`` record carries what placement decided (issue 16):
each container's kind and the pod's resolved policies, so that the node agent, the exporter
and ``kubectl egpu`` never read the pod spec again for them."""

from __future__ import annotations

import logging

import pytest

from egpu.records import Allocation
from tests.scheduler.helpers import cards, limits, node, pod
from tests.scheduler.test_extender import bind_args, make


async def test_the_bound_record_carries_kinds_and_resolved_policies(
        caplog: pytest.LogCaptureFixture) -> None:
    ext, api = make([node("n", cards(2))])
    p = api.add(pod("p", containers=[limits(memory=3000, cores=10)],
                    inits=[limits(memory=4000, cores=30)],
                    sidecars=[limits(memory=2000, cores=5)],
                    annotations={"egpu.io/priority": "low", "egpu.io/compute-policy": "elastic",
                                 "egpu.io/memory-oversubscription": "true"}))
    with caplog.at_level(logging.WARNING):
        assert await ext.bind(bind_args(p, "n")) == {"Error": ""}
    stored = api.pods[("default", "p")]
    record = Allocation.decode(stored["metadata"]["annotations"]["egpu.io/allocation"])
    assert record.complete and record.policies == ("low", "elastic", True)
    assert [(c.name, c.kind, c.init) for c in record.containers] == [
        ("init0", "init", True), ("side0", "sidecar", True), ("c0", "container", False)]
    # the watch saw exactly the reserved record: confirmed, nothing "edited in"
    assert ext.state._reserved == {} and not caplog.records, caplog.text
    assert ext.state.booking(p["metadata"]["uid"]).allocation == record


async def test_the_webhook_s_priority_label_is_the_resolved_priority() -> None:
    """The label egpu.io/priority (the webhook's resolution) wins over the pod's annotation,
    as the node agent resolved it before the record carried it; an invalid one does not."""
    ext, api = make([node("n", cards(2))])
    labelled = pod("a", containers=[limits(memory=1000)], annotations={"egpu.io/priority": "low"})
    labelled["metadata"]["labels"] = {"egpu.io/priority": "high"}
    bogus = pod("b", containers=[limits(memory=1000)], annotations={"egpu.io/priority": "low"})
    bogus["metadata"]["labels"] = {"egpu.io/priority": "urgent"}
    for p in (labelled, bogus):
        api.add(p)
        assert await ext.bind(bind_args(p, "n")) == {"Error": ""}
    priorities = [Allocation.decode(api.pods[("default", n)]["metadata"]["annotations"][
        "egpu.io/allocation"]).priority for n in ("a", "b")]
    assert priorities == ["high", "low"]
