"""node_agent.metrics.card_region, the compute and heartbeat metrics and the egpu.io/usage
annotation: card regions built in Python per card_region.h, checked against the compiler."""

from __future__ import annotations

import logging
import shutil
import struct
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from node_fixtures import MIB, region_bytes
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from egpu.contract import (
    ANN_USAGE,
    METRIC_CARD_COMPUTE_USED,
    METRIC_CONTAINER_COMPUTE_USED,
    METRIC_NODE_HEARTBEAT,
)
from egpu.records import Allocation, Card, CardShare, ContainerAllocation, NodeUsage, PodShares
from node_agent.inventory import inventory_patch
from node_agent.metrics import card_region as cr
from node_agent.metrics.collector import EgpuCollector, Sources, regions_under
from node_agent.metrics.region import scan
from node_agent.usage import node_usage

REPO = Path(__file__).resolve().parents[2]
U0, U1 = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"
CARDS = (Card(U0, 0, "NVIDIA A10", 24576), Card(U1, 1, "NVIDIA A10", 24576))
NOW = 50_000_000_000


def card_region_bytes(uuid: str, slots: list[dict[str, int]]) -> bytes:
    """A card region (card_region.h v1) with ``slots`` (field name -> value) from slot 0."""
    data = bytearray(cr.CARD_REGION_SIZE)
    cr.HEADER.pack_into(data, 0, cr.CARD_MAGIC, cr.CARD_VERSION, cr.CARD_REGION_SIZE,
                        cr.NSLOTS, cr.SLOT_SIZE, uuid.encode())
    for i, values in enumerate(slots):
        for name, offset, code in cr.SLOT_FIELDS:
            struct.pack_into("<" + code, data, cr.HEADER_SIZE + i * cr.SLOT_SIZE + offset,
                             values.get(name, 0))
    return bytes(data)


def test_owner_id_is_the_interposer_s_fnv1a() -> None:
    assert cr.owner_id("") == 0xCBF29CE484222325
    assert cr.owner_id("a") == 0xAF63DC4C8601EC8C  # FNV-1a 64 test vector
    assert cr.share_owner("uid_main") == cr.owner_id("/var/run/egpu/containers/uid_main/region")


def test_slot_use_is_zero_when_idle() -> None:
    slot = cr.SlotUse(owner=1, cores=30, busy_total_ns=0, last_active_ns=NOW - 10**8,
                      use_ppm=300_000, inflight_n=0)
    assert slot.used_percent(NOW) == 30.0
    assert slot.used_percent(NOW + 2 * cr.IDLE_NS) == 0.0
    busy = cr.SlotUse(1, 30, 0, 1, 2_000_000, 1)
    assert busy.used_percent(NOW + 10 * cr.IDLE_NS) == 100.0


def test_read_skips_missing_short_and_foreign_files(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / U0).write_bytes(card_region_bytes(U0, [{"owner": 7, "use_ppm": 10}]))
    (cards / "short").write_bytes(b"EGPUCARD")
    foreign = bytearray(card_region_bytes(U1, []))
    struct.pack_into("<I", foreign, 8, 2)  # version 2
    (cards / U1).write_bytes(bytes(foreign))
    with caplog.at_level(logging.WARNING):
        found = cr.scan_cards(str(tmp_path))
        cr.scan_cards(str(tmp_path))
    assert list(found) == [U0] and list(found[U0].slots) == [7]
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == 2, skipped  # one line per file, not one per scrape
    assert any("version 2" in m for m in skipped)
    assert cr.scan_cards(str(tmp_path / "nothing")) == {}
    with pytest.raises(cr.CardRegionError):
        cr.parse_card_region(b"\0" * cr.CARD_REGION_SIZE)


def _world(tmp_path: Path) -> dict[str, PodShares]:
    """Two shares on U0 (one busy at 25 %, one idle) and one on U1 without a card region."""
    shares = {}
    slots = []
    for uid, uuid, busy in (("uid-a", U0, True), ("uid-b", U0, False), ("uid-c", U1, True)):
        folder = tmp_path / "containers" / f"{uid}_main"
        folder.mkdir(parents=True)
        (folder / "region").write_bytes(region_bytes([(uuid, 4096 * MIB, 1000 * MIB)]))
        entry = ContainerAllocation("main", False, (CardShare(uuid, 0, 4096, 30),))
        shares[uid] = PodShares("team", f"pod-{uid}", uid, "high", "strict", False,
                                Allocation(containers=(entry,)))
        if uuid == U0:
            slots.append({"owner": cr.share_owner(f"{uid}_main"), "cores": 30,
                          "use_ppm": 250_000, "inflight_n": 0,
                          "last_active_ns": NOW - (10**8 if busy else 10 * cr.IDLE_NS)})
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / U0).write_bytes(card_region_bytes(U0, slots))
    return shares


def _samples(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_compute_and_heartbeat_metrics(tmp_path: Path) -> None:
    shares = _world(tmp_path)
    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources(
        "node-1", lambda: CARDS, lambda: shares, regions_under(str(tmp_path)),
        lambda u: None, lambda u: None, card_regions=lambda: cr.scan_cards(str(tmp_path)),
        heartbeat=lambda: 1_700_000_000.0, now_ns=lambda: NOW)))
    samples = _samples(generate_latest(registry).decode())
    per_pod = {s.labels["pod"]: s.value for s in samples[METRIC_CONTAINER_COMPUTE_USED]}
    assert per_pod == {"pod-uid-a": 25.0, "pod-uid-b": 0.0}  # uid-c: its card has no region
    per_card = {s.labels["UUID"]: s.value for s in samples[METRIC_CARD_COMPUTE_USED]}
    assert per_card == {U0: 25.0}
    (beat,) = samples[METRIC_NODE_HEARTBEAT]
    assert beat.labels == {"Hostname": "node-1"} and beat.value == 1_700_000_000.0


def test_nvml_utilisation_wins_and_no_heartbeat_no_sample(tmp_path: Path) -> None:
    shares = _world(tmp_path)
    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources(
        "node-1", lambda: CARDS, lambda: shares, regions_under(str(tmp_path)),
        lambda u: 5 * MIB, lambda u: 70, card_regions=lambda: cr.scan_cards(str(tmp_path)),
        now_ns=lambda: NOW)))
    samples = _samples(generate_latest(registry).decode())
    assert {s.value for s in samples[METRIC_CARD_COMPUTE_USED]} == {70.0}
    assert samples[METRIC_NODE_HEARTBEAT] == []


def test_usage_annotation_goes_with_the_heartbeat(tmp_path: Path) -> None:
    _world(tmp_path)
    usage = node_usage(CARDS, scan(str(tmp_path)), cr.scan_cards(str(tmp_path)),
                       lambda u: 3000 * MIB if u == U0 else None, lambda u: None, NOW)
    assert [(c.uuid, c.memory_used_mib, c.compute_used_percent) for c in usage.cards] == [
        (U0, 3000, 25.0), (U1, 1000, 0.0)]
    assert [(s.pod_uid, s.container, s.uuid, s.memory_used_mib, s.compute_used_percent)
            for s in usage.shares] == [("uid-a", "main", U0, 1000, 25.0),
                                       ("uid-b", "main", U0, 1000, 0.0),
                                       ("uid-c", "main", U1, 1000, 0.0)]
    patch = inventory_patch(CARDS, datetime(2024, 1, 2, tzinfo=UTC), usage)
    annotations = patch["metadata"]["annotations"]
    assert NodeUsage.decode(annotations[ANN_USAGE]) == usage
    assert ANN_USAGE not in inventory_patch(CARDS, datetime.now(UTC))["metadata"]["annotations"]


def test_layout_matches_the_compiler(tmp_path: Path) -> None:
    """The offsets read here are card_region.h's (libinterpose/tests/compute_layout.c)."""
    source = REPO / "libinterpose" / "tests" / "compute_layout.c"
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None or not source.exists():
        pytest.fail("no C compiler or no libinterpose/tests/compute_layout.c (README: gcc)")
    binary = tmp_path / "layout"
    subprocess.run([gcc, "-std=c11", "-I", str(REPO / "libinterpose" / "src"), "-I",
                    str(REPO / "libinterpose" / "include"), str(source), "-o", str(binary),
                    "-pthread"], check=True, capture_output=True)
    layout = {}
    for line in subprocess.run([str(binary)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        name, offset, size = line.split()
        layout[name] = (int(offset), int(size))
    assert layout["region.size"][1] == cr.CARD_REGION_SIZE
    assert layout["slot.size"][1] == cr.SLOT_SIZE
    assert layout["magic"][1] == cr.CARD_MAGIC and layout["version"][1] == cr.CARD_VERSION
    assert layout["header.slot"][0] == cr.HEADER_SIZE
    for name, (offset, size) in {"magic": (0, 8), "version": (8, 4), "size": (12, 4),
                                 "nslots": (16, 4), "slot_size": (20, 4),
                                 "uuid": (24, 64)}.items():
        assert layout[f"header.{name}"] == (offset, size), name
    for name, offset, code in cr.SLOT_FIELDS:
        assert layout[f"slot.{name}"] == (offset, struct.calcsize("<" + code)), name
