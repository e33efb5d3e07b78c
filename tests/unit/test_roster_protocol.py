"""One roster write protocol, tested from both writers (issue 23).

The roster has two writers: the node's (egpu/card_roster.py: the hook registers, the agent
unregisters) and the interposer's own on a raw node (libinterpose/src/card_region.c). Readers
take no lock, so both must commit an entry by its owner word: a new entry's terms before its
owner, a freed entry's owner before its terms, the generation after the change, a roster
found empty written whole first. Before, the C writer rewrote the whole roster in one
pwrite, and a reader could see a torn entry. ``violations`` is the protocol, written once;
each writer's recorded writes must pass it, and the writes it exists to refuse fail it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu import card_roster as cr

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "libinterpose" / "build"
GENERATION = (24, 8)  # the header's generation word (card_roster's layout)

# offset, length, the first 8 bytes written (little-endian), and in a write longer than an
# owner word the entries' owner words in it that are not 0 (entries committed whole)
Write = tuple[int, int, int, int]


def violations(ops: dict[str, list[Write]]) -> list[str]:
    """What breaks the protocol in each operation's writes (empty: none)."""
    bad = []
    for name, writes in ops.items():
        per_entry: dict[int, list[str]] = {}
        for n, (off, length, head, owners) in enumerate(writes):
            if owners:
                bad.append(f"{name}: a write at {off} of {length} bytes commits {owners} "
                           f"entries whole")
                continue
            if (off, length) == (0, cr.ROSTER_SIZE) and n == 0:
                continue  # a roster found empty, written whole (and empty)
            if (off, length) == GENERATION:
                if n != len(writes) - 1:
                    bad.append(f"{name}: the generation is not the last write")
                continue
            slot, within = divmod(off - cr.HEADER_SIZE, cr.ENTRY_SIZE)
            if off < cr.HEADER_SIZE or (within, length) not in ((0, 8), (8, cr.ENTRY_SIZE - 8)):
                bad.append(f"{name}: a write at {off} of {length} bytes is neither an owner word "
                           f"nor an entry's terms")
                continue
            per_entry.setdefault(slot, []).append(
                "T" if within else ("O" if head else "0"))
        for slot, seq in per_entry.items():
            text = "".join(seq)
            for i, w in enumerate(text):
                if w == "O" and (i == 0 or text[i - 1] != "T"):
                    bad.append(f"{name}: slot {slot}'s owner before its terms ({text})")
                if w == "0" and text[i + 1:i + 2] != "T":
                    bad.append(f"{name}: slot {slot}'s freed owner not followed by its terms "
                               f"({text})")
        if per_entry and (not writes or (writes[-1][0], writes[-1][1]) != GENERATION):
            bad.append(f"{name}: entries changed, the generation not bumped")
    return bad


def c_writes(folder: Path) -> dict[str, list[Write]]:
    """What the interposer's raw-node writer wrote, per phase
    (libinterpose/tests/roster_writes.c)."""
    subprocess.run(["make", "-s", "-C", str(REPO / "libinterpose"), "build/roster_writes"],
                   check=True, capture_output=True)
    out = subprocess.run([str(LIB / "roster_writes"), str(folder)], capture_output=True,
                         text=True, check=True).stdout
    ops: dict[str, list[Write]] = {}
    phase = ""
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "phase":
            phase = rest[0]
            ops[phase] = []
        else:
            ops[phase].append((int(rest[0]), int(rest[1]), int(rest[2], 16), int(rest[3])))
    return ops


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Write]]:
    """The pwrites the Python writer makes (every one; the test groups them)."""
    writes: list[Write] = []
    real = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        raw = bytes(data)
        owners = sum(
            1 for e in range(cr.HEADER_SIZE, offset + len(raw) - 7, cr.ENTRY_SIZE)
            if len(raw) > 8 and e >= offset and raw[e - offset:e - offset + 8] != bytes(8))
        writes.append((offset, len(raw), int.from_bytes(raw[:8].ljust(8, b"\0"), "little"),
                       owners))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    yield writes


def python_writes(card: Path, writes: list[Write]) -> dict[str, list[Write]]:
    """The node writer's operations, the C program's phases' counterparts."""
    ops: dict[str, list[Write]] = {}

    def op(name: str, fn: object) -> None:
        start = len(writes)
        fn()  # type: ignore[operator]
        ops[name] = writes[start:]

    a, b, c = (cr.RosterEntry(owner=cr.owner_id(k), cores=30) for k in ("a", "b", "c"))
    op("new", lambda: cr.register(card, "GPU-w", a))
    op("again", lambda: cr.register(card, "GPU-w", a))
    op("second", lambda: cr.register(card, "GPU-w", b))
    op("free", lambda: cr.unregister(card, [a.owner]))
    op("reuse", lambda: cr.register(card, "GPU-w", c))
    return ops


def test_the_interposers_raw_writer_keeps_the_protocol(tmp_path: Path) -> None:
    ops = c_writes(tmp_path / "cards")
    assert violations(ops) == [], ops
    assert ops["again"] == []  # an unchanged entry is not rewritten
    assert any(head == 0 for _, length, head, _ in ops["reap"] if length == 8)  # A was freed


def test_the_node_writer_keeps_the_protocol(tmp_path: Path, recorded: list[Write]) -> None:
    card = tmp_path / "cards" / "GPU-w"
    card.mkdir(parents=True)
    ops = python_writes(card, recorded)
    assert violations(ops) == [], ops
    assert ops["again"] == []


def test_the_protocol_refuses_the_writes_it_exists_to_refuse() -> None:
    entry = cr.HEADER_SIZE + 3 * cr.ENTRY_SIZE
    gen = (*GENERATION, 2, 0)
    # the old C writer: the whole roster, its entries in it, in one pwrite
    assert violations({"whole": [(0, cr.ROSTER_SIZE, 1, 2), gen]})
    assert violations({"entry whole": [(entry, cr.ENTRY_SIZE, 7, 1), gen]})
    assert violations({"owner first": [(entry, 8, 7, 0), (entry + 8, 56, 0, 0), gen]})
    assert violations({"terms before free": [(entry + 8, 56, 0, 0), (entry, 8, 0, 0), gen]})
    assert violations({"no bump": [(entry + 8, 56, 0, 0), (entry, 8, 7, 0)]})
    assert violations({"bump first": [gen, (entry + 8, 56, 0, 0), (entry, 8, 7, 0)]})
