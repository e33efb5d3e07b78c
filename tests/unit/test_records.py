"""Records round-trip and reject malformed input with a message naming the field."""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egpu.records import (
    CONTAINER_KINDS,
    KIND_APP,
    KIND_INIT,
    KIND_SIDECAR,
    Allocation,
    Card,
    CardShare,
    ConfigCard,
    ContainerAllocation,
    ContainerConfig,
    Inventory,
    RecordError,
)

ROOT = Path(__file__).resolve().parents[2]
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
cards = st.builds(Card, uuid=names, index=st.integers(0, 64), model=names,
                  memory_mib=st.integers(1, 2**40), healthy=st.booleans(),
                  numa_node=st.integers(-1, 8))
shares = st.builds(CardShare, uuid=names, index=st.integers(0, 64),
                   memory_mib=st.integers(1, 2**40), cores=st.integers(0, 100))


@given(st.lists(cards, max_size=8, unique_by=lambda c: c.uuid))
def test_inventory_round_trips(card_list: list[Card]) -> None:
    inventory = Inventory(tuple(card_list))
    assert Inventory.decode(inventory.encode()) == inventory


@given(st.lists(st.builds(ContainerAllocation, name=names, init=st.booleans(),
                          cards=st.lists(shares, min_size=1, max_size=4,
                                         unique_by=lambda s: s.uuid).map(tuple)),
                max_size=4), names)
def test_allocation_round_trips(containers: list[ContainerAllocation], node: str) -> None:
    allocation = Allocation(tuple(containers), node)
    assert Allocation.decode(allocation.encode()) == allocation


@given(st.builds(ContainerConfig, namespace=names, pod=names, pod_uid=names, container=names,
                 priority=st.sampled_from(["high", "low"]),
                 compute_policy=st.sampled_from(["strict", "elastic"]),
                 memory_oversubscription=st.booleans(), container_region=names,
                 cards=st.lists(st.builds(ConfigCard, uuid=names, memory_mib=st.integers(1, 10**7),
                                          cores=st.integers(0, 100), card_region=names),
                                max_size=3).map(tuple)))
def test_container_config_round_trips(config: ContainerConfig) -> None:
    assert ContainerConfig.decode(config.encode()) == config


@given(st.one_of(st.binary(max_size=64), st.text(max_size=64),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                              lambda inner: st.lists(inner, max_size=3)
                              | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                              max_leaves=12).map(json.dumps)))
def test_decoders_raise_only_record_error(blob: str | bytes) -> None:
    for decoder in (Inventory.decode, Allocation.decode, ContainerConfig.decode):
        with contextlib.suppress(RecordError):
            decoder(blob)


@pytest.mark.parametrize(("text", "fragment"), [
    ('{"version": 2, "cards": []}', "inventory.version: 2"),
    ('{"version": 1}', "inventory.cards: missing"),
    ('{"version": 1, "cards": [{"uuid": "a", "index": 0, "model": "m", "memory_mib": 0}]}',
     "inventory.cards[0].memory_mib: 0"),
    ('{"version": 1, "cards": [{"uuid": "a", "index": 0, "model": "m", "memory_mib": true}]}',
     "memory_mib: True is not an integer"),
    ('[1]', "expected a JSON object"),
])
def test_inventory_errors_name_the_field(text: str, fragment: str) -> None:
    with pytest.raises(RecordError, match=None) as info:
        Inventory.decode(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(("memory", "shown"), [
    (2**40 + 1, "1099511627777"),
    (10**400, "an integer of 401 digits"),
], ids=["one-past-the-bound", "401-digits"])
def test_an_inventory_card_larger_than_any_share_is_refused_naming_the_bound(
        memory: int, shown: str) -> None:
    """A card's size is bounded (placement multiplies it by float ratios: 10**400 MiB would
    overflow there); the message names the field, the value (briefly) and what is allowed."""
    text = json.dumps({"version": 1, "cards": [
        {"uuid": "a", "index": 0, "model": "m", "memory_mib": 1024},
        {"uuid": "b", "index": 1, "model": "m", "memory_mib": memory}]})
    with pytest.raises(RecordError) as info:
        Inventory.decode(text)
    assert str(info.value) == (f"inventory.cards[1].memory_mib: {shown} out of range; "
                               "allowed: 1..1099511627776")
    biggest = text.replace(str(memory), str(2**40))
    assert Inventory.decode(biggest).cards[1].memory_mib == 2**40


def test_allocation_rejects_duplicate_cards_and_bad_cores() -> None:
    dup = {"version": 1, "containers": [{"name": "c", "init": False, "cards": [
        {"uuid": "a", "index": 0, "memory_mib": 1, "cores": 0},
        {"uuid": "a", "index": 0, "memory_mib": 1, "cores": 0}]}]}
    with pytest.raises(RecordError, match="appears twice"):
        Allocation.decode(json.dumps(dup))
    dup["containers"][0]["cards"] = [{"uuid": "a", "index": 0, "memory_mib": 1, "cores": 101}]
    with pytest.raises(RecordError, match=r"cores: 101 out of range"):
        Allocation.decode(json.dumps(dup))


# --- the allocation record carries what placement decided (issue 16) -------------------------
policies = st.tuples(st.sampled_from(["high", "low"]), st.sampled_from(["strict", "elastic"]),
                     st.booleans())
placed_containers = st.builds(
    lambda name, kind, cards: ContainerAllocation(name, kind != KIND_APP, cards, kind),
    names, st.sampled_from(CONTAINER_KINDS),
    st.lists(shares, min_size=1, max_size=4, unique_by=lambda s: s.uuid).map(tuple))


@given(st.lists(placed_containers, max_size=4), names, policies)
def test_a_placed_allocation_round_trips_with_kinds_and_policies(
        containers: list[ContainerAllocation], node: str,
        resolved: tuple[str, str, bool]) -> None:
    allocation = Allocation(tuple(containers), node, *resolved)
    decoded = Allocation.decode(allocation.encode())
    assert decoded == allocation and decoded.complete and decoded.policies == resolved
    assert [c.kind for c in decoded.containers] == [c.kind for c in containers]


OLD_RECORD = ('{"version":1,"node":"n1","containers":[{"name":"warm","init":true,"cards":'
              '[{"uuid":"GPU-a","index":0,"memory_mib":12000,"cores":100}]},{"name":"app",'
              '"init":false,"cards":[{"uuid":"GPU-a","index":0,"memory_mib":8000,"cores":20}]}]}')


def test_a_record_of_an_older_extender_reads_without_the_facts_and_encodes_as_it_was() -> None:
    """An agent upgraded under running pods reads their annotations (no kinds, no policies):
    the fields read as None, ``complete`` is False (readers fall back on the pod spec), and
    the record is written back byte for byte."""
    allocation = Allocation.decode(OLD_RECORD)
    assert [(c.name, c.init, c.kind) for c in allocation.containers] == [
        ("warm", True, None), ("app", False, None)]
    assert allocation.policies is None and not allocation.complete
    assert (allocation.priority, allocation.compute_policy,
            allocation.memory_oversubscription) == (None, None, None)
    assert allocation.encode() == OLD_RECORD
    partial = json.loads(OLD_RECORD)
    partial.update(priority="high", compute_policy="strict", memory_oversubscription=False)
    half = Allocation.decode(json.dumps(partial))  # policies, but kinds missing
    assert half.policies == ("high", "strict", False) and not half.complete


def test_the_new_record_s_text() -> None:
    allocation = Allocation((ContainerAllocation("side", True, (CardShare("GPU-a", 0, 1, 0),),
                                                 KIND_SIDECAR),), "n1", "low", "elastic", True)
    assert allocation.encode() == (
        '{"version":1,"node":"n1","priority":"low","compute_policy":"elastic",'
        '"memory_oversubscription":true,"containers":[{"name":"side","kind":"sidecar",'
        '"init":true,"cards":[{"uuid":"GPU-a","index":0,"memory_mib":1,"cores":0}]}]}')


def test_the_record_s_kinds_are_the_requests_kinds() -> None:
    from egpu.requests import ContainerKind

    assert CONTAINER_KINDS == (KIND_APP, KIND_INIT, KIND_SIDECAR) == (
        ContainerKind.APP.value, ContainerKind.INIT.value, ContainerKind.SIDECAR.value)


@pytest.mark.parametrize(("change", "fragment"), [
    ({"priority": "urgent"}, "allocation.priority: 'urgent'; allowed: high, low"),
    ({"compute_policy": 3}, "allocation.compute_policy: 3 is not a str"),
    ({"memory_oversubscription": "yes"}, "allocation.memory_oversubscription: 'yes' is not"),
    ({"kind": "app"}, "allocation.containers[0].kind: 'app'; allowed: container, init, sidecar"),
    ({"kind": "sidecar"}, "allocation.containers[0].init: False does not match kind"),
    ({"kind": None}, "allocation.containers[0].kind: None is not a str"),
])
def test_the_new_fields_are_checked_naming_the_field(change: dict[str, Any],
                                                    fragment: str) -> None:
    body = json.loads(Allocation((ContainerAllocation("c", False, (CardShare("a", 0, 1, 0),),
                                                      KIND_APP),), "n", "high", "strict",
                                 False).encode())
    if "kind" in change:
        body["containers"][0].update(change)
    else:
        body.update(change)
    with pytest.raises(RecordError) as info:
        Allocation.decode(json.dumps(body))
    assert fragment in str(info.value)


def test_records_are_immutable_values() -> None:
    share = CardShare("GPU-a", 0, 1024, 10)
    entry = ContainerAllocation("c", False, (share,))
    assert entry == ContainerAllocation("c", False, (CardShare("GPU-a", 0, 1024, 10),))
    assert entry != ContainerAllocation("c", False, (share,), KIND_APP)
    assert hash(entry) == hash(copy.deepcopy(entry)) and pickle.loads(pickle.dumps(entry)) == entry
    assert {entry: 1}[copy.copy(entry)] == 1
    assert entry.replace(kind=KIND_APP).kind == KIND_APP and entry.kind is None
    assert repr(share) == "CardShare(uuid='GPU-a', index=0, memory_mib=1024, cores=10)"
    with pytest.raises(AttributeError, match="immutable"):
        share.cores = 100
    with pytest.raises(TypeError, match="no field 'nope'"):
        share.replace(nope=1)
    assert share != ConfigCard("GPU-a", 1024, 10, "")  # another record type


def test_the_container_config_text_is_indented_json_with_version_first() -> None:
    """The file libinterpose parses (src/config.c): its layout, key for key."""
    config = ContainerConfig("ns", "p", "u", "c", "high", "strict", False, "/r",
                             (ConfigCard("GPU-a", 1024, 10, "/c/GPU-a"),), 5)
    assert config.encode() == json.dumps({
        "version": 1, "namespace": "ns", "pod": "p", "pod_uid": "u", "container": "c",
        "priority": "high", "compute_policy": "strict", "memory_oversubscription": False,
        "container_region": "/r", "cards": [{"uuid": "GPU-a", "memory_mib": 1024, "cores": 10,
                                              "card_region": "/c/GPU-a"}],
        "low_priority_floor": 5}, indent=1)


def test_the_records_module_is_light_to_import() -> None:
    """egpu.records is on the runtime hook's path: importing it loads json and egpu.contract,
    never dataclasses, typing or the node records (those load on first use)."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import egpu.records as r; "
            "heavy = {'dataclasses', 'typing', 'inspect', "
            "'egpu.node_records', 'egpu.requests', 'egpu.config'} & set(sys.modules); "
            "print(sorted(heavy)); import dataclasses; "
            "print(dataclasses.replace(r.Card('u', 0, 'm', 1), healthy=False).healthy)")
    out = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["[]", "False"]
