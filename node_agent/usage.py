"""The node annotation ``egpu.io/usage`` (records.NodeUsage): measured use per card and share.

Built at each inventory heartbeat and sent in the same PATCH (node_agent.inventory), so that
``egpu top`` / ``kubectl egpu`` show usage through the API alone:

- per card: memory_used_mib from NVML (all processes; where NVML cannot tell, the sum of the
  shares' accounting regions), compute_used_percent from NVML (else the shares' measured use
  in the card's folder, else 0);
- per share (a container's accounting region, one entry per card it uses): pod_uid, container,
  uuid, memory_used_mib (the region), compute_used_percent (the share's slot in the card's
  folder; 0 where there is none: no card folder, or its roster does not list the share).
"""

from __future__ import annotations

from collections.abc import Callable

from egpu.records import Card, CardUsage, NodeUsage, ShareUsage
from node_agent.metrics.card_region import CardRegion
from node_agent.metrics.collector import card_compute, share_compute
from node_agent.metrics.region import RegionUsage, split_dir_name

MIB = 1 << 20


def node_usage(cards: tuple[Card, ...], regions: dict[str, RegionUsage],
               card_regions: dict[str, CardRegion],
               memory_used: Callable[[str], int | None],
               compute_used: Callable[[str], int | None], now_ns: int) -> NodeUsage:
    """The NodeUsage of the node now. regions: accounting folder name -> usage;
    memory_used (bytes) / compute_used (%): NVML per card UUID (None: unknown)."""
    shares = []
    region_bytes: dict[str, int] = {}
    for name, usage in sorted(regions.items()):
        uid, container = split_dir_name(name)
        for in_use in usage.cards:
            region_bytes[in_use.uuid] = region_bytes.get(in_use.uuid, 0) + in_use.used_bytes
            used = share_compute(card_regions, name, in_use.uuid, now_ns)
            shares.append(ShareUsage(uid, container, in_use.uuid, in_use.used_bytes // MIB,
                                     used if used is not None else 0.0))
    out = []
    for card in sorted(cards, key=lambda c: c.index):
        mem = memory_used(card.uuid)
        if mem is None:
            mem = region_bytes.get(card.uuid, 0)
        pct = card_compute(card_regions, compute_used(card.uuid), card.uuid, now_ns)
        out.append(CardUsage(card.uuid, int(mem) // MIB, pct if pct is not None else 0.0))
    return NodeUsage(tuple(out), tuple(shares))
