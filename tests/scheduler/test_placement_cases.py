"""The placement cases of placement_cases.yaml (its header says the format), run against
scheduler/placement: ``fit`` (bind's full search) must answer what each case expects, and
``check`` (filter's and prioritize's fast path) must agree with it, refusal words included.

The file is the port's yardstick too (docs/scheduler.md, "The placement inside
kube-scheduler"): the Go plugin runs the same cases, so a rule changed on one side only fails
one of the two. A key the format does not know fails its case, so that a misspelt expectation
cannot pass by checking nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu.booking import CardBooking
from egpu.config import Config
from egpu.contract import (
    ANN_GPU_POLICY,
    ANN_MEMORY_OVERSUBSCRIPTION,
    ANN_NOUSE_GPU_TYPE,
    ANN_NOUSE_GPU_UUID,
    ANN_USE_GPU_TYPE,
    ANN_USE_GPU_UUID,
)
from egpu.requests import read_pod
from scheduler.placement import (
    CardState,
    Fits,
    Limits,
    NodeState,
    Placement,
    PodDemand,
    Unfit,
    check,
    fit,
)
from tests.scheduler.helpers import NOW

CASES_FILE = Path(__file__).with_name("placement_cases.yaml")
DOC: dict[str, Any] = yaml.safe_load(CASES_FILE.read_text())
DEFAULTS: dict[str, Any] = DOC["defaults"]
CASE_KEYS = {"name", "why", "limits", "config", "node", "pod", "expect"}
NODE_KEYS = {"heartbeat_age_s", "problem", "cards"}
CARD_KEYS = {"uuid", "index", "model", "memory_mib", "healthy", "booked_mib", "booked_cores",
             "used_slots"}
POD_KEYS = {"annotations", "initContainers", "containers"}
CONTAINER_KEYS = {"name", "limits", "restartPolicy"}
EXPECT_KEYS = {"placed", "bookings", "shares", "inits", "unfit"}
UNFIT_KEYS = {"is", "says", "unresolvable"}
# the pod annotations placement reads: a misspelt one (read_pod ignores what it does not
# know) would leave its case checking the default
ANNOTATIONS = {ANN_GPU_POLICY, ANN_MEMORY_OVERSUBSCRIPTION, ANN_USE_GPU_TYPE,
               ANN_NOUSE_GPU_TYPE, ANN_USE_GPU_UUID, ANN_NOUSE_GPU_UUID}


def _known(where: str, got: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(got) - allowed)
    assert not unknown, f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}"


def node_state(case: dict[str, Any]) -> NodeState:
    """The case's node: its cards (defaults.card under each) and heartbeat."""
    node = case["node"]
    _known("node", node, NODE_KEYS)
    age = node.get("heartbeat_age_s", 0)
    cards = []
    for i, given in enumerate(node["cards"]):
        _known(f"node.cards[{i}]", given, CARD_KEYS)
        c = {**DEFAULTS["card"], **given}
        cards.append(CardState(c.get("uuid", f"GPU-{i}"), c.get("index", i), c["model"],
                               c["memory_mib"], c.get("healthy", True), c.get("booked_mib", 0),
                               c.get("booked_cores", 0), c.get("used_slots", 0)))
    return NodeState("n", tuple(cards), None if age == "never" else NOW - age,
                     node.get("problem", ""))


def pod_object(case: dict[str, Any]) -> dict[str, Any]:
    """The case's pod as the API server would hand it over (egpu-scheduler, one namespace)."""
    given = {**DEFAULTS["pod"], **case.get("pod", {})}
    _known("pod", given, POD_KEYS)
    _known("pod.annotations", given.get("annotations", {}), ANNOTATIONS)

    def container(c: dict[str, Any]) -> dict[str, Any]:
        _known(f"container {c.get('name')}", c, CONTAINER_KEYS)
        out = {"name": c["name"], "image": "x", "resources": {"limits": c.get("limits", {})}}
        if "restartPolicy" in c:
            out["restartPolicy"] = c["restartPolicy"]
        return out

    spec: dict[str, Any] = {"schedulerName": "egpu-scheduler",
                            "containers": [container(c) for c in given["containers"]]}
    if given.get("initContainers"):
        spec["initContainers"] = [container(c) for c in given["initContainers"]]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-p",
                         "annotations": given.get("annotations", {})},
            "spec": spec, "status": {"phase": "Pending"}}


def demand_and_limits(case: dict[str, Any]) -> tuple[PodDemand, Limits]:
    config = Config()
    if "config" in case:
        config = Config(defaults=replace(config.defaults, **case["config"]))
    reading = read_pod(pod_object(case), config)
    assert reading.request is not None, reading.errors
    return (PodDemand.from_request(reading.request),
            Limits(**{**DEFAULTS["limits"], **case.get("limits", {})}))


def expect_placed(result: Placement | Unfit, expect: dict[str, Any]) -> None:
    assert isinstance(result, Placement), f"refused, expected placed: {result}"
    containers = result.allocation.containers
    assert {c.name: list(c.uuids) for c in containers} == expect["placed"]
    if "shares" in expect:
        assert {c.name: [[s.uuid, s.memory_mib, s.cores] for s in c.cards]
                for c in containers if c.name in expect["shares"]} == expect["shares"]
    if "inits" in expect:
        assert [c.name for c in containers if c.init] == expect["inits"]
    if "bookings" in expect:
        assert all(len(a) == 3 for a in expect["bookings"].values()), \
            "bookings: card UUID -> [MiB, cores %, slots]"
        assert result.bookings == {uuid: CardBooking(*amounts)
                                   for uuid, amounts in expect["bookings"].items()}


def expect_unfit(result: Placement | Unfit, expect: dict[str, Any]) -> None:
    want = expect["unfit"]
    _known("expect.unfit", want, UNFIT_KEYS)
    says = want.get("says", [])
    assert ("is" in want or says) and isinstance(says, list) and all(
        isinstance(t, str) and t for t in says), "expect.unfit: is, or says (texts)"
    assert isinstance(result, Unfit), f"placed, expected refused: {result.allocation}"
    if "is" in want:
        assert result.reason == want["is"]
    for text in says:
        assert text in result.reason, f"{text!r} not in {result.reason!r}"
    if "unresolvable" in expect["unfit"]:
        assert result.unresolvable is expect["unfit"]["unresolvable"], result


@pytest.mark.parametrize("case", DOC["cases"], ids=[c["name"] for c in DOC["cases"]])
def test_placement_answers_each_case_as_written(case: dict[str, Any]) -> None:
    _known("case", case, CASE_KEYS)
    expect = case["expect"]
    _known("expect", expect, EXPECT_KEYS)
    assert ("placed" in expect) != ("unfit" in expect), "expect: placed or unfit, one of them"
    node = node_state(case)
    demand, limits = demand_and_limits(case)
    result = fit(node, demand, limits, NOW)
    if "placed" in expect:
        expect_placed(result, expect)
    else:
        assert not {"bookings", "shares", "inits"} & set(expect), "they go with placed"
        expect_unfit(result, expect)
    fast = check(node, demand, limits, NOW)  # filter's answer: the same, in the same words
    if isinstance(result, Placement):
        assert fast == Fits(node.name, result.utilization)
    else:
        assert fast == result


def test_case_names_are_unique() -> None:
    names = [c["name"] for c in DOC["cases"]]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
