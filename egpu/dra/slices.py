"""A node's cards as ResourceSlices of the DRA driver ``gpu.egpu.io`` (resource.k8s.io/v1).

Spec followed: the Kubernetes v1.37 API ``resource.k8s.io/v1`` ResourceSlice, with consumable
capacity (KEP-5075, feature gate ``DRAConsumableCapacity``: beta and on by default since 1.36):
a device with ``allowMultipleAllocations: true`` can be allocated to many requests, and the
scheduler books each request's ``capacity.requests`` (recorded in the claim's
``status.allocation.devices.results[].consumedCapacity``) so that the sum never exceeds the
device's ``capacity.<name>.value``. Field names checked against the live v1.37.2 apiserver
(``kubectl explain resourceslice.spec.devices --api-version=resource.k8s.io/v1``).

Each healthy card of the node's inventory (``egpu.records.Card``) is one device::

    name: the card's UUID in lower case (GPU-5f3c... -> gpu-5f3c...): a DNS label that stays
          with the card when NVML renumbers the cards (an index would not)
    allowMultipleAllocations: true                     (many shares per card)
    attributes:                                        (egpu.contract DRA_ATTR_*)
      uuid {string}, model {string}, index {int}, memoryMiB {int, MiB},
      numaNode {int, -1 unknown}, healthy {bool}
    capacity:
      memory: value   = card MiB x memory ratio, in bytes (Quantity "81559Mi")
              requestPolicy: default = value (a request that names no memory takes the whole
                             card's memory, as `egpu.io/gpu` alone does: CONTRACT.md section 1),
                             validRange {min 1Mi, max value, step 1Mi}
      cores:  value   = 100 (% of the card's compute)
              requestPolicy: default 0 (no cores named: nothing booked, section 1),
                             validRange {min 0, max 100, step 1}
      shares: value   = min(sharesPerCard of the config, card_roster.NSLOTS): how many
                        allocations the card takes (egpu's addition to CONTRACT.md section 5)
              requestPolicy: default 1, validRange {min 1, max 1} (no step: valid for a
                             value of 1): every allocation result books exactly one

``shares`` bounds what memory and cores do not: a claim of 1Gi and no cores books little of
either, so without it the scheduler would put 40 such claims on one 80 GiB card, while the
card's roster (``egpu.card_roster``, one entry per accounting folder the runtime hook
registers) holds 32: the 33rd container fails to start and its claim keeps its capacity. The
extender path bounds a card by ``sharesPerCard`` the same way (scheduler.placement.rule). No
claim names it (requests naming no amount book the default); a request naming more than 1
fits no card.

A request rounds up to the next step (8000.5Mi books 8001Mi); one above ``max`` does not fit
the card. The memory ratio is 1 unless the node oversubscribes memory (``memory_ratio`` > 1):
then every share on that node may be booked past the card's physical memory.

Unhealthy cards are left out. The pool is named after the node; its slices are named
``<node>-gpu.egpu.io-<i>``, at most 128 devices each (the v1 limit; 64 applies only to devices
with taints or counters, which egpu does not publish), and are owned by the Node when its UID
is known (the garbage collector deletes them with the node). ``plan`` compares the slices in
the API server with these and says what to create, update and delete, and the pool
generation: unchanged while the devices are, the highest seen + 1 when they change.
``sync`` runs a plan through a ``SliceStore`` (the caller's API client).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Protocol, Required, TypedDict

from kubernetes.utils.quantity import parse_quantity as _k8s_parse_quantity

from egpu.card_roster import NSLOTS
from egpu.contract import (
    DRA_ATTR_HEALTHY,
    DRA_ATTR_INDEX,
    DRA_ATTR_MEMORY_MIB,
    DRA_ATTR_MODEL,
    DRA_ATTR_NUMA_NODE,
    DRA_ATTR_UUID,
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DRIVER,
)
from egpu.records import Card

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
MIB = 1 << 20  # bytes
MEMORY_STEP_MIB = 1  # MiB: the smallest memory a share books, and the rounding step
CORES_TOTAL = 100  # %: one card's compute
# egpu's own capacity beside CONTRACT.md section 5's memory and cores: how many allocation
# results a card takes, each booking exactly one (module docstring)
CAPACITY_SHARES = "shares"
MAX_DEVICES_PER_SLICE = 128  # resource.k8s.io/v1: at most 128 devices in one ResourceSlice
MAX_ATTRIBUTE_STRING = 64  # characters: the longest string attribute value v1 accepts
MAX_OBJECT_NAME = 253  # characters: a DNS subdomain (metadata.name)
MAX_QUANTITY = 2**63 - 1  # the largest value a Quantity holds (bytes here)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class SliceError(ValueError):
    """The inventory cannot be published as it is; the message names the card and the field."""


# --- the wire format (resource.k8s.io/v1, the fields egpu writes) ---------------------------

class CapacityRequestPolicyRange(TypedDict, total=False):
    """``validRange``: requests below min round up to it, above max do not fit; Quantities."""

    min: Required[str]
    max: str
    step: str


class CapacityRequestPolicy(TypedDict, total=False):
    """``requestPolicy``: what a request that names no amount books, and what it may name."""

    default: str
    validRange: CapacityRequestPolicyRange


class DeviceCapacity(TypedDict, total=False):
    """One capacity of a device: its total ``value`` (Quantity) and how it is requested."""

    value: Required[str]
    requestPolicy: CapacityRequestPolicy


class DeviceAttribute(TypedDict, total=False):
    """One attribute value: exactly one of its fields is set."""

    string: str
    int: int
    bool: bool


class Device(TypedDict):
    """``spec.devices[]``: one card."""

    name: str
    allowMultipleAllocations: bool
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]


class ResourcePool(TypedDict):
    """``spec.pool``: the node's pool; every slice of one generation names the same count."""

    name: str
    generation: int
    resourceSliceCount: int


class ResourceSliceSpec(TypedDict):
    """``spec``: node-local devices of one driver (``nodeName`` set, not allNodes/selector)."""

    driver: str
    nodeName: str
    pool: ResourcePool
    devices: list[Device]


class OwnerReference(TypedDict):
    """``metadata.ownerReferences[]``: the Node, so that its deletion deletes the slices."""

    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class SliceMeta(TypedDict, total=False):
    """``metadata``: the name, the owner, and on updates the resourceVersion read."""

    name: Required[str]
    ownerReferences: list[OwnerReference]
    resourceVersion: str


class ResourceSlice(TypedDict):
    """A ResourceSlice body as sent to the API server."""

    apiVersion: str
    kind: str
    metadata: SliceMeta
    spec: ResourceSliceSpec


# --- quantities -------------------------------------------------------------------------------

_BINARY = (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20),
           ("Ki", 1 << 10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6),
            ("k", 10**3))
def bytes_quantity(value: int) -> str:
    """``value`` bytes (>= 0) as the API server writes it back: the largest binary suffix that
    keeps it whole (``85520809984`` -> ``"81559Mi"``, ``42949672960`` -> ``"40Gi"``), so that
    a slice read back compares equal to the one written."""
    for suffix, unit in _BINARY:
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def count_quantity(value: int) -> str:
    """A whole number (>= 0) in canonical decimal form: ``30`` -> ``"30"``, ``2000`` -> ``"2k"``."""
    for suffix, unit in _DECIMAL:
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def parse_quantity(text: str) -> Decimal | None:
    """The value of a Kubernetes Quantity (``"8Gi"`` -> 8589934592, ``"100m"`` -> 0.1), by the
    kubernetes client's decoder; None when ``text`` is not one."""
    if not isinstance(text, str) or any(c.isspace() for c in text):
        return None  # the client's decoder lets "8 Gi" through; the API server does not
    try:
        return Decimal(_k8s_parse_quantity(text))
    except (ValueError, InvalidOperation):
        return None


# --- devices ----------------------------------------------------------------------------------

def device_name(card: Card) -> str:
    """The device name of ``card``: its UUID in lower case (``GPU-5f3c...`` -> ``gpu-5f3c...``).

    Raises SliceError when that is not a DNS label (a-z, 0-9 and '-', at most 63 characters)."""
    name = card.uuid.lower()
    if not _DNS_LABEL.fullmatch(name):
        raise SliceError(
            f"card {card.index}: uuid {card.uuid!r} does not make a device name; a DRA device "
            "name is a DNS label (a-z, 0-9, '-', at most 63 characters)")
    return name


def memory_capacity_mib(card: Card, memory_ratio: float = 1.0) -> int:
    """The memory a card offers to shares, MiB: ``floor(card.memory_mib x memory_ratio)``, the
    ratio taken as the decimal it is written as (1.3 x 10 MiB = 13 MiB, not 12).

    Raises SliceError when the ratio is below 1 or not a finite number."""
    try:
        ratio = Fraction(repr(float(memory_ratio)))
    except (ValueError, OverflowError):
        raise SliceError(f"memory ratio {memory_ratio!r} is not a number") from None
    if ratio < 1:
        raise SliceError(f"memory ratio {memory_ratio!r} is below 1; allowed: >= 1")
    return int(card.memory_mib * ratio)


def shares_capacity(shares_per_card: int) -> int:
    """How many allocations a card takes: ``shares_per_card`` (the config's
    ``sharesPerCard``), at most the roster's ``NSLOTS``. Raises SliceError below 1."""
    if isinstance(shares_per_card, bool) or not isinstance(shares_per_card, int) \
            or shares_per_card < 1:
        raise SliceError(f"shares per card {shares_per_card!r}; allowed: a whole number >= 1")
    return min(shares_per_card, NSLOTS)


def card_device(card: Card, memory_ratio: float = 1.0, *, shares_per_card: int) -> Device:
    """One card as a v1 ``Device`` (module docstring): attributes as the inventory, capacity
    ``memory`` (bytes, 1 MiB steps, up to the card's MiB x ``memory_ratio``), ``cores``
    (0..100 %, step 1) and ``shares`` (``shares_capacity(shares_per_card)``, one per
    allocation).

    Raises SliceError for a UUID that is no DNS label, a UUID or model longer than 64
    characters (the v1 limit of a string attribute), a ratio below 1, memory that makes no
    range: below 2 MiB (v1 wants min + step <= value) or above 2^63 - 1 bytes, or shares per
    card below 1."""
    for field, value in ((DRA_ATTR_UUID, card.uuid), (DRA_ATTR_MODEL, card.model)):
        if len(value) > MAX_ATTRIBUTE_STRING:
            raise SliceError(f"card {card.uuid}: {field} {value!r} is longer than "
                             f"{MAX_ATTRIBUTE_STRING} characters (the v1 attribute limit)")
    memory_mib = memory_capacity_mib(card, memory_ratio)
    if not 2 * MEMORY_STEP_MIB <= memory_mib <= MAX_QUANTITY // MIB:
        raise SliceError(f"card {card.uuid}: memory {memory_mib} MiB; allowed: "
                         f"{2 * MEMORY_STEP_MIB}..{MAX_QUANTITY // MIB} MiB")
    memory = bytes_quantity(memory_mib * MIB)
    shares = shares_capacity(shares_per_card)
    return {
        "name": device_name(card),
        "allowMultipleAllocations": True,
        "attributes": {
            DRA_ATTR_UUID: {"string": card.uuid},
            DRA_ATTR_MODEL: {"string": card.model},
            DRA_ATTR_INDEX: {"int": card.index},
            DRA_ATTR_MEMORY_MIB: {"int": card.memory_mib},
            DRA_ATTR_NUMA_NODE: {"int": card.numa_node},
            DRA_ATTR_HEALTHY: {"bool": card.healthy},
        },
        "capacity": {
            DRA_CAPACITY_MEMORY: {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": bytes_quantity(MEMORY_STEP_MIB * MIB), "max": memory,
                                   "step": bytes_quantity(MEMORY_STEP_MIB * MIB)},
                },
            },
            DRA_CAPACITY_CORES: {
                "value": count_quantity(CORES_TOTAL),
                "requestPolicy": {
                    "default": count_quantity(0),
                    "validRange": {"min": count_quantity(0), "max": count_quantity(CORES_TOTAL),
                                   "step": count_quantity(1)},
                },
            },
            CAPACITY_SHARES: {
                "value": count_quantity(shares),
                "requestPolicy": {
                    "default": count_quantity(1),
                    "validRange": {"min": count_quantity(1), "max": count_quantity(1)},
                },
            },
        },
    }


# --- slices -----------------------------------------------------------------------------------

def slice_name(node: str, index: int) -> str:
    """``<node>-gpu.egpu.io-<index>``; for a node name too long for that, a digest of it
    stands in (``gpu.egpu.io-<sha256[:40]>-<index>``)."""
    name = f"{node}-{DRA_DRIVER}-{index}"
    if len(name) <= MAX_OBJECT_NAME:
        return name
    return f"{DRA_DRIVER}-{hashlib.sha256(node.encode()).hexdigest()[:40]}-{index}"


def node_owner(node: str, node_uid: str) -> OwnerReference:
    """The owner reference to Node ``node`` (UID ``node_uid``)."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
            "controller": True}


def node_slices(node: str, cards: Iterable[Card], generation: int = 1,
                memory_ratio: float = 1.0, node_uid: str | None = None,
                max_devices: int = MAX_DEVICES_PER_SLICE, *,
                shares_per_card: int) -> list[ResourceSlice]:
    """The ResourceSlices of ``node`` for its ``cards``: the healthy ones, by index, as
    devices (``card_device``), ``max_devices`` per slice, in pool ``node`` at ``generation``.
    No healthy card: no slice (an empty list). ``node_uid``: owner reference to the Node.
    ``shares_per_card``: the config's ``sharesPerCard`` (``shares_capacity``).

    Raises SliceError for an empty node name, a generation below 1, ``max_devices`` outside
    1..128, two cards with one device name, or a card ``card_device`` refuses."""
    if not node:
        raise SliceError("node name is empty")
    if generation < 1:
        raise SliceError(f"generation {generation} is below 1")
    if not 1 <= max_devices <= MAX_DEVICES_PER_SLICE:
        raise SliceError(f"max_devices {max_devices}; allowed: 1..{MAX_DEVICES_PER_SLICE}")
    devices = [card_device(c, memory_ratio, shares_per_card=shares_per_card)
               for c in sorted(cards, key=lambda c: (c.index, c.uuid)) if c.healthy]
    names = [d["name"] for d in devices]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SliceError(f"node {node}: device name(s) {', '.join(twice)} appear twice")
    chunks = [devices[i:i + max_devices] for i in range(0, len(devices), max_devices)]
    slices: list[ResourceSlice] = []
    for i, chunk in enumerate(chunks):
        meta: SliceMeta = {"name": slice_name(node, i)}
        if node_uid:
            meta["ownerReferences"] = [node_owner(node, node_uid)]
        slices.append({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": meta,
            "spec": {
                "driver": DRA_DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": generation,
                         "resourceSliceCount": len(chunks)},
                "devices": chunk,
            },
        })
    return slices


# --- bringing the API server's slices to the inventory -----------------------------------------

@dataclass(frozen=True)
class SlicePlan:
    """What ``sync`` does: create, update (each body carries the resourceVersion read), delete
    (names), and the pool generation the slices get."""

    generation: int
    create: tuple[ResourceSlice, ...] = ()
    update: tuple[ResourceSlice, ...] = ()
    delete: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the plan writes anything."""
        return bool(self.create or self.update or self.delete)


def normal_quantities(value: Any) -> Any:
    """``value`` with every Quantity string replaced by its number (``"40Gi"`` and
    ``"40960Mi"`` compare equal), for comparing what was written with what is read back
    (ResourceSlices here, claim templates in egpu.dra.claims)."""
    if isinstance(value, dict):
        return {k: normal_quantities(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normal_quantities(v) for v in value]
    if isinstance(value, str):
        number = parse_quantity(value)
        return number if number is not None else value
    return value


def project_onto(read: Any, written: Any) -> Any:
    """``read`` cut to the keys of ``written`` (fields the API server defaults are not egpu's
    to compare); lists item by item when their lengths agree."""
    if isinstance(written, dict) and isinstance(read, dict):
        return {k: project_onto(read[k], v) for k, v in written.items() if k in read}
    if isinstance(written, list) and isinstance(read, list) and len(read) == len(written):
        return [project_onto(r, w) for r, w in zip(read, written, strict=True)]
    return read


def _content(spec: Any) -> Any:
    """A slice spec without its generation, its capacities normalized
    (``normal_quantities``; attribute strings such as the model stay strings): what a change
    of generation tracks."""
    if not isinstance(spec, dict):
        return spec
    spec = dict(spec)
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    devices = []
    for device in spec.get("devices") or []:
        device = dict(device)
        device["capacity"] = normal_quantities(device.get("capacity") or {})
        devices.append(device)
    spec["devices"] = devices
    return spec


def same_content(read: Any, written: ResourceSliceSpec) -> bool:
    """Whether the spec ``read`` from the API server holds what ``written`` says, the pool
    generation aside (fields the server added are ignored; Quantities compare by value)."""
    return bool(_content(project_onto(read, written)) == _content(written))


def _generation(obj: dict[str, Any]) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def plan(node: str, cards: Iterable[Card], existing: Sequence[dict[str, Any]],
         memory_ratio: float = 1.0, node_uid: str | None = None,
         max_devices: int = MAX_DEVICES_PER_SLICE, *, shares_per_card: int) -> SlicePlan:
    """What to write so that the API server holds exactly ``node_slices(node, cards, ...)``.

    ``existing``: the ResourceSlices of this driver and node as read (plain JSON objects).
    The generation stays the highest one read while every slice has it and the slices hold
    the same devices (by value: ``40Gi`` = ``40960Mi``); otherwise it is that + 1 (1 when
    there is none). Slices of the node that are not wanted (another name, a pool that shrank,
    no healthy card left) are deleted. Raises SliceError as ``node_slices``."""
    cards = tuple(cards)
    by_name = {str((s.get("metadata") or {}).get("name", "")): s for s in existing}
    seen = max((_generation(s) for s in existing), default=0)
    current = max(seen, 1)
    wanted = node_slices(node, cards, current, memory_ratio, node_uid, max_devices,
                         shares_per_card=shares_per_card)
    same = (
        bool(existing)
        and {s["metadata"]["name"] for s in wanted} == set(by_name)
        and all(_generation(s) == seen for s in existing)
        and all(same_content(by_name[s["metadata"]["name"]].get("spec"), s["spec"])
                for s in wanted)
    )
    generation = seen if same else seen + 1
    if not same:
        wanted = node_slices(node, cards, generation, memory_ratio, node_uid, max_devices,
                             shares_per_card=shares_per_card)
    create: list[ResourceSlice] = []
    update: list[ResourceSlice] = []
    for body in wanted:
        old = by_name.get(body["metadata"]["name"])
        if old is None:
            create.append(body)
            continue
        old_meta = old.get("metadata") or {}
        owners_differ = bool(node_uid) and old_meta.get("ownerReferences") != body[
            "metadata"].get("ownerReferences")
        if not same or owners_differ or _generation(old) != generation:
            version = old_meta.get("resourceVersion")
            if isinstance(version, str) and version:
                body["metadata"]["resourceVersion"] = version
            update.append(body)
    keep = {s["metadata"]["name"] for s in wanted}
    delete = tuple(sorted(name for name in by_name if name not in keep))
    return SlicePlan(generation if wanted else seen, tuple(create), tuple(update), delete)


class SliceStore(Protocol):
    """The API calls ``sync`` needs, on ResourceSlices of the driver ``gpu.egpu.io``."""

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        """The slices with ``spec.driver`` gpu.egpu.io and ``spec.nodeName`` ``node``."""
        ...

    def create_slice(self, body: ResourceSlice) -> None:
        """Create ``body``."""
        ...

    def update_slice(self, body: ResourceSlice) -> None:
        """Replace the slice ``body.metadata.name`` (optimistic: its resourceVersion)."""
        ...

    def delete_slice(self, name: str) -> None:
        """Delete slice ``name``; one already gone is no error."""
        ...


def sync(store: SliceStore, node: str, cards: Iterable[Card], memory_ratio: float = 1.0,
         node_uid: str | None = None, *, shares_per_card: int) -> SlicePlan:
    """Bring the node's slices in the API server to its cards (``plan``): creates and updates
    first, so that the new generation is complete before the old slices go, then deletes.
    Returns the plan run. Raises SliceError, and whatever the store raises (a conflict on an
    update means someone else wrote in between: run it again)."""
    done = plan(node, cards, store.list_slices(node), memory_ratio, node_uid,
                shares_per_card=shares_per_card)
    for body in done.create:
        store.create_slice(body)
    for body in done.update:
        store.update_slice(body)
    for name in done.delete:
        store.delete_slice(name)
    return done
