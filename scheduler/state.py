"""The cluster view: nodes' cards and every pod's bookings (in memory, no I/O), what ``kubectl
egpu advise`` reads a cluster into, by the booking rules egpu-kube-scheduler follows.

Built only from API objects (Kubernetes JSON dicts), so a view read again rebuilds the same
view from a list of nodes and pods:

- a node's cards come from its ``egpu.io/inventory`` annotation and its freshness from
  ``egpu.io/inventory-heartbeat`` (RFC 3339);
- a pod with egpu resources books what its ``egpu.io/allocation`` annotation says (on the
  annotation's node), by the effective-request rule of ``egpu.booking``, from the moment the
  annotation appears (even before the pod is bound) until the pod is gone or has finished
  (phase Succeeded or Failed). A terminating pod (deletionTimestamp set) keeps its bookings
  until it is deleted. Bookings are keyed by pod UID, so a delete event without annotations
  still releases them. A pod without egpu resources books nothing, whatever it carries; an
  egpu pod whose request no longer reads as valid (its pod-level egpu annotations, such as
  ``egpu.io/gpu-policy``, stay editable) books its record all the same, as the node agent
  and ``kubectl egpu`` honour it;
- the annotation is written once (the scheduler's Binding; the ValidatingAdmissionPolicy of
  manifests/webhook denies edits): the first allocation seen for a pod UID (or the one its
  own bind wrote) stands, and a later different or removed annotation is ignored with a
  warning, so an edit can neither shrink a booking (overbooking the card) nor release it.

Binds in flight add *reservations* (as the plugin's Reserve does): a booking taken before the
Binding (which carries the annotation) is written, which counts instead of whatever was
observed for that pod, and lasts until a pod event shows the pod carrying the same
allocation, the pod is deleted, or the bind rolls back. A fit therefore sees bookings of binds
in flight, and a pod event older than the bind (without the annotation yet) cannot release a
booking just made. ``kubectl egpu advise`` reads a cluster with none; the property tests
(tests/scheduler/test_properties.py) hold the booking rules with binds in flight.

Not thread-safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from egpu.booking import CardBooking, allocation_bookings, record_bookings
from egpu.config import Config
from egpu.contract import (
    ALLOCATION_MODE_DRA,
    ANN_ALLOCATION,
    ANN_ALLOCATION_MODE,
    ANN_INVENTORY,
    ANN_INVENTORY_HEARTBEAT,
)
from egpu.kube import KubeNode, KubePod, parse_time
from egpu.records import Allocation, Card, Inventory, RecordError
from egpu.requests import PodReading, read_pod
from scheduler.placement import CardState, NodeState

log = logging.getLogger("egpu.scheduler")


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod object."""
    return KubePod(pod).key


def parse_heartbeat(text: Any) -> float | None:
    """RFC 3339 text -> unix seconds; None when absent or unreadable (treated as stale)."""
    stamp = parse_time(text)
    return None if stamp is None else stamp.timestamp()


# A node of the DRA pool (its agent runs --dra --no-device-plugin, docs/dra.md): its cards are
# booked by ResourceClaims, which this view does not book, so it places no share there.
DRA_NODE = (f"this node takes egpu shares through DRA ({ANN_ALLOCATION_MODE}: "
            f"{ALLOCATION_MODE_DRA}, its node agent serves no device plugin); extender shares go "
            "to nodes whose agent serves the device plugin")


@dataclass(frozen=True)
class NodeRecord:
    """What a node object says: its cards, heartbeat (unix s) and any inventory problem."""

    name: str
    cards: tuple[Card, ...]
    heartbeat: float | None
    problem: str = ""


def node_record(node: Mapping[str, Any]) -> NodeRecord:
    """Read a Node object's egpu annotations; never raises (problems land in ``problem``)."""
    view = KubeNode(node)
    name = view.name
    heartbeat = parse_heartbeat(view.annotation(ANN_INVENTORY_HEARTBEAT))
    if view.annotation(ANN_ALLOCATION_MODE) == ALLOCATION_MODE_DRA:
        return NodeRecord(name, (), heartbeat, DRA_NODE)
    text = view.annotation(ANN_INVENTORY)
    if text is None:
        return NodeRecord(name, (), heartbeat,
                          "no egpu inventory on this node (annotation egpu.io/inventory missing)")
    try:
        inventory = Inventory.decode(text)
    except RecordError as exc:
        return NodeRecord(name, (), heartbeat, f"egpu inventory unreadable: {exc}")
    return NodeRecord(name, inventory.cards, heartbeat)


@dataclass(frozen=True)
class Booking:
    """What one pod books: per card UUID on ``node``, from its allocation."""

    uid: str
    pod: str  # namespace/name
    node: str
    allocation: Allocation
    cards: dict[str, CardBooking] = field(default_factory=dict)


def booking_from_pod(pod: Mapping[str, Any], config: Config,
                     reading: PodReading | None = None) -> Booking | None:
    """The booking a pod object holds, or None (no or unreadable allocation, finished pod,
    or a pod without egpu resources: only egpu's scheduler writes the annotation, and only on
    egpu pods).

    An egpu pod whose request no longer reads as valid (its pod-level egpu annotations stay
    editable after creation) keeps booking its record, as the node agent and ``kubectl egpu``
    honour it: by the kinds the record carries, else every container summed.

    ``reading``: ``read_pod(pod, config)`` when the caller has it already."""
    return pod_booking(pod, config, reading)[0]


def pod_booking(pod: Mapping[str, Any], config: Config,
                reading: PodReading | None = None) -> tuple[Booking | None, str]:
    """``booking_from_pod`` and, when it is None, why (for logs; "" when the pod has no
    allocation annotation, no UID or has finished)."""
    view = KubePod(pod)
    uid = view.uid
    text = view.annotation(ANN_ALLOCATION)
    if not uid or text is None or view.finished:
        return None, ""
    try:
        allocation = Allocation.decode(text)
    except RecordError as exc:
        return None, f"annotation {ANN_ALLOCATION} is unreadable: {exc}"
    node = allocation.node or view.node_name
    if not node:
        return None, (f"annotation {ANN_ALLOCATION} names no node and the pod is not bound "
                      "to one")
    reading = reading or read_pod(pod, config)
    if not reading.is_egpu_pod:  # a hand-written annotation on a pod without egpu resources
        return None, ("the pod asks for no egpu resource, so its annotation "
                      f"{ANN_ALLOCATION} books nothing")
    # the kinds the scheduler decided and wrote; the spec's only for an older scheduler's
    # record, and with no valid request (annotations edited invalid) every container summed
    bookings = (record_bookings(allocation) if allocation.complete
                else allocation_bookings(allocation, reading.request))
    return Booking(uid, view.key, node, allocation, bookings), ""


@dataclass
class _Reservation:
    booking: Booking
    in_flight: bool = True  # the bind has not finished yet
    since: float = field(default_factory=time.monotonic)


class ClusterState:
    """Nodes and bookings; see the module docstring. ``config`` reads pod specs (aliases)."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self._nodes: dict[str, NodeRecord] = {}
        self._observed: dict[str, Booking] = {}
        self._reserved: dict[str, _Reservation] = {}
        self._usage: dict[str, dict[str, CardBooking]] = {}
        self._views: dict[str, NodeState] = {}
        self.pods: dict[str, Mapping[str, Any]] = {}  # uid -> pod object, egpu pods only
        self._warned: dict[str, str] = {}  # uid -> the ignored annotation last logged
        self._on_node: dict[str, set[str]] = {}  # node -> uids of the pods booking there

    # --- nodes ---------------------------------------------------------------------------
    def upsert_node(self, node: Mapping[str, Any]) -> None:
        """A node was added or changed (its annotations are read again)."""
        record = node_record(node)
        if self._nodes.get(record.name) != record:
            self._nodes[record.name] = record
            self._views.pop(record.name, None)

    def delete_node(self, name: str) -> None:
        """A node is gone."""
        if self._nodes.pop(name, None) is not None:
            self._views.pop(name, None)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """The full node list (start, or a watch that had to list again)."""
        seen = set()
        for node in nodes:
            self.upsert_node(node)
            seen.add(KubeNode(node).name)
        for name in set(self._nodes) - seen:
            self.delete_node(name)

    @property
    def node_names(self) -> list[str]:
        """Names of the nodes known (with or without a readable inventory)."""
        return list(self._nodes)

    # --- pods ----------------------------------------------------------------------------
    def _effective(self, uid: str) -> Booking | None:
        reservation = self._reserved.get(uid)
        return reservation.booking if reservation else self._observed.get(uid)

    def _apply(self, before: Booking | None, after: Booking | None) -> None:
        if before is after:
            return
        for booking, sign in ((before, -1), (after, 1)):
            if booking is None:
                continue
            members = self._on_node.setdefault(booking.node, set())
            if sign > 0:
                members.add(booking.uid)
            else:
                members.discard(booking.uid)
            usage = self._usage.setdefault(booking.node, {})
            for uuid, amount in booking.cards.items():
                current = usage.get(uuid, CardBooking())
                usage[uuid] = current + amount if sign > 0 else current - amount
            self._views.pop(booking.node, None)

    def _change(self, uid: str, *, observed: Booking | str | None = "keep",
                reservation: _Reservation | str | None = "keep") -> None:
        """Set what was observed and reserved for ``uid``."""
        before = self._effective(uid)
        if observed != "keep":
            if observed is None:
                self._observed.pop(uid, None)
            else:
                assert isinstance(observed, Booking)
                self._observed[uid] = observed
        if reservation != "keep":
            if reservation is None:
                self._reserved.pop(uid, None)
            else:
                assert isinstance(reservation, _Reservation)
                self._reserved[uid] = reservation
        after = self._effective(uid)
        self._apply(before, after)

    def observe_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod was added or changed: record (or release) the booking its annotation holds."""
        view = KubePod(pod)
        uid = view.uid
        if not uid:
            return
        reading = read_pod(pod, self.config)
        if reading.is_egpu_pod:
            self.pods[uid] = pod
        booking, why_none = pod_booking(pod, self.config, reading)
        reservation = self._reserved.get(uid)
        prior = self._observed.get(uid)
        finished = view.finished
        confirmed = (reservation is not None and booking is not None
                     and booking.allocation == reservation.booking.allocation)
        if (not confirmed and reservation is not None and not reservation.in_flight
                and booking is not None):
            # Our Binding wrote the reservation's allocation: a different one was edited in.
            self._ignored(uid, pod, booking, reservation.booking)
            booking, confirmed = reservation.booking, True
        elif (not confirmed and reservation is None and prior is not None and not finished
              and (booking is None or booking.allocation != prior.allocation)):
            # The first allocation seen stands until the pod finishes or is deleted: an
            # edited (or removed) annotation books nothing more and releases nothing.
            self._ignored(uid, pod, booking, prior, why_none)
            booking = prior
        self._change(uid, observed=booking, reservation=None if confirmed else "keep")

    def _ignored(self, uid: str, pod: Mapping[str, Any], seen: Booking | None,
                 kept: Booking, why_none: str = "") -> None:
        """Log (once per pod and value) that a changed allocation annotation was ignored;
        ``why_none``: why the pod, as it is now, books nothing (``pod_booking``)."""
        annotation = KubePod(pod).annotation(ANN_ALLOCATION)
        text = str(annotation)
        if self._warned.get(uid) == text:
            return
        self._warned[uid] = text
        what = "removed" if seen is None and annotation is None else "changed"
        if seen is None and annotation is not None:
            what += f" to a value that books nothing ({why_none})"
        log.warning("pod %s (uid %s): annotation %s %s after it was set; ignored, the pod "
                    "keeps booking %s on node %s (the annotation is written once, by the "
                    "scheduler at bind time)", pod_key(pod), uid, ANN_ALLOCATION, what,
                    kept.allocation.encode(), kept.node)

    def delete_pod(self, uid: str) -> None:
        """A pod is gone: release everything it held, whatever its last annotations said."""
        self.pods.pop(uid, None)
        self._warned.pop(uid, None)
        self._change(uid, observed=None, reservation=None)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """The full pod list: bookings of pods missing from it are released."""
        seen = set()
        for pod in pods:
            self.observe_pod(pod)
            seen.add(KubePod(pod).uid)
        for uid in (set(self._observed) | set(self.pods)) - seen:
            self.delete_pod(uid)
        for uid, reservation in list(self._reserved.items()):
            if uid not in seen and not reservation.in_flight:
                self._change(uid, reservation=None)

    # --- binds ---------------------------------------------------------------------------
    def reserve(self, booking: Booking) -> None:
        """Book for a bind in flight (replaces whatever the pod held before)."""
        self._change(booking.uid, reservation=_Reservation(booking))

    def reserved(self, uid: str) -> tuple[Booking, bool] | None:
        """What a bind reserved for pod ``uid`` and whether that bind is still in flight;
        None when no reservation stands (none made, confirmed by the watch, or dropped)."""
        reservation = self._reserved.get(uid)
        return None if reservation is None else (reservation.booking, reservation.in_flight)

    def bind_done(self, uid: str) -> None:
        """The bind finished: keep the reservation until the watch confirms it."""
        reservation = self._reserved.get(uid)
        if reservation is not None:
            reservation.in_flight = False
            reservation.since = time.monotonic()

    def unreserve(self, uid: str) -> None:
        """The bind failed: drop its reservation (what was observed counts again)."""
        self._change(uid, reservation=None)

    def expire_reservations(self, max_age_s: float = 300.0) -> int:
        """Drop finished binds' reservations that no watch event confirmed within max_age_s."""
        now = time.monotonic()
        old = [uid for uid, r in self._reserved.items()
               if not r.in_flight and now - r.since > max_age_s]
        for uid in old:
            self._change(uid, reservation=None)
        return len(old)

    # --- reading -------------------------------------------------------------------------
    def booking(self, uid: str) -> Booking | None:
        """What the pod ``uid`` books now (its reservation, else what was observed)."""
        return self._effective(uid)

    def node(self, name: str, excluding: str | None = None) -> NodeState | None:
        """The node's cards with everyone's bookings, or None when the node is unknown.

        ``excluding``: a pod UID whose own booking is left out (a pod being scheduled again
        after a bind that never finished must not compete with itself).
        """
        own = self._effective(excluding) if excluding else None
        view = self._views.get(name)
        if view is None:
            record = self._nodes.get(name)
            if record is None:
                return None
            usage = self._usage.get(name, {})
            cards = []
            for card in record.cards:
                used = usage.get(card.uuid, CardBooking())
                cards.append(CardState(card.uuid, card.index, card.model, card.memory_mib,
                                       card.healthy, used.memory_mib, used.cores, used.slots))
            view = NodeState(name, tuple(cards), record.heartbeat, record.problem)
            self._views[name] = view
        if own is None or own.node != name:
            return view
        others = []  # the view's cards without the pod's own bookings
        for c in view.cards:
            mine = own.cards.get(c.uuid, CardBooking())
            others.append(CardState(c.uuid, c.index, c.model, c.capacity_mib, c.healthy,
                                    c.booked_mib - mine.memory_mib, c.booked_cores - mine.cores,
                                    c.used_slots - mine.slots))
        return NodeState(name, tuple(others), view.heartbeat, view.problem)

    def usage(self, node: str) -> dict[str, CardBooking]:
        """Card UUID -> total booked on ``node`` (copies; for tests, metrics and checks)."""
        return dict(self._usage.get(node, {}))

    def bookings(self) -> dict[str, Booking]:
        """Pod UID -> effective booking, for every pod that books something."""
        uids = set(self._observed) | set(self._reserved)
        return {uid: b for uid in uids if (b := self._effective(uid)) is not None}
