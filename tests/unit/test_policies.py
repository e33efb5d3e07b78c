"""The policy enums (egpu.policies) are the contract's strings: the same values in the same
order as egpu.contract's tuples, equal to and hashed as their strings, written as the strings
in JSON, and what the config and the request reader hand out."""

from __future__ import annotations

import json

import pytest

from egpu.config import Config, load_config
from egpu.contract import ALLOCATION_MODES, COMPUTE_POLICIES, PLACEMENT_POLICIES, PRIORITIES
from egpu.policies import AllocationMode, Choice, ComputePolicy, PlacementPolicy, Priority
from egpu.records import Allocation
from egpu.requests import read_pod

PAIRS: list[tuple[type[Choice], tuple[str, ...]]] = [
    (Priority, PRIORITIES), (ComputePolicy, COMPUTE_POLICIES),
    (PlacementPolicy, PLACEMENT_POLICIES), (AllocationMode, ALLOCATION_MODES)]


@pytest.mark.parametrize(("kind", "wire"), PAIRS, ids=lambda p: getattr(p, "__name__", ""))
def test_each_enum_is_the_contracts_tuple(kind: type[Choice], wire: tuple[str, ...]) -> None:
    assert tuple(kind) == wire
    for member, text in zip(kind, wire, strict=True):
        assert member == text and str(member) == text and f"{member}" == text
        assert hash(member) == hash(text) and {text: 1}[member] == 1
        assert json.dumps({"v": member}) == json.dumps({"v": text})
        assert kind.of(text) is member and kind(text) is member
    for other in ("", "HIGH", None, 1, ["high"], "spread ", "urgent"):
        assert kind.of(other) is None


def test_the_config_reads_enums_and_names_the_key_in_strings() -> None:
    config = load_config("defaults: {priority: low, computePolicy: elastic, gpuPolicy: spread}\n"
                         "priorityClasses: {batch: low}\nallocationMode: dra\n"
                         "namespaceAllocationModes: {old: extender}\n")
    assert config.defaults.priority is Priority.LOW
    assert config.defaults.compute_policy is ComputePolicy.ELASTIC
    assert config.defaults.gpu_policy is PlacementPolicy.SPREAD
    assert config.defaults.node_policy is PlacementPolicy.BINPACK
    assert config.priority_classes == {"batch": Priority.LOW}
    assert config.allocation_mode is AllocationMode.DRA
    assert config.allocation_mode_for("old") is AllocationMode.EXTENDER
    assert config.allocation_mode_for("new") is AllocationMode.DRA
    assert Config().allocation_mode_for("x", "dra") is AllocationMode.DRA


def test_a_request_carries_enums_and_its_record_the_strings() -> None:
    pod = {"metadata": {"annotations": {"egpu.io/priority": "low",
                                        "egpu.io/node-policy": "spread",
                                        "egpu.io/allocation-mode": "extender"}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"egpu.io/gpu": 1}}}]}}
    request = read_pod(pod).request
    assert request is not None
    assert request.priority is Priority.LOW and request.compute_policy is ComputePolicy.STRICT
    assert request.node_policy is PlacementPolicy.SPREAD
    assert request.gpu_policy is PlacementPolicy.BINPACK
    assert request.allocation_mode is AllocationMode.EXTENDER
    del pod["metadata"]["annotations"]["egpu.io/allocation-mode"]
    assert read_pod(pod).request.allocation_mode is None  # type: ignore[union-attr]
    record = Allocation((), "n", request.priority, request.compute_policy, False)
    text = record.encode()
    assert '"priority":"low","compute_policy":"strict"' in text
    assert Allocation.decode(text) == record  # the decoder's strings equal the members
