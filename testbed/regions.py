"""Synthetic accounting regions (egpu_region.h v1, node_agent/metrics/region.py) for the
exporter's tests and benchmark."""

from __future__ import annotations

import os

from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares
from egpu.region_layout import (
    CARD,
    HEADER,
    REGION_MAGIC,
    REGION_SIZE,
    REGION_VERSION,
)

MIB = 1 << 20


def region_bytes(cards: list[tuple[str, int, int]] | list[tuple[str, int, int, int, int]]
                 ) -> bytes:
    """A full region with ``cards`` = [(uuid, limit_bytes, used_bytes[, peak_bytes,
    refused])] (peak and refused 0 when left out, as an older interposer leaves them)."""
    data = bytearray(REGION_SIZE)
    HEADER.pack_into(data, 0, REGION_MAGIC, REGION_VERSION, REGION_SIZE, b"", len(cards), 0,
                     0, 0, b"")
    for i, card in enumerate(cards):
        uuid, limit, used, peak, refused = (*card, 0, 0)[:5]
        CARD.pack_into(data, HEADER.size + i * CARD.size, uuid.encode(), limit, used, peak,
                       refused, b"")
    return bytes(data)


def write_regions(runtime_dir: str, count: int, uuids: list[str]) -> dict[str, PodShares]:
    """``count`` containers (one per pod), each with a 1024 MiB share on one of ``uuids``,
    using (i % 1024) MiB. Returns pod uid -> PodShares."""
    shares = {}
    for i in range(count):
        uid = f"00000000-0000-0000-0000-{i:012d}"
        uuid = uuids[i % len(uuids)]
        folder = os.path.join(runtime_dir, "containers", f"{uid}_main")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "region"), "wb") as handle:
            handle.write(region_bytes([(uuid, 1024 * MIB, (i % 1024) * MIB)]))
        entry = ContainerAllocation("main", False, (CardShare(uuid, 0, 1024, 10),))
        shares[uid] = PodShares("team", f"pod-{i}", uid, "high", "strict", False,
                                Allocation(containers=(entry,), node="n1"))
    return shares
