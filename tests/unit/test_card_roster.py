"""egpu.card_roster: the one codec of a card's roster and of the public part of share files
(docs/security.md, "Node-side state"). Round trips, registration (idempotent, a full card),
removal, and the files a card folder must never trust: links, FIFOs, short files, locks
held on purpose. The layout against the compiler: tests/node/test_card_region.py."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egpu import card_roster as cr
from egpu.card_roster import (
    CardFullError,
    Roster,
    RosterEntry,
    RosterError,
    RosterFormatError,
    RosterLockError,
)

UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
OTHER = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result (or exception), failing the test instead of hanging it."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(("ok", call()))
        except BaseException as exc:
            result.append(("raised", exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"blocked for more than {seconds}s")
    kind, value = result[0]
    if kind == "raised":
        raise value
    return value


def _unblock(fifo: Path) -> None:
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture
def card(tmp_path: Path) -> Path:
    folder = tmp_path / "cards" / UUID
    folder.mkdir(parents=True)
    return folder


def entry(n: int, **changes: Any) -> RosterEntry:
    return RosterEntry(cr.share_owner(f"uid-{n}_main"), name=f"uid-{n}_main").replace(**changes)


def share_bytes(owner: int, **fields: int) -> bytes:
    """A share file (4096 bytes) whose public fields hold ``fields`` and ``owner``."""
    data = bytearray(cr.SHARE_FILE_SIZE)
    for name, offset, code in cr.SHARE_FIELDS:
        struct.pack_into("<" + code, data, offset, {"owner": owner, **fields}.get(name, 0))
    return bytes(data)


# --- names and owners ------------------------------------------------------------------
def test_owner_is_the_interposers_fnv1a_of_the_region_path() -> None:
    assert cr.owner_id("") == 0xCBF29CE484222325
    assert cr.owner_id("a") == 0xAF63DC4C8601EC8C  # FNV-1a 64 test vector
    assert cr.share_owner("uid_main") == cr.owner_id("/var/run/egpu/containers/uid_main/region")
    assert cr.region_owner("/x" * 400) == cr.owner_id(("/x" * 400)[:511])  # its key buffer
    assert cr.share_file_name(0xAB) == "share-00000000000000ab"
    assert cr.share_file_name(2**64 - 1) == "share-ffffffffffffffff"


def test_a_cut_name_matches_the_prefix_it_may_have_had() -> None:
    uid = "aaaaaaaa-1111-2222-3333-444444444444"
    stored = RosterEntry(1, name=f"{uid}_main").name
    assert len(stored) == 31 and cr.name_matches_prefix(stored, f"{uid}_")
    assert not cr.name_matches_prefix(stored, "bbbbbbbb-1111-2222-3333-444444444444_")
    assert cr.name_matches_prefix("uid-1_main", "uid-1_")
    assert not cr.name_matches_prefix("uid-10_main", "uid-1_")
    assert not cr.name_matches_prefix("", "uid-1_")


# --- the codec ---------------------------------------------------------------------------
entries = st.builds(
    RosterEntry, owner=st.integers(1, 2**64 - 1), priority=st.integers(0, 1),
    policy=st.integers(0, 1), cores=st.integers(0, 100), floor_pct=st.integers(0, 100),
    flags=st.integers(0, 2**32 - 1),
    name=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",),
                               exclude_characters="\0"), max_size=40))


@given(st.lists(st.one_of(st.none(), entries), min_size=32, max_size=32),
       st.integers(0, 2**64 - 1), st.text(st.characters(codec="ascii"), max_size=63)
       .filter(lambda u: "\0" not in u))
def test_a_roster_round_trips(slots: list[RosterEntry | None], generation: int,
                              uuid: str) -> None:
    roster = Roster(uuid, generation, tuple(slots))
    data = roster.encode()
    assert len(data) == cr.ROSTER_SIZE == 2176
    assert cr.decode_roster(data) == roster
    assert roster.shares() == {i: e for i, e in enumerate(slots) if e is not None}


def test_entry_fields_are_where_card_region_h_puts_them() -> None:
    e = RosterEntry(0x1122334455667788, 1, 1, 50, 10, cr.FLAG_RAW, "uid_main")
    roster = Roster(UUID, 7, (None, e) + (None,) * 30)
    data = roster.encode()
    assert struct.unpack_from("<QIIIIQ", data, 0) == (0x54534F5255504745, 1, 32, 64, 128, 7)
    assert data[:8] == b"EGPUROST" and data[32:32 + len(UUID)] == UUID.encode()
    assert struct.unpack_from("<QIIIIII", data, 128 + 64) == (0x1122334455667788, 1, 1, 50,
                                                               10, 1, 0)
    assert data[128 + 64 + 32:128 + 64 + 40] == b"uid_main"
    assert data[128:128 + 64] == bytes(64)  # a free entry is all zeros


def test_entries_are_values_and_names_are_cut_to_31_bytes() -> None:
    e = RosterEntry(5, name="x" * 40)
    assert e.name == "x" * 31 and e == RosterEntry(5, name="x" * 31) and hash(e) == hash(
        RosterEntry(5, name="x" * 31))
    assert RosterEntry(5, name="é" * 20).name == "é" * 15  # never half a character
    assert pickle.loads(pickle.dumps(e)) == e and "owner=5" in repr(e)
    with pytest.raises(AttributeError):
        e.cores = 3  # type: ignore[misc]
    for bad in ({"owner": 0}, {"owner": 2**64}, {"priority": 2}, {"policy": -1},
                {"cores": 101}, {"floor_pct": 101}, {"cores": True}, {"flags": 2**32}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RosterEntry(**{"owner": 1, **bad})


@pytest.mark.parametrize(("offset", "fmt", "value", "message"), [
    (0, "<Q", 0x4452414355504745, "not a roster"),  # the old card region's magic
    (8, "<I", 2, "version 2"),
    (12, "<I", 16, "16 entries"),
    (16, "<I", 32, "of 32 bytes"),
    (20, "<I", 64, "after 64"),
    (128 + 8, "<I", 9, "entry 0: roster entry priority"),
])
def test_a_malformed_roster_is_refused_naming_what(offset: int, fmt: str, value: int,
                                                    message: str) -> None:
    data = bytearray(Roster(UUID, 0, (RosterEntry(1),) + (None,) * 31).encode())
    struct.pack_into(fmt, data, offset, value)
    with pytest.raises(RosterFormatError, match=message):
        cr.decode_roster(bytes(data), "the roster")
    with pytest.raises(RosterFormatError, match="100 bytes"):
        cr.decode_roster(bytes(data[:100]))


# --- register / unregister ---------------------------------------------------------------
def test_register_creates_the_roster_and_the_share_file(card: Path) -> None:
    first, second = entry(1, cores=30), entry(2, priority=cr.PRIORITY_LOW, floor_pct=10)
    assert cr.register(str(card), UUID, first) == 0
    assert cr.register(str(card), UUID, second) == 1
    roster_file = card / "roster"
    info = roster_file.stat()
    assert info.st_size == cr.ROSTER_SIZE and stat.S_IMODE(info.st_mode) == 0o644
    roster = cr.read_roster(str(card))
    assert roster.uuid == UUID and roster.shares() == {0: first, 1: second}
    assert roster.generation == 2
    share = card / cr.share_file_name(first.owner)
    assert share.read_bytes() == bytes(cr.SHARE_FILE_SIZE)
    assert stat.S_IMODE(share.stat().st_mode) == 0o666


def test_register_is_idempotent_and_updates_the_terms(card: Path) -> None:
    for n in range(3):
        cr.register(str(card), UUID, entry(n))
    before = (card / "roster").read_bytes()
    assert cr.register(str(card), UUID, entry(1)) == 1
    assert (card / "roster").read_bytes() == before  # unchanged: not even the generation
    share = card / cr.share_file_name(entry(1).owner)
    share.write_bytes(share_bytes(entry(1).owner, use_ppm=5))  # the share's own state
    assert cr.register(str(card), UUID, entry(1, cores=70, policy=1)) == 1
    roster = cr.read_roster(str(card))
    assert roster.shares()[1] == entry(1, cores=70, policy=1)
    assert roster.generation == cr.decode_roster(before).generation + 1
    assert share.read_bytes() == share_bytes(entry(1).owner, use_ppm=5)  # kept


def test_a_full_card_is_refused_naming_the_card(card: Path) -> None:
    fd = os.open(card, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert [cr.register(fd, UUID, entry(n)) for n in range(32)] == list(range(32))
        with pytest.raises(CardFullError, match=f"card {UUID}: all 32 slots"):
            cr.register(fd, UUID, entry(99))
        assert cr.register(fd, UUID, entry(7)) == 7  # a share already there still is
        assert not (card / cr.share_file_name(entry(99).owner)).exists()
    finally:
        os.close(fd)


def test_unregister_frees_the_entries_and_removes_the_share_files(card: Path) -> None:
    for n in range(4):
        cr.register(str(card), UUID, entry(n))
    gone = [entry(1).owner, entry(3).owner, 12345]
    assert cr.unregister(str(card), gone) == [1, 3]
    roster = cr.read_roster(str(card))
    assert roster.shares() == {0: entry(0), 2: entry(2)}
    assert sorted(p.name for p in card.iterdir()) == sorted(
        ["roster", cr.share_file_name(entry(0).owner), cr.share_file_name(entry(2).owner)])
    assert cr.register(str(card), UUID, entry(9)) == 1  # the lowest free slot again
    assert cr.unregister(str(card), []) == []
    empty = card.parent / OTHER
    empty.mkdir()
    assert cr.unregister(str(empty), [entry(0).owner]) == []  # no roster: nothing to free


def test_a_roster_of_another_card_or_malformed_is_never_rewritten(card: Path) -> None:
    cr.register(str(card), OTHER, entry(1))
    with pytest.raises(RosterFormatError, match=f"card '{OTHER}', not of '{UUID}'"):
        cr.register(str(card), UUID, entry(2))
    garbage = b"\x01" * cr.ROSTER_SIZE
    (card / "roster").write_bytes(garbage)
    with pytest.raises(RosterFormatError, match="not a roster"):
        cr.register(str(card), UUID, entry(2))
    with pytest.raises(RosterFormatError):
        cr.unregister(str(card), [entry(1).owner])
    assert (card / "roster").read_bytes() == garbage


def test_concurrent_registrations_get_distinct_slots(card: Path) -> None:
    slots: list[int] = []
    lock = threading.Lock()

    def one(n: int) -> None:
        slot = cr.register(str(card), UUID, entry(n))
        with lock:
            slots.append(slot)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(slots) == list(range(24))
    assert {e.owner for e in cr.read_roster(str(card)).shares().values()} == {
        entry(n).owner for n in range(24)}


# --- what a card folder must never trust --------------------------------------------------
@pytest.mark.parametrize("trap", ["symlink", "fifo", "folder", "short", "empty"])
def test_a_linked_fifo_or_short_roster_is_refused_without_hanging(
        card: Path, tmp_path: Path, trap: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(Roster(UUID).encode())
    roster = card / "roster"
    if trap == "symlink":
        os.symlink(victim, roster)
    elif trap == "fifo":
        os.mkfifo(roster)
    elif trap == "folder":
        roster.mkdir()
    elif trap == "short":
        roster.write_bytes(Roster(UUID).encode()[:100])
    else:
        roster.write_bytes(b"")
    try:
        with pytest.raises(RosterError):
            _within(5, lambda: cr.read_roster(str(card)))
        if trap == "empty":  # a roster never written (a writer died): made whole
            assert _within(5, lambda: cr.register(str(card), UUID, entry(1))) == 0
        else:
            with pytest.raises(RosterError):
                _within(5, lambda: cr.register(str(card), UUID, entry(1)))
            with pytest.raises(RosterError):
                _within(5, lambda: cr.unregister(str(card), [entry(1).owner]))
    finally:
        if trap == "fifo":
            _unblock(roster)
    assert victim.read_bytes() == Roster(UUID).encode()


def test_a_linked_card_folder_is_refused(card: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    os.symlink(card, link)
    with pytest.raises(RosterError, match="not a folder"):
        cr.register(str(link), UUID, entry(1))
    with pytest.raises(RosterError, match="not a folder"):
        cr.read_roster(str(link))
    assert list(card.iterdir()) == []


@pytest.mark.parametrize("trap", ["symlink", "fifo", "folder", "hardlink"])
def test_register_refuses_a_share_file_of_the_wrong_kind(card: Path, tmp_path: Path,
                                                         trap: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret")
    victim.chmod(0o600)
    share = card / cr.share_file_name(entry(1).owner)
    if trap == "symlink":
        os.symlink(victim, share)
    elif trap == "fifo":
        os.mkfifo(share)
    elif trap == "hardlink":
        os.link(victim, share)
    else:
        share.mkdir()
    try:
        with pytest.raises(RosterError, match="regular file"):
            _within(5, lambda: cr.register(str(card), UUID, entry(1)))
    finally:
        if trap == "fifo":
            _unblock(share)
    assert victim.read_bytes() == b"secret"  # never extended, never chmod-ed
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert cr.read_roster(str(card)).shares() == {}  # the entry waits for its file


def test_a_hard_linked_roster_is_read_but_never_written(card: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(Roster(UUID).encode())
    victim.chmod(0o600)
    os.link(victim, card / "roster")
    assert cr.read_roster(str(card)) == Roster(UUID)  # reading harms nothing
    for change in (lambda: cr.register(str(card), UUID, entry(1)),
                   lambda: cr.unregister(str(card), [entry(1).owner])):
        with pytest.raises(RosterError, match="2 hard links"):
            change()
    assert victim.read_bytes() == Roster(UUID).encode()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


@pytest.mark.parametrize("trap", ["ok", "missing", "symlink", "fifo", "folder", "short",
                                  "empty", "other-owner", "hardlink"])
def test_read_share_public_believes_only_a_whole_file_of_its_owner(
        card: Path, tmp_path: Path, trap: str) -> None:
    owner = entry(1).owner
    good = share_bytes(owner, use_ppm=250_000, cores=30, hi_mark_ns=9, busy_total_ns=7)
    victim = tmp_path / "victim"
    victim.write_bytes(good)  # what a link would make the reader believe
    share = card / cr.share_file_name(owner)
    if trap in ("ok", "short", "empty", "other-owner"):
        share.write_bytes({"ok": good, "short": good[:511], "empty": b"",
                           "other-owner": share_bytes(owner + 1, use_ppm=1)}[trap])
    elif trap == "symlink":
        os.symlink(victim, share)
    elif trap == "fifo":
        os.mkfifo(share)
    elif trap == "folder":
        share.mkdir()
    elif trap == "hardlink":
        os.link(victim, share)  # a regular file: read like any other
    fd = os.open(card, os.O_RDONLY | os.O_DIRECTORY)
    try:
        public = _within(5, lambda: cr.read_share_public(fd, owner))
    finally:
        os.close(fd)
        if trap == "fifo":
            _unblock(share)
    if trap in ("ok", "hardlink"):
        assert public is not None
        assert (public["owner"], public["use_ppm"], public["cores"], public["hi_mark_ns"],
                public["busy_total_ns"]) == (owner, 250_000, 30, 9, 7)
    else:
        assert public is None


def test_a_roster_lock_held_by_a_tenant_does_not_stop_the_node(
        card: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container sees the roster read-only, and flock needs no write access: it may hold
    the lock forever. The node's writers wait ROSTER_LOCK_WAIT_S, then go on (they are
    serialized among themselves by the cards folder's lock, which no container sees)."""
    cr.register(str(card), UUID, entry(0))
    monkeypatch.setattr(cr, "ROSTER_LOCK_WAIT_S", 0.2)
    tenant = os.open(card / "roster", os.O_RDONLY)
    try:
        fcntl.flock(tenant, fcntl.LOCK_EX)
        assert _within(5, lambda: cr.register(str(card), UUID, entry(1))) == 1
        assert _within(5, lambda: cr.unregister(str(card), [entry(0).owner])) == [0]
    finally:
        os.close(tenant)
    assert cr.read_roster(str(card)).shares() == {1: entry(1)}


def test_a_node_writer_waits_for_another_then_gives_up_naming_the_card(
        card: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cr, "NODE_LOCK_WAIT_S", 0.2)
    other = os.open(card.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(RosterLockError, match=str(card)):
            _within(5, lambda: cr.register(str(card), UUID, entry(1)))
    finally:
        os.close(other)
    assert cr.register(str(card), UUID, entry(1)) == 0
