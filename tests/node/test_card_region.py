"""node_agent.metrics.card_region, the compute and heartbeat metrics and the egpu.io/usage
annotation: card folders (a roster and share files, egpu.card_roster) built in Python,
checked against the compiler (libinterpose/src/card_region.h)."""

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

from egpu import card_roster
from egpu.card_roster import RosterEntry
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


def share_bytes(owner: int, **fields: int) -> bytes:
    """A share file (card_region.h's egpu_card_slot, 4096 bytes): ``owner`` and the public
    ``fields`` (card_roster.SHARE_FIELDS names) set, the rest zero."""
    data = bytearray(card_roster.SHARE_FILE_SIZE)
    values = {"owner": owner, **fields}
    for name, offset, code in card_roster.SHARE_FIELDS:
        struct.pack_into("<" + code, data, offset, values.get(name, 0))
    return bytes(data)


def make_card(runtime: Path, uuid: str,
              shares: list[tuple[RosterEntry, dict[str, int] | None]]) -> Path:
    """A card folder as the hook leaves it: each entry registered in the roster, and its
    share file holding ``fields`` as its interposer would (None: left as the hook made it,
    all zeros)."""
    folder = runtime / "cards" / uuid
    folder.mkdir(parents=True, exist_ok=True)
    for entry, fields in shares:
        card_roster.register(str(folder), uuid, entry)
        if fields is not None:
            (folder / card_roster.share_file_name(entry.owner)).write_bytes(
                share_bytes(entry.owner, **fields))
    return folder


def test_slot_use_is_zero_when_idle() -> None:
    slot = cr.SlotUse(owner=1, cores=30, busy_total_ns=0, last_active_ns=NOW - 10**8,
                      use_ppm=300_000, inflight_n=0)
    assert slot.used_percent(NOW) == 30.0
    assert slot.used_percent(NOW + 2 * cr.IDLE_NS) == 0.0
    # launches in flight, the last completed just now: active, however long ago it launched
    later = NOW + 10 * cr.IDLE_NS
    busy = cr.SlotUse(1, 30, 0, 1, 2_000_000, 1, last_complete_ns=later - 10**6)
    assert busy.used_percent(later) == 100.0


def test_a_share_killed_with_work_in_flight_reads_idle_after_the_quiet_time(
        tmp_path: Path) -> None:
    """A share whose last process was SIGKILLed with groups in flight keeps inflight_n > 0 and
    its last use_ppm in its file until a process of it launches again: the exporter counted it
    active, at that use, forever (the bug). It counts its launches in flight only until they
    are quiet for the interposer's own expiry (libinterpose/src/card_region.h,
    egpu_inflight_stale): 250 ms, or 8 launch estimates when longer, since the last completion
    or the start of the outstanding period."""
    QUIET_NS = 250_000_000  # the interposer's EGPU_INFLIGHT_QUIET_NS
    killed, slow = (RosterEntry(card_roster.share_owner(f"u{n}_main"), cores=60,
                                name=f"u{n}_main") for n in range(2))
    dead = {"use_ppm": 600_000, "inflight_n": 3, "last_active_ns": NOW - 2 * cr.IDLE_NS,
            "inflight_since_ns": NOW - 2 * cr.IDLE_NS, "est_ns": 1_000_000,
            "last_complete_ns": NOW - QUIET_NS - 1}
    # 200 ms kernels: 8 estimates (1.6 s) without news before they are forgotten
    long_kernels = {**dead, "est_ns": 1_000, "est_graph_ns": 200_000_000}
    make_card(tmp_path, U0, [(killed, dead), (slow, long_kernels)])
    slots = cr.scan_cards(str(tmp_path))[U0].slots
    assert slots[killed.owner].inflight_n == 3
    assert slots[killed.owner].used_percent(NOW) == 0.0
    assert slots[killed.owner].used_percent(NOW - 2) == 60.0  # quiet 1 ns short of the expiry
    assert slots[slow.owner].used_percent(NOW) == 60.0
    assert slots[slow.owner].used_percent(NOW + 8 * 200_000_000) == 0.0
    assert cr.scan_cards(str(tmp_path))[U0].used_percent(NOW) == 60.0


def test_cores_come_from_the_roster_and_a_lying_share_counts_as_idle(tmp_path: Path) -> None:
    """The share file is its container's to write: it may claim other cores, another owner,
    a use above 100 % or be cut short. The agent believes the roster for the cores, clamps
    the use (to the card; a strict share to its cap + 3 points), and reads a foreign or short
    file as an idle share."""
    honest, greedy, foreign, short, fresh = (RosterEntry(card_roster.share_owner(f"u{n}_main"),
                                                         cores=10 * (n + 1), name=f"u{n}_main")
                                             for n in range(5))
    busy = {"last_active_ns": NOW - 10**8, "busy_total_ns": 5}
    folder = make_card(tmp_path, U0, [
        (honest, {**busy, "use_ppm": 100_000, "cores": 99}),
        (greedy, {**busy, "use_ppm": 10**12, "inflight_n": 3}),
        (foreign, {**busy, "use_ppm": 500_000}),
        (short, {**busy, "use_ppm": 500_000}),
        (fresh, None)])
    share = folder / card_roster.share_file_name(foreign.owner)
    share.write_bytes(share_bytes(honest.owner, **busy, use_ppm=500_000))  # claims another
    (folder / card_roster.share_file_name(short.owner)).write_bytes(
        share_bytes(short.owner, **busy, use_ppm=500_000)[:300])
    region = cr.scan_cards(str(tmp_path))[U0]
    slots = region.slots
    assert set(slots) == {e.owner for e in (honest, greedy, foreign, short, fresh)}
    assert slots[honest.owner] == cr.SlotUse(honest.owner, 10, 5, NOW - 10**8, 100_000, 0,
                                             reported_ppm=100_000)
    # a strict 20 % share: decisions believe at most its cap and the slack of FC-13,
    # whatever it claims; monitoring shows what it claims, and that it is over its cap
    greedy_slot = slots[greedy.owner]
    assert greedy_slot.use_ppm == 230_000 and greedy_slot.cores == 20
    assert greedy_slot.reported_percent(NOW) == 10**8 and greedy_slot.over_cap(NOW)
    assert not slots[honest.owner].over_cap(NOW)
    for idle in (foreign, short, fresh):
        assert slots[idle.owner] == cr.SlotUse(idle.owner, idle.cores, 0, 0, 0, 0)
    assert region.used_percent(NOW) == 33.0  # 10 % + 23 %


def test_read_skips_missing_malformed_and_old_format_cards(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    owner = card_roster.share_owner("uid_main")
    make_card(tmp_path, U0, [(RosterEntry(owner), {"use_ppm": 10})])
    cards = tmp_path / "cards"
    (cards / "GPU-old").write_bytes(b"EGPUCARD" + bytes(100))  # the previous version's file
    (cards / U1).mkdir()
    (cards / U1 / "roster").write_bytes(b"\1" * card_roster.ROSTER_SIZE)
    (cards / "GPU-making").mkdir()  # the hook is making it: no roster yet, skipped quietly
    with caplog.at_level(logging.WARNING):
        found = cr.scan_cards(str(tmp_path))
        cr.scan_cards(str(tmp_path))
    assert list(found) == [U0] and list(found[U0].slots) == [owner]
    assert found[U0].slots[owner].use_ppm == 10
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == 2, skipped  # one line per path, not one per scrape
    assert any("GPU-old" in m and "previous version" in m for m in skipped)
    assert any(U1 in m and "not a roster" in m for m in skipped)
    assert cr.scan_cards(str(tmp_path / "nothing")) == {}


def _world(tmp_path: Path) -> dict[str, PodShares]:
    """Two shares on U0 (one busy at 25 %, one idle) and one on U1 without a card folder."""
    shares = {}
    on_u0 = []
    for uid, uuid, busy in (("uid-a", U0, True), ("uid-b", U0, False), ("uid-c", U1, True)):
        folder = tmp_path / "containers" / f"{uid}_main"
        folder.mkdir(parents=True)
        (folder / "region").write_bytes(region_bytes([(uuid, 4096 * MIB, 1000 * MIB)]))
        entry = ContainerAllocation("main", False, (CardShare(uuid, 0, 4096, 30),))
        shares[uid] = PodShares("team", f"pod-{uid}", uid, "high", "strict", False,
                                Allocation(containers=(entry,)))
        if uuid == U0:
            on_u0.append((RosterEntry(card_roster.share_owner(f"{uid}_main"), cores=30,
                                      name=f"{uid}_main"),
                          {"use_ppm": 250_000, "inflight_n": 0,
                           "last_active_ns": NOW - (10**8 if busy else 10 * cr.IDLE_NS)}))
    make_card(tmp_path, U0, on_u0)
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
    assert per_pod == {"pod-uid-a": 25.0, "pod-uid-b": 0.0}  # uid-c: its card has no folder
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


def test_the_heartbeat_says_which_config_the_agent_runs() -> None:
    from egpu.contract import ANN_CONFIG

    patch = inventory_patch(CARDS, datetime.now(UTC), config="3fa9c2e1b7d0 last-good")
    assert patch["metadata"]["annotations"][ANN_CONFIG] == "3fa9c2e1b7d0 last-good"
    assert ANN_CONFIG not in inventory_patch(CARDS, datetime.now(UTC))["metadata"]["annotations"]


LAYOUT_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "card_region.h"
#define F(t, p, f) printf(p ".%s %zu %zu\n", #f, offsetof(t, f), sizeof(((t *)0)->f));
#define S(f) F(egpu_card_slot, "slot", f)
#define R(f) F(egpu_card_roster, "roster", f)
#define E(f) F(egpu_roster_entry, "entry", f)
int main(void)
{
    printf("size.roster 0 %zu\nsize.entry 0 %zu\nsize.slot 0 %zu\n", sizeof(egpu_card_roster),
           sizeof(egpu_roster_entry), sizeof(egpu_card_slot));
    printf("const.magic 0 %llu\nconst.version 0 %u\nconst.slots 0 %d\nconst.public 0 %d\n"
           "const.raw 0 %u\n", (unsigned long long)EGPU_ROSTER_MAGIC, EGPU_ROSTER_VERSION,
           EGPU_CARD_SLOTS, EGPU_SLOT_PUBLIC_BYTES, EGPU_ROSTER_RAW);
    printf("const.prio_low 0 %d\nconst.elastic 0 %d\n", EGPU_CARD_PRIO_LOW, EGPU_CARD_ELASTIC);
    printf("name.roster 0 %s\nname.prefix 0 %s\n", EGPU_ROSTER_FILE, EGPU_SHARE_FILE_PREFIX);
    R(magic) R(version) R(nslots) R(entry_size) R(header_size) R(generation) R(uuid) R(entry)
    E(owner) E(priority) E(policy) E(cores) E(floor_pct) E(flags) E(reserved) E(name)
    S(owner) S(priority) S(policy) S(cores) S(flags) S(floor_pct) S(rate_ppm) S(level_ns)
    S(est_ns) S(busy_total_ns) S(launches_total) S(wait_total_ns) S(last_active_ns)
    S(busy_until_ns) S(use_ppm) S(demand_ppm) S(inflight_n) S(inflight_since_ns)
    S(est_graph_ns) S(overlapped_total) S(last_complete_ns) S(events_total) S(queued_until_ns)
    S(hi_mark_ns) S(mu)
    return 0;
}
"""


def test_layout_matches_the_compiler(tmp_path: Path) -> None:
    """egpu.card_roster's roster and share-file offsets are card_region.h's."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.fail("no C compiler (README: gcc)")
    source, binary = tmp_path / "layout.c", tmp_path / "layout"
    source.write_text(LAYOUT_C)
    subprocess.run([gcc, "-std=c11", "-I", str(REPO / "libinterpose" / "src"), "-I",
                    str(REPO / "libinterpose" / "include"), str(source), "-o", str(binary),
                    "-pthread"], check=True, capture_output=True)
    layout: dict[str, tuple[str, str]] = {}
    for line in subprocess.run([str(binary)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        name, offset, size = line.split()
        layout[name] = (offset, size)

    def number(name: str) -> int:
        return int(layout[name][1])

    assert number("size.roster") == card_roster.ROSTER_SIZE
    assert number("size.entry") == card_roster.ENTRY_SIZE
    assert number("size.slot") == card_roster.SHARE_FILE_SIZE
    assert (number("const.magic"), number("const.version"), number("const.slots"),
            number("const.public"), number("const.raw")) == (
        card_roster.ROSTER_MAGIC, card_roster.ROSTER_VERSION, card_roster.NSLOTS,
        card_roster.SLOT_PUBLIC_BYTES, card_roster.FLAG_RAW)
    assert (number("const.prio_low"), number("const.elastic")) == (
        card_roster.PRIORITY_LOW, card_roster.POLICY_ELASTIC)
    assert layout["name.roster"][1] == card_roster.ROSTER_FILE
    assert layout["name.prefix"][1] == card_roster.SHARE_FILE_PREFIX
    assert int(layout["slot.mu"][0]) == card_roster.SLOT_PUBLIC_BYTES  # nothing private read

    def at(name: str) -> tuple[int, int]:
        offset, size = layout[name]
        return int(offset), int(size)

    roster = {"magic": (0, 8), "version": (8, 4), "nslots": (12, 4), "entry_size": (16, 4),
              "header_size": (20, 4), "generation": (24, 8), "uuid": (32, 64),
              "entry": (card_roster.HEADER_SIZE, card_roster.ENTRY_SIZE * card_roster.NSLOTS)}
    for name, want in roster.items():
        assert at(f"roster.{name}") == want, name
    entry = {"owner": (0, 8), "priority": (8, 4), "policy": (12, 4), "cores": (16, 4),
             "floor_pct": (20, 4), "flags": (24, 4), "reserved": (28, 4),
             "name": (32, card_roster.NAME_BYTES)}
    for name, want in entry.items():
        assert at(f"entry.{name}") == want, name
    for name, offset, code in card_roster.SHARE_FIELDS:
        assert at(f"slot.{name}") == (offset, struct.calcsize("<" + code)), name
