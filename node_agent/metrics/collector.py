"""The Prometheus collector (prometheus-client custom collector) of the node agent.

Metric names are egpu.contract.METRIC_*; labels follow dcgm-exporter where they overlap:
card metrics carry ``gpu`` (index), ``UUID``, ``modelName``, ``Hostname``; container metrics
add ``namespace``, ``pod``, ``container``. Units: bytes and percent.

- Per container share (from its accounting region, and its allocation for the cores):
  memory limit, used and peak bytes, refused allocations (a counter), cores limit %;
  compute used % from the card's folder (card_region: the share's file there, measured GPU
  time), where the card's roster lists the share.
- Per card (inventory, NVML, allocations of the node's active pods): memory total / used /
  booked bytes, cores booked %, compute used % (NVML; else the shares' measured use from the
  card's folder). Booked: an extender pod's record by the booking rule (``egpu.booking``);
  a claim's requests once, however many containers or pods name them
  (``booked_claim_folders``), as the kube-scheduler's allocation consumes them.
- Per node: ``egpu_node_heartbeat_timestamp_seconds{Hostname}``, the last successful
  inventory heartbeat (unix seconds), once there is one.

The collector's inputs are callables, so that it is tested without NVML or the API server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from egpu.booking import record_bookings
from egpu.card_roster import share_owner
from egpu.contract import (
    CLAIM_SHARE_DIR_PREFIX,
    LABELS_CARD,
    LABELS_CONTAINER,
    LABELS_NODE,
    METRIC_CARD_COMPUTE_USED,
    METRIC_CARD_CORES_BOOKED,
    METRIC_CARD_DRIVER_MEMORY_LIMIT,
    METRIC_CARD_MEMORY_BOOKED,
    METRIC_CARD_MEMORY_TOTAL,
    METRIC_CARD_MEMORY_USED,
    METRIC_CONTAINER_COMPUTE_OVER_CAP,
    METRIC_CONTAINER_COMPUTE_REPORTED,
    METRIC_CONTAINER_COMPUTE_USED,
    METRIC_CONTAINER_CORES_LIMIT,
    METRIC_CONTAINER_MEMORY_LIMIT,
    METRIC_CONTAINER_MEMORY_PEAK,
    METRIC_CONTAINER_MEMORY_REFUSED,
    METRIC_CONTAINER_MEMORY_USED,
    METRIC_NODE_HEARTBEAT,
    claim_share_dir_requests,
)
from egpu.records import Card, CardShare, ContainerAllocation, PodShares
from node_agent.metrics.card_region import CardRegion, SlotUse
from node_agent.metrics.region import RegionUsage, scan, split_dir_name

MIB = 1 << 20


@dataclass
class Sources:
    """Where the collector reads. cards: the node's cards; shares: pod uid -> PodShares of
    the node's active pods; regions: folder name -> usage; memory_used / compute_used:
    NVML per card UUID (None: unknown); card_regions: card UUID -> its card region;
    heartbeat: unix time of the last successful heartbeat (None: none yet); now_ns: the
    CLOCK_MONOTONIC clock of the card regions."""

    hostname: str
    cards: Callable[[], tuple[Card, ...]]
    shares: Callable[[], dict[str, PodShares]]
    regions: Callable[[], dict[str, RegionUsage]]
    memory_used: Callable[[str], int | None]
    compute_used: Callable[[str], int | None]
    card_regions: Callable[[], dict[str, CardRegion]] = field(default=lambda: {})
    heartbeat: Callable[[], float | None] = field(default=lambda: None)
    now_ns: Callable[[], int] = field(default=time.monotonic_ns)


def share_slot(card_regions: dict[str, CardRegion], dir_name: str,
               uuid: str) -> SlotUse | None:
    """The share of folder ``dir_name`` on card ``uuid``; None when the card has no folder or
    its roster does not list the share."""
    region = card_regions.get(uuid)
    return region.slots.get(share_owner(dir_name)) if region else None


def share_compute(card_regions: dict[str, CardRegion], dir_name: str, uuid: str,
                  now_ns: int) -> float | None:
    """Compute used by the share of folder ``dir_name`` on card ``uuid`` within its booking,
    % of the card; None when the card has no folder or its roster does not list the share."""
    slot = share_slot(card_regions, dir_name, uuid)
    return slot.used_percent(now_ns) if slot else None


def card_compute(card_regions: dict[str, CardRegion], nvml_percent: float | None, uuid: str,
                 now_ns: int) -> float | None:
    """The card's compute use, %: NVML's when it has one, else the shares' measured use."""
    if nvml_percent is not None:
        return float(nvml_percent)
    region = card_regions.get(uuid)
    return region.used_percent(now_ns) if region else None


def shared_region_users(shares: dict[str, PodShares]
                        ) -> dict[str, list[tuple[PodShares, ContainerAllocation]]]:
    """A claim's accounting folder (``ContainerAllocation.share``) -> the containers of the
    prepared pods that draw on it."""
    out: dict[str, list[tuple[PodShares, ContainerAllocation]]] = {}
    for pod in shares.values():
        for entry in pod.allocation.containers:
            if entry.share is not None:
                out.setdefault(entry.share, []).append((pod, entry))
    return out


def _claim_requests(folder: str) -> tuple[str, frozenset[str]]:
    """(the claim, its requests) of a claim's accounting folder ``claim-<uid>_<r1>.<r2>``
    (``egpu.contract.claim_share_dir_name``); a folder of another form is a claim of its own."""
    head = folder.rpartition("_")[0]
    requests = (claim_share_dir_requests(folder, head.removeprefix(CLAIM_SHARE_DIR_PREFIX))
                if head.startswith(CLAIM_SHARE_DIR_PREFIX) else None)
    return (head, requests) if requests is not None else (folder, frozenset())


def booked_claim_folders(folders: Iterable[str]) -> set[str]:
    """The claim folders (``ContainerAllocation.share``) whose cards the card's booked figures
    count: a claim's requests are booked once (each allocation result consumes its capacity
    once), so a folder whose requests all lie within another folder of the same claim is not
    counted again: a paired init container names its app container's request plus a
    headroom request (``egpu.dra.claims``, FC-07), and the card holds the pair once, max(init,
    app), not the app's request twice. Folders that overlap without one holding the other
    (hand-written claims only) are both counted: never less than is booked."""
    by_claim: dict[str, dict[str, frozenset[str]]] = {}
    for folder in folders:
        claim, requests = _claim_requests(folder)
        by_claim.setdefault(claim, {})[folder] = requests
    return {folder for sets in by_claim.values() for folder, requests in sets.items()
            if not any(requests < other for other in sets.values())}


def region_labels(name: str, shares: dict[str, PodShares],
                  users: dict[str, list[tuple[PodShares, ContainerAllocation]]]
                  ) -> tuple[str, str, str, ContainerAllocation | None]:
    """(namespace, pod, container, its allocation entry) of the region folder ``name``: a
    container's own (``<pod-uid>_<container>``), or a claim's shared one: its container when
    one draws on it, else the namespace alone (several pods' or containers' one budget)."""
    shared = users.get(name)
    if shared:
        pod, entry = shared[0]
        if len(shared) == 1:
            return pod.namespace, pod.pod, entry.name, entry
        return pod.namespace, "", "", entry
    uid, container = split_dir_name(name)
    found = shares.get(uid)
    if found is None:
        return "", "", container, None
    return found.namespace, found.pod, container, found.allocation.for_container(container)


def regions_under(runtime_dir: str) -> Callable[[], dict[str, RegionUsage]]:
    """A ``Sources.regions`` that scans ``runtime_dir``."""
    return lambda: scan(runtime_dir)


class EgpuCollector(Collector):
    """Collects the metrics of the module docstring at each scrape."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def describe(self) -> list[Metric]:
        """No eager collection at registration (NVML may be slow)."""
        return []

    def collect(self) -> Iterator[Metric]:
        src = self.sources
        cards = {c.uuid: c for c in src.cards()}
        shares = src.shares()
        card_regions = src.card_regions()
        now_ns = src.now_ns()

        def card_labels(uuid: str) -> list[str]:
            card = cards.get(uuid)
            return [str(card.index) if card else "", uuid, card.model if card else "",
                    src.hostname]

        c_limit = GaugeMetricFamily(METRIC_CONTAINER_MEMORY_LIMIT,
                                    "Device memory cap of a container's share, bytes",
                                    labels=LABELS_CONTAINER)
        c_used = GaugeMetricFamily(METRIC_CONTAINER_MEMORY_USED,
                                   "Device memory in use by a container's share, bytes",
                                   labels=LABELS_CONTAINER)
        c_peak = GaugeMetricFamily(METRIC_CONTAINER_MEMORY_PEAK,
                                   "Highest device memory use of a container's share since "
                                   "it started, bytes", labels=LABELS_CONTAINER)
        c_refused = CounterMetricFamily(METRIC_CONTAINER_MEMORY_REFUSED.removesuffix("_total"),
                                        "Allocations refused because the share's memory was "
                                        "full", labels=LABELS_CONTAINER)
        c_cores = GaugeMetricFamily(METRIC_CONTAINER_CORES_LIMIT,
                                    "Compute booked by a container's share, % of the card",
                                    labels=LABELS_CONTAINER)
        c_compute = GaugeMetricFamily(METRIC_CONTAINER_COMPUTE_USED,
                                      "Compute used by a container's share, % of the card "
                                      "(within its booking: what decisions believe)",
                                      labels=LABELS_CONTAINER)
        c_reported = GaugeMetricFamily(METRIC_CONTAINER_COMPUTE_REPORTED,
                                       "Compute use a container's share reports, % of the card, "
                                       "as reported (may exceed its cap)",
                                       labels=LABELS_CONTAINER)
        c_over = GaugeMetricFamily(METRIC_CONTAINER_COMPUTE_OVER_CAP,
                                   "1 while a container's share reports more compute than its "
                                   "cap (strict: cap + 3 points) or the card",
                                   labels=LABELS_CONTAINER)
        users = shared_region_users(shares)
        for name, usage in sorted(src.regions().items()):
            namespace, pod_name, container, entry = region_labels(name, shares, users)
            cores = {s.uuid: s.cores for s in entry.cards} if entry else {}
            # The region file is the tenant's own: its card UUIDs and limit are believed only
            # where the node gave them (the allocation's cards and MiB; else the node's cards),
            # so that no share can report under another card or hide over-cap use behind a
            # limit of its own, nor grow the series without bound.
            limits = ({s.uuid: s.memory_mib * MIB for s in entry.cards} if entry else
                      {uuid: None for uuid in cards})
            for card in usage.cards:
                if card.uuid not in limits:
                    continue
                labels = [*card_labels(card.uuid), namespace, pod_name, container]
                c_limit.add_metric(labels, limits[card.uuid] or card.limit_bytes)
                c_used.add_metric(labels, card.used_bytes)
                c_peak.add_metric(labels, card.peak_bytes)
                c_refused.add_metric(labels, card.refused)
                if card.uuid in cores:
                    c_cores.add_metric(labels, cores[card.uuid])
                slot = share_slot(card_regions, name, card.uuid)
                if slot is not None:
                    c_compute.add_metric(labels, slot.used_percent(now_ns))
                    c_reported.add_metric(labels, slot.reported_percent(now_ns))
                    c_over.add_metric(labels, 1.0 if slot.over_cap(now_ns) else 0.0)
        yield from (c_limit, c_used, c_peak, c_refused, c_cores, c_compute, c_reported, c_over)

        booked_mib: dict[str, int] = {}
        booked_cores: dict[str, int] = {}

        def book(cards: Iterable[CardShare]) -> None:
            for s in cards:
                add(s.uuid, s.memory_mib, s.cores)

        def add(uuid: str, mib: int, cores: int) -> None:
            booked_mib[uuid] = booked_mib.get(uuid, 0) + mib
            booked_cores[uuid] = booked_cores.get(uuid, 0) + cores

        for pod in shares.values():
            if all(entry.share is None for entry in pod.allocation.containers):
                # the scheduler's record: what the pod books per card by the booking rule (an
                # init container's share reused by the app containers after it)
                for uuid, booking in record_bookings(pod.allocation).items():
                    add(uuid, booking.memory_mib, booking.cores)
                continue
            book(c for entry in pod.allocation.containers if entry.share is None
                 for c in entry.cards)
        # a claim's requests: booked once, however many containers or pods name them, and a
        # paired init container's folder holds its app container's request (the claim's
        # consumed capacity, as kube-scheduler allocated it and `egpu top` counts it)
        for folder in booked_claim_folders(users):
            book(users[folder][0][1].cards)
        total = GaugeMetricFamily(METRIC_CARD_MEMORY_TOTAL, "Card device memory, bytes",
                                  labels=LABELS_CARD)
        used = GaugeMetricFamily(METRIC_CARD_MEMORY_USED,
                                 "Card device memory in use (NVML), bytes", labels=LABELS_CARD)
        booked = GaugeMetricFamily(METRIC_CARD_MEMORY_BOOKED,
                                   "Device memory booked by shares on the card, bytes",
                                   labels=LABELS_CARD)
        cores_booked = GaugeMetricFamily(METRIC_CARD_CORES_BOOKED,
                                         "Compute booked by shares on the card, %",
                                         labels=LABELS_CARD)
        compute = GaugeMetricFamily(METRIC_CARD_COMPUTE_USED,
                                    "Card compute utilisation (NVML, else measured by the "
                                    "shares), %", labels=LABELS_CARD)
        wall = GaugeMetricFamily(METRIC_CARD_DRIVER_MEMORY_LIMIT,
                                 "1 when the card's driver takes a per-container memory limit "
                                 "(NVML r615), set to each share as a second wall; else 0",
                                 labels=LABELS_CARD)
        for uuid, found in sorted(cards.items(), key=lambda kv: kv[1].index):
            labels = card_labels(uuid)
            total.add_metric(labels, found.memory_mib * MIB)
            wall.add_metric(labels, 1 if found.driver_memory_limit else 0)
            booked.add_metric(labels, booked_mib.get(uuid, 0) * MIB)
            cores_booked.add_metric(labels, booked_cores.get(uuid, 0))
            mem = src.memory_used(uuid)
            if mem is not None:
                used.add_metric(labels, mem)
            util = card_compute(card_regions, src.compute_used(uuid), uuid, now_ns)
            if util is not None:
                compute.add_metric(labels, util)
        yield from (total, used, booked, cores_booked, compute, wall)
        heartbeat = GaugeMetricFamily(METRIC_NODE_HEARTBEAT,
                                      "Last successful inventory heartbeat, unix seconds",
                                      labels=LABELS_NODE)
        beat = src.heartbeat()
        if beat is not None:
            heartbeat.add_metric([src.hostname], beat)
        yield heartbeat
