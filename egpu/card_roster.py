"""The per-card roster and the public part of share files: the one codec of both
(libinterpose/src/card_region.h; docs/security.md, "Node-side state").

Per card, the node keeps a folder ``<RUNTIME_DIR>/cards/<uuid>/`` (root's, 0755), mounted
read-only into every container with a share of the card. It holds:

- ``roster`` (ROSTER_SIZE bytes, 0644): written only by the node (the runtime hook adds a
  share, the node agent removes a deleted pod's), in place, under an exclusive ``flock`` on
  the file (the interposer takes the same one when it registers itself on a raw node). One
  64-byte entry per share; the entry's index is the share's slot. Little-endian::

      header (128): u64 magic "EGPUROST" @0 | u32 version (1) @8 | u32 nslots (32) @12
                    | u32 entry_size (64) @16 | u32 header_size (128) @20 | u64 generation @24
                    | char uuid[64] @32 | pad to 128
      entry[32] (64 each, from 128): u64 owner (0 = free) @0 | u32 priority (0 high, 1 low) @8
                    | u32 policy (0 strict, 1 elastic) @12 | u32 cores (0..100) @16
                    | u32 floor_pct @20 | u32 flags (1 = RAW) @24 | u32 reserved @28
                    | char name[32] @32 (the share's folder name, NUL-padded, <= 31 bytes)

- ``share-<owner:016x>`` (SHARE_FILE_SIZE bytes, 0666): one share's slot, written by that
  share alone (mounted read-write into its own container only). Others read its first
  SLOT_PUBLIC_BYTES (``SHARE_FIELDS``) with one bounded pread and believe it only about that
  share, and only if its owner field is the share's.

Every file here is opened relative to the card folder's descriptor, without following a
symlink and without blocking (a FIFO is refused before it is opened), and must be a regular
file (and, to be written, have one link); nothing is ever mapped. A writer commits an entry by
its owner word: a new entry's terms are written before its owner, a freed entry's owner is
cleared first, so a reader without the lock sees a free entry or a whole one (a share's
changed terms are rewritten in place: aligned words, each old or new). ``generation`` is
bumped after each change.

The node's writers (hook, node agent) first serialize on an ``flock`` of the card folder's
parent (``<RUNTIME_DIR>/cards``, never mounted into a container); the roster's own ``flock``,
which a container can take through its read-only mount, is waited for at most
ROSTER_LOCK_WAIT_S: a tenant holding it cannot stop the node from adding or removing shares.

Standard library (``os``, ``struct``, ``fcntl``, ``stat``, ``time``, ``errno``) and
egpu.contract only, no ``dataclasses`` or ``typing`` at run time: the runtime hook imports it
to register a share (tests/runtime_hook/test_hook_startup.py).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time

from egpu.contract import container_region_path
from egpu.records import _Record
from egpu.safefile import NotRegularFile, open_regular

TYPE_CHECKING = False  # no typing at run time: the hook's startup
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import ClassVar

ROSTER_FILE = "roster"
SHARE_FILE_PREFIX = "share-"
ROSTER_MAGIC = 0x54534F5255504745  # "EGPUROST" as little-endian bytes
ROSTER_VERSION = 1
NSLOTS = 32  # EGPU_CARD_SLOTS
HEADER_SIZE = 128
ENTRY_SIZE = 64
ROSTER_SIZE = HEADER_SIZE + ENTRY_SIZE * NSLOTS  # 2176
NAME_BYTES = 32  # the entry's name field; at most NAME_BYTES - 1 bytes of name
UUID_BYTES = 64
SHARE_FILE_SIZE = 4096  # sizeof(egpu_card_slot)
SLOT_PUBLIC_BYTES = 512  # EGPU_SLOT_PUBLIC_BYTES: what others read of a share file
OWNER_KEY_BYTES = 511  # the interposer keys a share by at most this much of its region path

CARD_DIR_MODE = 0o755  # root's; mounted read-only into the card's containers
ROSTER_MODE = 0o644
SHARE_FILE_MODE = 0o666  # the container's processes may run as any uid

PRIORITY_HIGH, PRIORITY_LOW = 0, 1  # EGPU_CARD_PRIO_*
POLICY_STRICT, POLICY_ELASTIC = 0, 1  # EGPU_CARD_STRICT / _ELASTIC
PRIORITY_CODES = {"high": PRIORITY_HIGH, "low": PRIORITY_LOW}
POLICY_CODES = {"strict": POLICY_STRICT, "elastic": POLICY_ELASTIC}
FLAG_RAW = 0x1  # EGPU_ROSTER_RAW: registered by the interposer itself (raw node, no hook)

NODE_LOCK_WAIT_S = 10.0  # the node writers' own lock (cards folder): then RosterLockError
# The roster's flock (a tenant can take it through its read-only mount): then go on without it.
# It only orders the node against raw processes of the host that register themselves (egpu run
# beside pods, rare); a tenant holding it must not add a second to every container's start.
ROSTER_LOCK_WAIT_S = 0.05

_HEADER = struct.Struct("<QIIIIQ64s32x")  # magic, version, nslots, entry_size, header_size,
# generation, uuid
_ENTRY = struct.Struct("<QIIIIII32s")  # owner, priority, policy, cores, floor_pct, flags,
# reserved, name
_U64 = struct.Struct("<Q")
_GENERATION_OFFSET = 24

# (name, offset, struct code) of the public fields of a share file (the first
# SLOT_PUBLIC_BYTES of egpu_card_slot); tests check them against the compiler's layout.
SHARE_FIELDS = (
    ("owner", 0, "Q"), ("priority", 72, "I"), ("policy", 76, "I"), ("cores", 80, "I"),
    ("flags", 84, "I"), ("floor_pct", 88, "I"), ("rate_ppm", 92, "I"), ("level_ns", 96, "q"),
    ("est_ns", 128, "Q"), ("busy_total_ns", 176, "Q"), ("launches_total", 184, "Q"),
    ("wait_total_ns", 192, "Q"), ("last_active_ns", 200, "Q"), ("busy_until_ns", 208, "Q"),
    ("use_ppm", 216, "Q"), ("demand_ppm", 224, "Q"), ("inflight_n", 256, "Q"),
    ("inflight_since_ns", 264, "Q"), ("est_graph_ns", 272, "Q"), ("overlapped_total", 296, "Q"),
    ("last_complete_ns", 304, "Q"), ("events_total", 320, "Q"), ("queued_until_ns", 328, "Q"),
    ("hi_mark_ns", 344, "Q"),
)
_SHARE = [(name, offset, struct.Struct("<" + code)) for name, offset, code in SHARE_FIELDS]

assert _HEADER.size == HEADER_SIZE and _ENTRY.size == ENTRY_SIZE


class RosterError(OSError):
    """A card's roster or share file cannot be used: missing pieces, a symlink, FIFO or other
    non-regular file, a malformed roster (magic, version, sizes, another card's UUID), a full
    card. The message names the card folder or file and what was expected."""


class RosterFormatError(RosterError):
    """The roster file is short or not a version-1 roster of this layout."""


class CardFullError(RosterError):
    """Every slot of the card's roster is taken."""


class RosterLockError(RosterError):
    """Another node writer held the card folder's lock for over NODE_LOCK_WAIT_S."""


def owner_id(key: str) -> int:
    """``egpu_owner_id``: FNV-1a 64 of ``key`` (UTF-8), never 0."""
    h = 0xCBF29CE484222325
    for byte in key.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h or 1


def region_owner(container_region: str) -> int:
    """The owner of the share whose container region path (as the container sees it, the
    interposer's config ``container_region``) is ``container_region``: the interposer keys it
    by at most OWNER_KEY_BYTES bytes of it."""
    key = container_region.encode()[:OWNER_KEY_BYTES].decode(errors="ignore")
    return owner_id(key)


def share_owner(dir_name: str) -> int:
    """The owner of the share whose accounting folder is ``<pod-uid>_<container>``."""
    return region_owner(container_region_path(dir_name))


def share_file_name(owner: int) -> str:
    """``share-<owner as 16 lowercase hex digits>``."""
    return f"{SHARE_FILE_PREFIX}{owner:016x}"


def _truncate_name(name: str) -> str:
    return name.encode()[:NAME_BYTES - 1].decode(errors="ignore")


def name_matches_prefix(name: str, prefix: str) -> bool:
    """Whether an entry's ``name`` (a folder name cut to NAME_BYTES - 1 bytes) may be that of
    a folder whose name starts with ``prefix``: for a cut name, its whole text is a prefix of
    ``prefix`` or starts with it."""
    if not name:
        return False
    if len(name.encode()) < NAME_BYTES - 1:
        return name.startswith(prefix)
    return name.startswith(prefix) or prefix.startswith(name)


class RosterEntry(_Record):
    """One share in a roster: owner (never 0), priority (PRIORITY_*), policy (POLICY_*),
    cores (%, 0..100), floor_pct (0..100), flags (FLAG_*), name (its folder name, cut to
    NAME_BYTES - 1 bytes of UTF-8). Immutable, with equality, hash, repr and
    ``replace(**changes)`` over the fields: egpu.records' record base, as every record."""

    __slots__ = ("cores", "flags", "floor_pct", "name", "owner", "policy", "priority")
    _FIELDS: ClassVar[tuple[str, ...]] = (
        "owner", "priority", "policy", "cores", "floor_pct", "flags", "name")
    owner: int
    priority: int
    policy: int
    cores: int
    floor_pct: int
    flags: int
    name: str

    def __init__(self, owner: int, priority: int = PRIORITY_HIGH, policy: int = POLICY_STRICT,
                 cores: int = 0, floor_pct: int = 0, flags: int = 0, name: str = "") -> None:
        for field, value, low, high in (("owner", owner, 1, (1 << 64) - 1),
                                        ("priority", priority, 0, 1), ("policy", policy, 0, 1),
                                        ("cores", cores, 0, 100),
                                        ("floor_pct", floor_pct, 0, 100),
                                        ("flags", flags, 0, (1 << 32) - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"roster entry {field}: {value!r}; allowed: {low}..{high}")
        set_ = object.__setattr__
        set_(self, "owner", owner)
        set_(self, "priority", priority)
        set_(self, "policy", policy)
        set_(self, "cores", cores)
        set_(self, "floor_pct", floor_pct)
        set_(self, "flags", flags)
        set_(self, "name", _truncate_name(name))

    def encode(self) -> bytes:
        """The entry's 64 bytes."""
        return _ENTRY.pack(self.owner, self.priority, self.policy, self.cores, self.floor_pct,
                           self.flags, 0, self.name.encode())


class Roster:
    """A decoded roster: the card's uuid, generation, and entries (NSLOTS of them, index =
    slot, None = free). Immutable, as RosterEntry."""

    __slots__ = ("entries", "generation", "uuid")
    uuid: str
    generation: int
    entries: tuple[RosterEntry | None, ...]

    def __init__(self, uuid: str, generation: int = 0,
                 entries: tuple[RosterEntry | None, ...] | None = None) -> None:
        if entries is None:
            entries = (None,) * NSLOTS
        if len(entries) != NSLOTS:
            raise ValueError(f"a roster has {NSLOTS} entries, not {len(entries)}")
        object.__setattr__(self, "uuid", uuid)
        object.__setattr__(self, "generation", generation)
        object.__setattr__(self, "entries", tuple(entries))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: Roster is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Roster):
            return NotImplemented
        return (self.uuid, self.generation, self.entries) == (
            other.uuid, other.generation, other.entries)

    def __hash__(self) -> int:
        return hash((self.uuid, self.generation, self.entries))

    def __repr__(self) -> str:
        return (f"Roster(uuid={self.uuid!r}, generation={self.generation!r}, "
                f"shares={self.shares()!r})")

    def uuid_field(self) -> str:
        """The uuid as the roster stores it (at most UUID_BYTES - 1 bytes)."""
        return self.uuid.encode()[:UUID_BYTES - 1].decode(errors="ignore")

    def shares(self) -> dict[int, RosterEntry]:
        """slot -> entry, occupied slots only."""
        return {i: e for i, e in enumerate(self.entries) if e is not None}

    def slot_of(self, owner: int) -> int | None:
        """The slot of share ``owner`` (the first, should there be two), or None."""
        return next((i for i, e in enumerate(self.entries) if e is not None
                     and e.owner == owner), None)

    def encode(self) -> bytes:
        """The roster's ROSTER_SIZE bytes."""
        out = bytearray(ROSTER_SIZE)
        _HEADER.pack_into(out, 0, ROSTER_MAGIC, ROSTER_VERSION, NSLOTS, ENTRY_SIZE,
                          HEADER_SIZE, self.generation,
                          self.uuid_field().encode())
        for i, entry in enumerate(self.entries):
            if entry is not None:
                out[HEADER_SIZE + i * ENTRY_SIZE:HEADER_SIZE + (i + 1) * ENTRY_SIZE] = (
                    entry.encode())
        return bytes(out)


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def decode_roster(data: bytes, where: str = "roster") -> Roster:
    """Decode a roster's bytes (at least ROSTER_SIZE). Raises RosterFormatError naming
    ``where`` and what is wrong."""
    if len(data) < ROSTER_SIZE:
        raise RosterFormatError(f"{where}: {len(data)} bytes, a roster has {ROSTER_SIZE}")
    magic, version, nslots, entry_size, header_size, generation, uuid = _HEADER.unpack_from(
        data, 0)
    if magic != ROSTER_MAGIC:
        raise RosterFormatError(f"{where}: magic {magic:#x}, not a roster ({ROSTER_MAGIC:#x})")
    if (version, nslots, entry_size, header_size) != (ROSTER_VERSION, NSLOTS, ENTRY_SIZE,
                                                       HEADER_SIZE):
        raise RosterFormatError(
            f"{where}: version {version}, {nslots} entries of {entry_size} bytes after "
            f"{header_size}; egpu reads version {ROSTER_VERSION}, {NSLOTS} entries of "
            f"{ENTRY_SIZE} bytes after {HEADER_SIZE}")
    entries: list[RosterEntry | None] = []
    for i in range(NSLOTS):
        owner, priority, policy, cores, floor_pct, flags, _, name = _ENTRY.unpack_from(
            data, HEADER_SIZE + i * ENTRY_SIZE)
        if not owner:
            entries.append(None)
            continue
        try:
            entries.append(RosterEntry(owner, priority, policy, cores, floor_pct, flags,
                                       _text(name)))
        except ValueError as exc:
            raise RosterFormatError(f"{where}: entry {i}: {exc}") from None
    return Roster(_text(uuid), generation, tuple(entries))


# --- files ------------------------------------------------------------------------------
def _label(card_dir: str | int, where: str | None) -> str:
    if where:
        return where
    return card_dir if isinstance(card_dir, str) else f"card folder (fd {card_dir})"


def _open_dir(card_dir: str | int) -> tuple[int, bool]:
    """(fd of the card folder, whether to close it). A path's last component must not be a
    symlink."""
    if isinstance(card_dir, int):
        return card_dir, False
    try:
        fd = os.open(card_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise RosterError(f"{card_dir}: not a folder (a symlink or a file); egpu expects "
                              "the card folder the node made") from None
        raise
    return fd, True


def _open_regular(dir_fd: int, name: str, where: str, flags: int, mode: int = 0o600) -> int:
    """An fd of regular file ``name`` in ``dir_fd`` (egpu.safefile.open_regular: never a
    FIFO, device, folder or link; one link when opened for writing). Raises
    FileNotFoundError (absent, and no O_CREAT) or RosterError."""
    try:
        return open_regular(name, flags, mode, dir_fd=dir_fd, where=where)
    except NotRegularFile as exc:
        raise RosterError(str(exc)) from None


def read_roster(card_dir: str | int, *, where: str | None = None) -> Roster:
    """The roster of the card folder ``card_dir`` (a path, or a folder fd; ``where``: its
    name in messages, default the path): one pread of ROSTER_SIZE bytes, no lock. Raises
    FileNotFoundError when there is none, RosterError for a symlink, FIFO or other
    non-regular file, RosterFormatError when malformed or short."""
    fd, close = _open_dir(card_dir)
    try:
        where = _label(card_dir, where)
        roster = _open_regular(fd, ROSTER_FILE, where, os.O_RDONLY)
        try:
            return decode_roster(os.pread(roster, ROSTER_SIZE, 0), f"{where}/{ROSTER_FILE}")
        finally:
            os.close(roster)
    finally:
        if close:
            os.close(fd)


def read_share_public(dir_fd: int, owner: int) -> dict[str, int] | None:
    """The public fields (SHARE_FIELDS) of share ``owner``'s file in the card folder
    ``dir_fd``: one pread of SLOT_PUBLIC_BYTES. None when the file is missing, not a regular
    file (a symlink, FIFO...), shorter than that, or its owner field is not ``owner`` (not
    initialised yet, or lying). Never blocks, never maps it."""
    try:
        fd = _open_regular(dir_fd, share_file_name(owner), "share", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.pread(fd, SLOT_PUBLIC_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) < SLOT_PUBLIC_BYTES:
        return None
    fields = {name: s.unpack_from(data, offset)[0] for name, offset, s in _SHARE}
    return fields if fields["owner"] == owner else None


def _flock(fd: int, wait_s: float) -> bool:
    """Take an exclusive flock on ``fd``, waiting at most ``wait_s``; whether it was taken."""
    deadline = time.monotonic() + wait_s
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def _node_lock(card_fd: int, where: str) -> int:
    """The node writers' lock: an flock of the card folder's parent, which no container
    sees. Returns its fd (closing it unlocks). Raises RosterLockError after NODE_LOCK_WAIT_S."""
    fd = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=card_fd)
    if not _flock(fd, NODE_LOCK_WAIT_S):
        os.close(fd)
        raise RosterLockError(f"{where}: another node writer held the cards folder's lock for "
                              f"over {NODE_LOCK_WAIT_S:.0f}s; try again")
    return fd


def _create_share_file(card_fd: int, owner: int, where: str) -> None:
    """Create share ``owner``'s file zero-filled (SHARE_FILE_SIZE, SHARE_FILE_MODE) unless it
    exists; an existing one is kept (only extended when shorter)."""
    fd = _open_regular(card_fd, share_file_name(owner), where, os.O_RDWR | os.O_CREAT,
                       SHARE_FILE_MODE)
    try:
        if os.fstat(fd).st_size < SHARE_FILE_SIZE:
            os.ftruncate(fd, SHARE_FILE_SIZE)
        os.fchmod(fd, SHARE_FILE_MODE)
    finally:
        os.close(fd)


def _bump(fd: int, roster: Roster) -> None:
    os.pwrite(fd, _U64.pack((roster.generation + 1) & 0xFFFFFFFFFFFFFFFF), _GENERATION_OFFSET)


def register(card_dir: str | int, uuid: str, entry: RosterEntry, *,
             where: str | None = None) -> int:
    """Add share ``entry.owner`` to the roster of card ``uuid`` in folder ``card_dir`` (a
    path or a folder fd; ``where``: its name in messages), creating the roster when missing
    and the share's file, and return its slot. Idempotent: a share already there keeps its
    slot and gets ``entry``'s terms (an unchanged entry is not rewritten). Raises
    CardFullError (naming the card) when every slot is taken, RosterFormatError for a
    malformed roster or one of another card, RosterError for a file of the wrong kind,
    RosterLockError when another node writer holds the cards folder's lock too long."""
    fd, close = _open_dir(card_dir)
    where = _label(card_dir, where)
    try:
        lock = _node_lock(fd, where)
        try:
            roster_fd = _open_regular(fd, ROSTER_FILE, where, os.O_RDWR | os.O_CREAT,
                                      ROSTER_MODE)
            try:
                _flock(roster_fd, ROSTER_LOCK_WAIT_S)  # taken, or held by a tenant: go on
                os.fchmod(roster_fd, ROSTER_MODE)
                if os.fstat(roster_fd).st_size == 0:
                    os.pwrite(roster_fd, Roster(uuid).encode(), 0)
                roster = decode_roster(os.pread(roster_fd, ROSTER_SIZE, 0),
                                       f"{where}/{ROSTER_FILE}")
                if roster.uuid and roster.uuid != Roster(uuid).uuid_field():
                    raise RosterFormatError(f"{where}/{ROSTER_FILE} is the roster of card "
                                            f"{roster.uuid!r}, not of {uuid!r}")
                slot = roster.slot_of(entry.owner)
                if slot is None:
                    slot = next((i for i, e in enumerate(roster.entries) if e is None), None)
                    if slot is None:
                        raise CardFullError(
                            f"card {uuid}: all {NSLOTS} slots of its roster are taken; no "
                            f"share can be added until a pod of the card is deleted")
                _create_share_file(fd, entry.owner, where)
                current = roster.entries[slot]
                if current != entry:
                    data = entry.encode()
                    offset = HEADER_SIZE + slot * ENTRY_SIZE
                    os.pwrite(roster_fd, data[8:], offset + 8)  # terms, then the owner word
                    if current is None:
                        os.pwrite(roster_fd, data[:8], offset)
                    _bump(roster_fd, roster)
                return slot
            finally:
                os.close(roster_fd)  # unlocks
        finally:
            os.close(lock)
    finally:
        if close:
            os.close(fd)


def unregister(card_dir: str | int, owners: Iterable[int], *,
               where: str | None = None) -> list[int]:
    """Free the entries of ``owners`` in the roster of folder ``card_dir`` (path or folder
    fd; ``where``: its name in messages) and remove their share files. Returns the slots
    freed (a card without a roster has none; absent owners and files are fine). Raises
    RosterError as ``register``."""
    wanted = set(owners)
    fd, close = _open_dir(card_dir)
    where = _label(card_dir, where)
    freed: list[int] = []
    try:
        lock = _node_lock(fd, where)
        try:
            try:
                roster_fd = _open_regular(fd, ROSTER_FILE, where, os.O_RDWR)
            except FileNotFoundError:
                roster_fd = -1
            if roster_fd >= 0:
                try:
                    _flock(roster_fd, ROSTER_LOCK_WAIT_S)
                    roster = decode_roster(os.pread(roster_fd, ROSTER_SIZE, 0),
                                           f"{where}/{ROSTER_FILE}")
                    for i, entry in enumerate(roster.entries):
                        if entry is not None and entry.owner in wanted:
                            offset = HEADER_SIZE + i * ENTRY_SIZE
                            os.pwrite(roster_fd, bytes(8), offset)  # the owner word first
                            os.pwrite(roster_fd, bytes(ENTRY_SIZE - 8), offset + 8)
                            freed.append(i)
                    if freed:
                        _bump(roster_fd, roster)
                finally:
                    os.close(roster_fd)
            for owner in sorted(wanted):
                try:  # noqa: SIM105 - contextlib costs the hook's startup
                    os.unlink(share_file_name(owner), dir_fd=fd)
                except FileNotFoundError:
                    pass
        finally:
            os.close(lock)
    finally:
        if close:
            os.close(fd)
    return freed
