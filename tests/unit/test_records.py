"""Records round-trip and reject malformed input with a message naming the field."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egpu.records import (
    Allocation,
    Card,
    CardShare,
    ConfigCard,
    ContainerAllocation,
    ContainerConfig,
    Inventory,
    RecordError,
)

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


def test_allocation_rejects_duplicate_cards_and_bad_cores() -> None:
    dup = {"version": 1, "containers": [{"name": "c", "init": False, "cards": [
        {"uuid": "a", "index": 0, "memory_mib": 1, "cores": 0},
        {"uuid": "a", "index": 0, "memory_mib": 1, "cores": 0}]}]}
    with pytest.raises(RecordError, match="appears twice"):
        Allocation.decode(json.dumps(dup))
    dup["containers"][0]["cards"] = [{"uuid": "a", "index": 0, "memory_mib": 1, "cores": 101}]
    with pytest.raises(RecordError, match=r"cores: 101 out of range"):
        Allocation.decode(json.dumps(dup))
