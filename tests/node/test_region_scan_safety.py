"""F5: the node agent's region scans never block and never follow a link. A container writes
its accounting folder and its own share file in each card folder: a FIFO there blocked
``open`` forever (no writer), which stopped the agent's heartbeat; a symlink could make it
read host files. The card folders and rosters are the node's, but they are read with the same
care."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from node_fixtures import region_bytes
from test_card_region import make_card, share_bytes

from egpu import card_roster
from egpu.card_roster import RosterEntry
from egpu.region_layout import REGION_SIZE
from node_agent.metrics import card_region as cr
from node_agent.metrics.region import scan

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, failing the test (instead of hanging it) if it blocks."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"blocked for more than {seconds}s")
    return result[0]


def _unblock(fifos: list[Path]) -> None:
    for fifo in fifos:  # a reader stuck in open() of a FIFO returns once a writer opens it
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass


@pytest.mark.parametrize("trap", ["fifo", "symlink", "wrong-size", "folder", "folder-symlink"])
def test_container_region_traps_are_skipped_without_blocking(tmp_path: Path, trap: str) -> None:
    containers = tmp_path / "containers"
    good = containers / "uid-1_ok"
    good.mkdir(parents=True)
    (good / "region").write_bytes(region_bytes([(U0, 4096 << 20, 1 << 20)]))
    secret = tmp_path / "secret"
    secret.write_bytes(region_bytes([(U1, 1, 1)]))
    bad = containers / "uid-2_bad"
    if trap == "folder-symlink":
        other = tmp_path / "elsewhere"
        other.mkdir()
        os.symlink(secret, other / "region")
        os.symlink(other, bad)
    else:
        bad.mkdir()
        region = bad / "region"
        if trap == "fifo":
            os.mkfifo(region)
        elif trap == "symlink":
            os.symlink(secret, region)
        elif trap == "wrong-size":
            region.write_bytes(region_bytes([(U1, 1, 1)]) + b"x")
        else:
            region.mkdir()
    try:
        found = _within(5, lambda: scan(str(tmp_path)))
    finally:
        _unblock([bad / "region"] if trap == "fifo" else [])
    assert set(found) == {"uid-1_ok"}
    assert len(region_bytes([])) == REGION_SIZE


OWNER = card_roster.share_owner("uid-1_main")
BUSY = {"use_ppm": 300_000, "inflight_n": 1}


def _good_card(tmp_path: Path) -> None:
    make_card(tmp_path, U0, [(RosterEntry(OWNER, cores=30), BUSY)])


@pytest.mark.parametrize("trap", ["fifo", "symlink", "roster-fifo", "roster-symlink",
                                  "roster-short", "roster-folder", "roster-hardlink-ok"])
def test_card_folder_traps_are_skipped_without_blocking(
        tmp_path: Path, trap: str, caplog: pytest.LogCaptureFixture) -> None:
    _good_card(tmp_path)
    elsewhere = make_card(tmp_path / "elsewhere", U1,
                          [(RosterEntry(OWNER, cores=30), BUSY)])
    secret = elsewhere / "roster"
    bad = tmp_path / "cards" / U1
    roster = bad / "roster"
    if trap == "fifo":
        os.mkfifo(bad)
    elif trap == "symlink":
        os.symlink(elsewhere, bad)
    else:
        bad.mkdir()
        if trap == "roster-fifo":
            os.mkfifo(roster)
        elif trap == "roster-symlink":
            os.symlink(secret, roster)
        elif trap == "roster-short":
            roster.write_bytes(secret.read_bytes()[:100])
        elif trap == "roster-folder":
            roster.mkdir()
        else:
            os.link(secret, roster)  # a regular file: read like any other (nothing written)
    try:
        with caplog.at_level(logging.WARNING):
            found = _within(5, lambda: cr.scan_cards(str(tmp_path)))
    finally:
        _unblock([bad] if trap == "fifo" else [roster] if trap == "roster-fifo" else [])
    assert set(found) == ({U0, U1} if trap == "roster-hardlink-ok" else {U0})
    assert found[U0].slots[OWNER].use_ppm == 300_000


@pytest.mark.parametrize("trap", ["fifo", "symlink", "folder", "short", "hardlink-ok"])
def test_share_file_traps_count_as_an_idle_share_without_blocking(tmp_path: Path,
                                                                  trap: str) -> None:
    """A share file is its container's to write (within its own file): what it plants there
    is read, if at all, as that share being idle; the card and its other shares stay."""
    other = RosterEntry(card_roster.share_owner("uid-2_main"), cores=20)
    folder = make_card(tmp_path, U0, [(RosterEntry(OWNER, cores=30), BUSY), (other, None)])
    secret = tmp_path / "secret"  # a file that would look like a busy share of its owner
    secret.write_bytes(share_bytes(other.owner, **BUSY))
    share = folder / card_roster.share_file_name(other.owner)
    share.unlink()
    if trap == "fifo":
        os.mkfifo(share)
    elif trap == "symlink":
        os.symlink(secret, share)
    elif trap == "folder":
        share.mkdir()
    elif trap == "short":
        share.write_bytes(secret.read_bytes()[:511])
    else:
        os.link(secret, share)
    try:
        found = _within(5, lambda: cr.scan_cards(str(tmp_path)))
    finally:
        _unblock([share] if trap == "fifo" else [])
    slots = found[U0].slots
    assert slots[OWNER].use_ppm == 300_000
    want = 230_000 if trap == "hardlink-ok" else 0  # a strict 20 % share: its cap + 3 points
    assert (slots[other.owner].use_ppm, slots[other.owner].cores) == (want, 20)


def test_a_card_folder_the_hook_is_making_is_skipped_quietly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "cards" / U0).mkdir(parents=True)  # no roster yet
    make_card(tmp_path, U1, [(RosterEntry(OWNER), None)])  # a share not started yet
    with caplog.at_level(logging.WARNING):
        found = cr.scan_cards(str(tmp_path))
    assert set(found) == {U1} and found[U1].slots[OWNER].use_ppm == 0
    assert not caplog.records


def test_a_share_file_is_read_not_mapped(tmp_path: Path) -> None:
    """A share can truncate its own file at any moment: a mapping would then raise SIGBUS in
    the agent; pread just reads what is there (too short: an idle share)."""
    _good_card(tmp_path)
    path = tmp_path / "cards" / U0 / card_roster.share_file_name(OWNER)
    assert cr.scan_cards(str(tmp_path))[U0].slots[OWNER].use_ppm == 300_000
    os.truncate(path, 10)
    assert cr.scan_cards(str(tmp_path))[U0].slots[OWNER].use_ppm == 0
