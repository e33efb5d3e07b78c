"""A node's cards as resource.k8s.io/v1 ResourceSlices (egpu.dra.slices): the devices, their
consumable capacities, the slices of a pool, and the plan that brings the API server's slices
to the inventory (generation kept while nothing changes, bumped when something does)."""

from __future__ import annotations

import copy
import functools
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egpu.card_roster import NSLOTS
from egpu.config import Config
from egpu.contract import DRA_DRIVER
from egpu.dra import slices
from egpu.dra.slices import (
    CAPACITY_SHARES,
    MAX_DEVICES_PER_SLICE,
    MIB,
    SliceError,
    bytes_quantity,
    count_quantity,
    device_name,
    memory_capacity_mib,
    parse_quantity,
    same_content,
    shares_capacity,
    slice_name,
)
from egpu.records import Card

A100 = "NVIDIA A100-SXM4-40GB"
# The functions take sharesPerCard from their caller, who holds the config (no default):
# here the config's default, unless a test names its own.
SHARES = Config().shares_per_card
card_device = functools.partial(slices.card_device, shares_per_card=SHARES)
node_slices = functools.partial(slices.node_slices, shares_per_card=SHARES)
plan = functools.partial(slices.plan, shares_per_card=SHARES)


def card(index: int, memory_mib: int = 40960, healthy: bool = True, model: str = A100,
         uuid: str | None = None, numa_node: int = 0) -> Card:
    return Card(uuid=uuid or f"GPU-0000000{index}-aaaa-bbbb-cccc-0123456789AB", index=index,
                model=model, memory_mib=memory_mib, healthy=healthy, numa_node=numa_node)


def as_read(slices: list[Any], version: str = "7") -> list[dict[str, Any]]:
    """The slices as the API server returns them: with a resourceVersion and a uid."""
    out = []
    for body in copy.deepcopy(slices):
        body["metadata"]["resourceVersion"] = version
        body["metadata"]["uid"] = "slice-uid"
        out.append(body)
    return out


# --- devices -------------------------------------------------------------------------------

def test_each_healthy_card_is_one_shareable_device_with_the_inventory_attributes() -> None:
    device = card_device(card(3, numa_node=1))
    assert device["name"] == "gpu-00000003-aaaa-bbbb-cccc-0123456789ab"
    assert device["allowMultipleAllocations"] is True
    assert device["attributes"] == {
        "uuid": {"string": "GPU-00000003-aaaa-bbbb-cccc-0123456789AB"},
        "model": {"string": A100},
        "index": {"int": 3},
        "memoryMiB": {"int": 40960},
        "numaNode": {"int": 1},
        "healthy": {"bool": True},
    }


def test_memory_is_the_card_in_bytes_booked_in_mib_steps_whole_card_by_default() -> None:
    memory = card_device(card(0, memory_mib=81559))["capacity"]["memory"]
    assert memory == {"value": "81559Mi", "requestPolicy": {
        "default": "81559Mi", "validRange": {"min": "1Mi", "max": "81559Mi", "step": "1Mi"}}}
    assert parse_quantity(memory["value"]) == 81559 * MIB


def test_cores_are_100_percent_in_steps_of_one_none_booked_by_default() -> None:
    cores = card_device(card(0))["capacity"]["cores"]
    assert cores == {"value": "100", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}}


def allocate(device: dict[str, Any], requests: list[dict[str, str]]) -> int:
    """How many of ``requests`` (``capacity.requests`` of one share each, in order) the
    kube-scheduler's consumable-capacity check puts on ``device`` (KEP-5075: a capacity a
    request does not name books its ``requestPolicy.default``; an amount below
    ``validRange.min`` books min, one above ``max`` fits no device; the consumed sum of every
    capacity stays within its ``value``)."""
    used: dict[str, Decimal] = {}
    placed = 0
    for request in requests:
        booked: dict[str, Decimal] = {}
        fits = True
        for name, capacity in device["capacity"].items():
            policy = capacity.get("requestPolicy") or {}
            text = request.get(name, policy.get("default", capacity["value"]))
            amount = parse_quantity(text)
            assert amount is not None
            valid = policy.get("validRange") or {}
            if "min" in valid:
                amount = max(amount, parse_quantity(valid["min"]) or Decimal(0))
            if "max" in valid and amount > (parse_quantity(valid["max"]) or Decimal(0)):
                fits = False
            booked[name] = amount
            if used.get(name, Decimal(0)) + amount > (parse_quantity(capacity["value"])
                                                      or Decimal(0)):
                fits = False
        if fits:
            placed += 1
            for name, amount in booked.items():
                used[name] = used.get(name, Decimal(0)) + amount
    return placed


def test_a_card_takes_no_more_shares_than_its_roster_holds() -> None:
    """Bug caught: 40 claims of 1Gi and no cores all fitted one 80 GiB card (memory and cores
    bound nothing), while its roster holds 32 shares: replicas 33+ never started."""
    many_small = [{"memory": "1Gi"}] * 40
    device = card_device(card(0, memory_mib=81559), shares_per_card=len(many_small))
    assert allocate(device, many_small) == NSLOTS == 32


@pytest.mark.parametrize(("shares_per_card", "placed"), [(10, 10), (1, 1), (32, 32), (33, 32)])
def test_a_card_takes_as_many_shares_as_the_config_says_at_most_the_rosters(
        shares_per_card: int, placed: int) -> None:
    device = card_device(card(0, memory_mib=81559), shares_per_card=shares_per_card)
    assert allocate(device, [{"memory": "1Gi"}] * 40) == placed
    assert device["capacity"][CAPACITY_SHARES]["value"] == str(placed)


def test_shares_are_one_per_allocation_whatever_a_claim_names() -> None:
    shares = card_device(card(0), shares_per_card=Config().shares_per_card)["capacity"][
        CAPACITY_SHARES]
    assert CAPACITY_SHARES == "shares"
    assert shares == {"value": "10", "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": "1"}}}
    device = card_device(card(0), shares_per_card=4)
    assert allocate(device, [{"memory": "1Gi", "shares": "0"}] * 6) == 4  # 0 books 1 anyway
    assert allocate(device, [{"memory": "1Gi", "shares": "2"}]) == 0  # more than 1: no card


def test_a_policy_of_one_share_per_card_has_no_step_that_would_overrun_it() -> None:
    """v1 validation: min + step <= value; with a step of 1, sharesPerCard 1 would be refused
    by the API server (and every slice with it)."""
    valid = card_device(card(0), shares_per_card=1)["capacity"][CAPACITY_SHARES][
        "requestPolicy"]["validRange"]
    assert "step" not in valid and valid["min"] == valid["max"] == "1"


@pytest.mark.parametrize("call", [
    lambda: slices.shares_capacity(),  # type: ignore[call-arg]
    lambda: slices.card_device(card(0)),  # type: ignore[call-arg]
    lambda: slices.node_slices("n", [card(0)]),  # type: ignore[call-arg]
    lambda: slices.plan("n", [card(0)], []),  # type: ignore[call-arg]
    lambda: slices.sync(None, "n", [card(0)]),  # type: ignore[arg-type, call-arg]
])
def test_shares_per_card_has_no_default(call: Any) -> None:
    """Bug caught: the functions defaulted to the roster's 32 shares a card, so a caller
    without the config (the dev cluster, the scheduling bench) published 32 where a node agent
    on the default config publishes 10. The caller names the config's sharesPerCard."""
    with pytest.raises(TypeError, match="shares_per_card"):
        call()


@pytest.mark.parametrize("shares_per_card", [0, -1])
def test_shares_per_card_below_one_is_refused(shares_per_card: int) -> None:
    with pytest.raises(SliceError, match="shares per card"):
        shares_capacity(shares_per_card)
    with pytest.raises(SliceError, match="shares per card"):
        node_slices("n", [card(0)], shares_per_card=shares_per_card)


@pytest.mark.parametrize(("memory_mib", "ratio", "offered_mib"), [
    pytest.param(81559, 1.0, 81559, id="no-oversubscription"),
    pytest.param(81559, 1.5, 122338, id="ratio-rounds-down"),
    pytest.param(10, 1.3, 13, id="ratio-read-as-written-not-as-binary-float"),
    pytest.param(40960, 2, 81920, id="integer-ratio"),
])
def test_memory_ratio_offers_the_card_times_the_ratio(memory_mib: int, ratio: float,
                                                       offered_mib: int) -> None:
    assert memory_capacity_mib(card(0, memory_mib=memory_mib), ratio) == offered_mib
    memory = card_device(card(0, memory_mib=memory_mib), ratio)["capacity"]["memory"]
    assert parse_quantity(memory["value"]) == offered_mib * MIB
    assert memory["requestPolicy"]["validRange"]["max"] == memory["value"]
    assert card_device(card(0, memory_mib=memory_mib), ratio)["attributes"]["memoryMiB"] == {
        "int": memory_mib}


@pytest.mark.parametrize("ratio", [0.5, 0.999, -1.0, float("nan"), float("inf")])
def test_memory_ratio_below_one_or_not_finite_is_refused(ratio: float) -> None:
    with pytest.raises(SliceError, match="ratio"):
        card_device(card(0), ratio)


@pytest.mark.parametrize(("uuid", "why"), [
    pytest.param("GPU_0", "underscore", id="underscore"),
    pytest.param("GPU-" + "a" * 60, "too long for a DNS label", id="64-characters"),
    pytest.param("-GPU-0", "leading dash", id="leading-dash"),
    pytest.param("GPU-0.1", "dot", id="dot"),
])
def test_uuid_that_makes_no_dns_label_is_refused_naming_the_card(uuid: str, why: str) -> None:
    with pytest.raises(SliceError, match="DNS label") as info:
        device_name(card(2, uuid=uuid))
    assert uuid in str(info.value), why


def test_model_longer_than_an_attribute_may_be_is_refused() -> None:
    with pytest.raises(SliceError, match="model"):
        card_device(card(0, model="N" * 65))
    assert card_device(card(0, model="N" * 64))["attributes"]["model"] == {"string": "N" * 64}


@pytest.mark.parametrize("memory_mib", [1, 2**44])
def test_memory_that_makes_no_valid_range_is_refused(memory_mib: int) -> None:
    with pytest.raises(SliceError, match="memory"):
        card_device(card(0, memory_mib=memory_mib), 1.0 if memory_mib < 2 else 1000.0)


# --- quantities ----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (1, "1"), (1000, "1000"), (1024, "1Ki"), (MIB, "1Mi"), (1536 * MIB, "1536Mi"),
    (40960 * MIB, "40Gi"), (81559 * MIB, "81559Mi"), (2**60, "1Ei"),
])
def test_bytes_are_written_as_the_api_server_writes_them_back(value: int, text: str) -> None:
    assert bytes_quantity(value) == text


@pytest.mark.parametrize(("value", "text"), [(0, "0"), (30, "30"), (100, "100"), (2000, "2k")])
def test_counts_are_written_in_canonical_decimal_form(value: int, text: str) -> None:
    assert count_quantity(value) == text


@pytest.mark.parametrize(("text", "value"), [
    ("8Gi", Decimal(8 << 30)), ("24000Mi", Decimal(24000 * MIB)), ("30", Decimal(30)),
    ("100m", Decimal("0.1")), ("1.5Gi", Decimal(1536 * MIB)), ("1e3", Decimal(1000)),
    ("2k", Decimal(2000)), ("1E", Decimal(10**18)),
    ("", None), ("Gi", None), ("8 Gi", None), ("8GB", None), ("uuid", None),
])
def test_quantities_parse_to_their_value(text: str, value: Decimal | None) -> None:
    assert parse_quantity(text) == value


@given(st.integers(0, 2**62))
def test_written_bytes_parse_back_to_the_same_number(value: int) -> None:
    assert parse_quantity(bytes_quantity(value)) == value


# --- slices --------------------------------------------------------------------------------

def test_the_node_pool_holds_its_healthy_cards_by_index_owned_by_the_node() -> None:
    cards = [card(2), card(0), card(1, healthy=False)]
    [body] = node_slices("gpu-a100-a", cards, generation=4, node_uid="node-uid")
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    assert body["metadata"] == {"name": "gpu-a100-a-gpu.egpu.io-0", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-a100-a", "uid": "node-uid",
         "controller": True}]}
    spec = body["spec"]
    assert spec["driver"] == DRA_DRIVER == "gpu.egpu.io"
    assert spec["nodeName"] == "gpu-a100-a"
    assert spec["pool"] == {"name": "gpu-a100-a", "generation": 4, "resourceSliceCount": 1}
    assert [d["attributes"]["index"]["int"] for d in spec["devices"]] == [0, 2]


def test_unhealthy_cards_are_left_out() -> None:
    slices = node_slices("n", [card(0, healthy=False), card(1)])
    assert [d["attributes"]["uuid"]["string"] for d in slices[0]["spec"]["devices"]] == [
        card(1).uuid]


def test_a_node_without_healthy_cards_has_no_slice() -> None:
    assert node_slices("n", [card(0, healthy=False)]) == []
    assert node_slices("n", []) == []


def test_without_a_node_uid_the_slices_have_no_owner() -> None:
    assert "ownerReferences" not in node_slices("n", [card(0)])[0]["metadata"]


def test_more_cards_than_one_slice_holds_make_a_pool_of_several_slices() -> None:
    cards = [card(i, uuid=f"GPU-{i:04d}") for i in range(MAX_DEVICES_PER_SLICE + 3)]
    slices = node_slices("big", cards, generation=2)
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_DEVICES_PER_SLICE, 3]
    assert [s["metadata"]["name"] for s in slices] == ["big-gpu.egpu.io-0", "big-gpu.egpu.io-1"]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {2}
    small = node_slices("n", cards[:5], max_devices=2)
    assert [len(s["spec"]["devices"]) for s in small] == [2, 2, 1]


def test_a_node_name_too_long_for_the_slice_name_is_replaced_by_its_digest() -> None:
    node = "n" * 250
    name = slice_name(node, 0)
    assert len(name) <= 253 and name.startswith("gpu.egpu.io-") and name.endswith("-0")
    assert slice_name(node, 0) == name != slice_name("m" * 250, 0)


@pytest.mark.parametrize(("kwargs", "match"), [
    pytest.param({"node": ""}, "node name", id="empty-node"),
    pytest.param({"generation": 0}, "generation", id="generation-0"),
    pytest.param({"max_devices": 0}, "max_devices", id="max-devices-0"),
    pytest.param({"max_devices": 129}, "max_devices", id="max-devices-129"),
])
def test_bad_slice_arguments_are_refused(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"node": "n", "cards": [card(0)], **kwargs}
    with pytest.raises(SliceError, match=match):
        node_slices(**args)


def test_two_cards_with_one_device_name_are_refused() -> None:
    with pytest.raises(SliceError, match="twice"):
        node_slices("n", [card(0, uuid="GPU-ab"), card(1, uuid="GPU-AB")])


# --- the plan ------------------------------------------------------------------------------

def test_a_first_publication_creates_the_pool_at_generation_one() -> None:
    done = plan("n", [card(0), card(1)], [], node_uid="u")
    assert done.generation == 1 and done.changed
    assert done.create == tuple(node_slices("n", [card(0), card(1)], 1, node_uid="u"))
    assert not done.update and not done.delete


def test_the_same_cards_again_change_nothing() -> None:
    cards = [card(0), card(1)]
    read = as_read(node_slices("n", cards, 5, node_uid="u"))
    done = plan("n", cards, read, node_uid="u")
    assert not done.changed and done.generation == 5


def test_quantities_read_back_in_another_form_are_the_same() -> None:
    cards = [card(0, memory_mib=40960)]
    read = as_read(node_slices("n", cards, 3))
    read[0]["spec"]["devices"][0]["capacity"]["memory"]["value"] = "40960Mi"
    read[0]["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"]["default"] = "0m"
    assert not plan("n", cards, read).changed


def test_fields_the_api_server_adds_are_not_a_change() -> None:
    cards = [card(0)]
    written = node_slices("n", cards, 2)
    read = as_read(written)
    read[0]["spec"]["devices"][0]["bindsToNode"] = False
    read[0]["spec"]["perDeviceNodeSelection"] = False
    assert same_content(read[0]["spec"], written[0]["spec"])
    assert not plan("n", cards, read).changed


def test_a_card_turning_unhealthy_updates_the_pool_at_the_next_generation() -> None:
    before = [card(0), card(1)]
    read = as_read(node_slices("n", before, 5, node_uid="u"), version="42")
    after = [card(0), card(1, healthy=False)]
    done = plan("n", after, read, node_uid="u")
    assert done.generation == 6 and not done.create and not done.delete
    [body] = done.update
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["spec"]["pool"]["generation"] == 6
    assert [d["attributes"]["index"]["int"] for d in body["spec"]["devices"]] == [0]


def test_a_new_card_updates_the_pool_at_the_next_generation() -> None:
    read = as_read(node_slices("n", [card(0)], 1))
    done = plan("n", [card(0), card(1)], read)
    assert done.generation == 2 and len(done.update[0]["spec"]["devices"]) == 2


def test_a_changed_ratio_is_a_change() -> None:
    read = as_read(node_slices("n", [card(0)], 1))
    done = plan("n", [card(0)], read, memory_ratio=1.5)
    assert done.generation == 2
    assert done.update[0]["spec"]["devices"][0]["capacity"]["memory"]["value"] == "60Gi"


def test_a_changed_shares_per_card_is_a_change() -> None:
    read = as_read(node_slices("n", [card(0)], 1, shares_per_card=10))
    assert not plan("n", [card(0)], read, shares_per_card=10).changed
    done = plan("n", [card(0)], read, shares_per_card=4)
    assert done.generation == 2
    assert done.update[0]["spec"]["devices"][0]["capacity"][CAPACITY_SHARES]["value"] == "4"


def test_slices_published_without_shares_are_updated_to_bound_the_card() -> None:
    """An agent of the version before the shares capacity published memory and cores alone:
    the next publication adds shares (a new generation), else the card stays unbounded."""
    read = as_read(node_slices("n", [card(0)], 3))
    for device in read[0]["spec"]["devices"]:
        del device["capacity"][CAPACITY_SHARES]
    done = plan("n", [card(0)], read, shares_per_card=10)
    assert done.generation == 4
    assert done.update[0]["spec"]["devices"][0]["capacity"][CAPACITY_SHARES]["value"] == "10"


def test_slices_of_the_node_that_are_not_wanted_are_deleted() -> None:
    stale = as_read(node_slices("n", [card(0)], 3))
    stale[0]["metadata"]["name"] = "n-gpu.egpu.io-abcde"  # e.g. written by another version
    done = plan("n", [card(0)], stale)
    assert done.delete == ("n-gpu.egpu.io-abcde",)
    assert [s["metadata"]["name"] for s in done.create] == ["n-gpu.egpu.io-0"]
    assert done.generation == 4 and done.create[0]["spec"]["pool"]["generation"] == 4


def test_no_healthy_card_left_deletes_the_pool() -> None:
    read = as_read(node_slices("n", [card(0)], 3))
    done = plan("n", [card(0, healthy=False)], read)
    assert done.delete == ("n-gpu.egpu.io-0",) and not done.create and not done.update
    assert not plan("n", [card(0, healthy=False)], []).changed


def test_a_shrinking_pool_deletes_its_last_slices_and_recounts() -> None:
    cards = [card(i, uuid=f"GPU-{i:04d}") for i in range(5)]
    read = as_read(node_slices("n", cards, 1, max_devices=2))
    done = plan("n", cards[:2], read, max_devices=2)
    assert done.delete == ("n-gpu.egpu.io-1", "n-gpu.egpu.io-2")
    assert done.update[0]["spec"]["pool"] == {"name": "n", "generation": 2,
                                              "resourceSliceCount": 1}


def test_slices_at_mixed_generations_are_brought_to_one_newer_generation() -> None:
    cards = [card(i, uuid=f"GPU-{i:04d}") for i in range(3)]
    read = as_read(node_slices("n", cards, 4, max_devices=2))
    read[1]["spec"]["pool"]["generation"] = 3  # a writer stopped half way
    done = plan("n", cards, read, max_devices=2)
    assert done.generation == 5
    assert {s["spec"]["pool"]["generation"] for s in done.update} == {5}
    assert len(done.update) == 2


def test_a_new_node_uid_rewrites_the_owner_without_a_new_generation() -> None:
    read = as_read(node_slices("n", [card(0)], 2, node_uid="old"))
    done = plan("n", [card(0)], read, node_uid="new")
    assert done.generation == 2
    [body] = done.update
    assert body["metadata"]["ownerReferences"][0]["uid"] == "new"
    assert body["spec"]["pool"]["generation"] == 2
