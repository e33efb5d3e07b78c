"""F5: the node agent's region scans never block and never follow a link. A container writes
its accounting folder (and its cards' region files): a FIFO there blocked ``open`` forever
(no writer), which stopped the agent's heartbeat; a symlink could make it read host files."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from node_fixtures import region_bytes
from test_card_region import card_region_bytes

from node_agent.metrics import card_region as cr
from node_agent.metrics.region import REGION_SIZE, scan

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


@pytest.mark.parametrize("trap", ["fifo", "symlink", "short", "folder", "hardlink-ok"])
def test_card_region_traps_are_skipped_without_blocking(
        tmp_path: Path, trap: str, caplog: pytest.LogCaptureFixture) -> None:
    cards = tmp_path / "cards"
    cards.mkdir()

    (cards / U0).write_bytes(card_region_bytes(U0, [{"owner": 7, "use_ppm": 10}]))
    secret = tmp_path / "secret"
    secret.write_bytes(card_region_bytes(U1, [{"owner": 9, "use_ppm": 10}]))
    bad = cards / U1
    if trap == "fifo":
        os.mkfifo(bad)
    elif trap == "symlink":
        os.symlink(secret, bad)
    elif trap == "short":
        bad.write_bytes(b"x" * 100)
    elif trap == "folder":
        bad.mkdir()
    else:
        os.link(secret, bad)  # a regular file: read like any other (nothing is written)
    try:
        with caplog.at_level(logging.WARNING):
            found = _within(5, lambda: cr.scan_cards(str(tmp_path)))
    finally:
        _unblock([bad] if trap == "fifo" else [])
    assert set(found) == ({U0, U1} if trap == "hardlink-ok" else {U0})


def test_an_empty_card_region_made_by_the_hook_is_skipped_quietly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / U0).write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        assert cr.scan_cards(str(tmp_path)) == {}
    assert not caplog.records


def test_a_card_region_is_read_not_mapped(tmp_path: Path) -> None:
    """A share can truncate its bind-mounted card file at any moment: a mapping would then
    raise SIGBUS in the agent; pread just reads what is there."""

    (tmp_path / "cards").mkdir()
    path = tmp_path / "cards" / U0
    path.write_bytes(card_region_bytes(U0, [{"owner": 7, "use_ppm": 10}]))
    assert set(cr.scan_cards(str(tmp_path))) == {U0}
    os.truncate(path, 10)
    assert cr.scan_cards(str(tmp_path)) == {}
