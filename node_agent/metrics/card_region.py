"""Read the per-card regions (libinterpose/src/card_region.h, version 1): each share's measured
compute use on a card.

``<RUNTIME_DIR>/cards/<uuid>`` is mapped by every share (container) on the card; the interposer
keeps one 512-byte slot per share, owned by ``owner = FNV-1a 64(the share's container region
path, as the container sees it)``. The node agent maps the file read-only and takes no lock
(every field it reads is an aligned 32- or 64-bit word: never torn; two fields may be from two
moments, fine for a metric). A missing, short or foreign file (other magic, version or sizes)
is skipped with one log line. Layout, little-endian (offsets in bytes)::

    header (4096): u64 magic "EGPUCARD" (0x4452414355504745) @0 | u32 version (1) @8
                   | u32 size (4096 + 512 * 32) @12 | u32 nslots (32) @16 | u32 slot_size (512)
                   @20 | char uuid[64] @24 | ... mutex @128, priority state @192
    slot[32] (512 each, from 4096): u64 owner (0 = free) @0 | i32 pids[16] @8 | u32 cores @80
                   | u64 busy_total_ns @176 | u64 last_active_ns @200 | u64 use_ppm @216
                   | u64 inflight_n @256 | ... (see card_region.h)

Compute used by a share = its ``use_ppm`` (the controller's smoothed measured GPU time, ppm of
wall time) while it is active (launches in flight, or one within ``IDLE_NS``), else 0: the
controller only updates ``use_ppm`` on launches, so an idle share keeps its last value.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from dataclasses import dataclass

from egpu.contract import CARDS_SUBDIR, CONTAINER_REGION_FILE, CONTAINERS_SUBDIR, RUNTIME_DIR
from node_agent.metrics.region import NotARegionFile, open_regular

log = logging.getLogger("egpu-node-agent.card-region")

CARD_MAGIC = 0x4452414355504745
CARD_VERSION = 1
HEADER_SIZE = 4096
SLOT_SIZE = 512
NSLOTS = 32
CARD_REGION_SIZE = HEADER_SIZE + SLOT_SIZE * NSLOTS
HEADER = struct.Struct("<QIIII64s")  # magic, version, size, nslots, slot_size, uuid
# (name, offset, struct code) of the slot fields read here; tests check them against the
# compiler's layout (libinterpose/tests/compute_layout.c) where gcc is available.
SLOT_FIELDS = (("owner", 0, "Q"), ("cores", 80, "I"), ("busy_total_ns", 176, "Q"),
               ("last_active_ns", 200, "Q"), ("use_ppm", 216, "Q"), ("inflight_n", 256, "Q"))
_SLOT = [(name, offset, struct.Struct("<" + code)) for name, offset, code in SLOT_FIELDS]
PPM = 1_000_000
IDLE_NS = 1_000_000_000  # a share with no launch for this long (and none in flight) uses 0 %


class CardRegionError(ValueError):
    """The file is not a version-1 card region."""


@dataclass(frozen=True)
class SlotUse:
    """One share's slot: ``owner`` (FNV-1a of its region path), booked ``cores`` (%), and the
    measurement (GPU ns, CLOCK_MONOTONIC ns, ppm)."""

    owner: int
    cores: int
    busy_total_ns: int
    last_active_ns: int
    use_ppm: int
    inflight_n: int

    def used_percent(self, now_ns: int) -> float:
        """Measured compute use, % of the card (0 when idle; see the module docstring)."""
        active = self.inflight_n > 0 or (
            self.last_active_ns > 0 and now_ns - self.last_active_ns <= IDLE_NS)
        return round(min(self.use_ppm, PPM) * 100 / PPM, 2) if active else 0.0


@dataclass(frozen=True)
class CardRegion:
    """The occupied slots of one card's region, by owner."""

    uuid: str
    slots: dict[int, SlotUse]

    def used_percent(self, now_ns: int) -> float:
        """The shares' measured compute together, % of the card (at most 100)."""
        return min(100.0, round(sum(s.used_percent(now_ns) for s in self.slots.values()), 2))


def owner_id(key: str) -> int:
    """``egpu_owner_id``: FNV-1a 64 of ``key`` (UTF-8), never 0."""
    h = 0xCBF29CE484222325
    for byte in key.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h or 1


def share_owner(dir_name: str) -> int:
    """The slot owner of the share whose accounting folder is ``<pod-uid>_<container>``: the
    interposer keys it by its config's ``container_region`` (the in-container path)."""
    return owner_id(f"{RUNTIME_DIR}/{CONTAINERS_SUBDIR}/{dir_name}/{CONTAINER_REGION_FILE}")


def parse_card_region(data: bytes | mmap.mmap) -> CardRegion:
    """Parse a whole card region. Raises CardRegionError."""
    if len(data) < HEADER.size:
        raise CardRegionError(f"too short: {len(data)} bytes")
    magic, version, size, nslots, slot_size, raw_uuid = HEADER.unpack_from(data, 0)
    if magic != CARD_MAGIC:
        raise CardRegionError(f"bad magic {magic:#x}")
    if (version, size, nslots, slot_size) != (CARD_VERSION, CARD_REGION_SIZE, NSLOTS,
                                                SLOT_SIZE):
        raise CardRegionError(
            f"version {version} size {size} slots {nslots}x{slot_size}; this agent reads "
            f"version {CARD_VERSION} size {CARD_REGION_SIZE} slots {NSLOTS}x{SLOT_SIZE}")
    if len(data) < CARD_REGION_SIZE:
        raise CardRegionError(f"too short: {len(data)} bytes, need {CARD_REGION_SIZE}")
    slots = {}
    for i in range(NSLOTS):
        base = HEADER_SIZE + i * SLOT_SIZE
        fields = {name: s.unpack_from(data, base + offset)[0] for name, offset, s in _SLOT}
        if fields["owner"]:
            slots[fields["owner"]] = SlotUse(**fields)
    return CardRegion(raw_uuid.split(b"\0", 1)[0].decode(errors="replace"), slots)


class EmptyCardRegion(CardRegionError):
    """The file is empty: the runtime hook created it and no share has initialised it yet."""


def read_card_region(path: str, *, dir_fd: int | None = None) -> CardRegion:
    """Read ``path`` (relative to ``dir_fd`` when given) and parse it. The file is opened
    without blocking or following a link and must be a regular file of at least
    CARD_REGION_SIZE bytes; it is read with pread, not mapped (a share that truncates its
    bind-mounted file could otherwise kill the agent with SIGBUS). Raises OSError or
    CardRegionError (EmptyCardRegion for an empty file)."""
    try:
        fd = open_regular(path, dir_fd=dir_fd)
    except NotARegionFile as exc:
        raise CardRegionError(str(exc)) from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise EmptyCardRegion("empty (not initialised yet)")
        if size < CARD_REGION_SIZE:
            raise CardRegionError(f"too short: {size} bytes")
        return parse_card_region(os.pread(fd, CARD_REGION_SIZE, 0))
    finally:
        os.close(fd)


_reported: dict[str, str] = {}


def scan_cards(runtime_dir: str) -> dict[str, CardRegion]:
    """Every readable card region under ``<runtime_dir>/cards``: card UUID -> region. A file
    that cannot be read or is not a v1 card region is skipped, with one log line (per file
    and reason)."""
    folder = os.path.join(runtime_dir, CARDS_SUBDIR)
    out: dict[str, CardRegion] = {}
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return out
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("card regions %s skipped: %s", folder, exc)
        return out
    try:
        for name in names:
            _scan_one(folder, dir_fd, name, out)
    finally:
        os.close(dir_fd)
    return out


def _scan_one(folder: str, dir_fd: int, name: str, out: dict[str, CardRegion]) -> None:
    """Read one card region into ``out``; errors are logged once per file and reason."""
    path = os.path.join(folder, name)
    try:
        region = read_card_region(name, dir_fd=dir_fd)
    except EmptyCardRegion:
        return
    except (OSError, CardRegionError) as exc:
        if _reported.get(path) != str(exc):
            _reported[path] = str(exc)
            log.warning("card region %s skipped: %s", path, exc)
        return
    _reported.pop(path, None)
    out[region.uuid or name] = region
