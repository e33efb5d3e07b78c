"""Each share's measured compute use on a card, from the card's folder (egpu.card_roster;
libinterpose/src/card_region.h; docs/security.md, "Node-side state").

``<RUNTIME_DIR>/cards/<uuid>/`` holds the node's ``roster`` (which shares the card has, their
slots and booked cores) and one ``share-<owner>`` file per share, written by that share alone.
The agent reads the roster (one pread), then the public part of each listed share's file (one
bounded pread each; never mapped, no lock: a share may truncate, grow or rewrite its own file
at any moment, and every field read is an aligned word). What a share file says is believed
only about that share and only within bounds: its owner field must be the roster's (else, as
for a short, missing or non-regular file, the share counts as idle), its ``use_ppm`` is
bounded for decisions (100 %, a strict share's cap + 3 points) but kept as reported for
monitoring (``reported_percent``, ``over_cap``), and its booked ``cores`` come from the roster,
never from the file.

A card folder without a roster is skipped quietly (the hook is making it); a malformed roster,
a symlink, FIFO or other file where a card folder or roster should be, and a regular file at
``cards/<uuid>`` (a card region of the previous version, one file per card) are skipped with
one log line per path and reason.

Compute used by a share = its ``use_ppm`` (the controller's smoothed measured GPU time, ppm of
wall time) while it is active (launches in flight, or one within ``IDLE_NS``), else 0: the
controller only updates ``use_ppm`` on launches, so an idle share keeps its last value. Launches
in flight count only until they are quiet for the interposer's own expiry (``inflight_stale``):
a share whose last process was killed with groups in flight keeps ``inflight_n > 0`` in its file
until a process of it launches again, which may never happen.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass

from egpu.card_roster import (
    POLICY_STRICT,
    RosterEntry,
    RosterError,
    read_roster,
    read_share_public,
)
from egpu.contract import CARDS_SUBDIR

log = logging.getLogger("egpu-node-agent.card-region")

PPM = 1_000_000
IDLE_NS = 1_000_000_000  # a share with no launch for this long (and none in flight) uses 0 %
# A strict share with a cap uses at most its cap and a few points over it (FC-13: a 1 s window
# within cap + 3): what its own file says above that is not believed.
STRICT_CAP_SLACK_PCT = 3
# Launches in flight are forgotten once nothing moved for INFLIGHT_QUIET_NS or
# INFLIGHT_QUIET_ESTIMATES launch estimates, whichever is longer, since the last completion or
# the start of the outstanding period: the interposer's own rule (libinterpose/src/card_region.h,
# EGPU_INFLIGHT_QUIET_NS, EGPU_INFLIGHT_QUIET_ESTIMATES, egpu_inflight_stale).
INFLIGHT_QUIET_NS = 250_000_000
INFLIGHT_QUIET_ESTIMATES = 8
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class SlotUse:
    """One share on a card: ``owner`` (FNV-1a of its region path), booked ``cores`` (%, the
    roster's), and the measurement (GPU ns, CLOCK_MONOTONIC ns, ppm) from its share file:
    ``reported_ppm`` as the file says it, ``use_ppm`` within what the roster lets the share
    use (``use_bound_ppm``); ``last_complete_ns``, ``inflight_since_ns`` and ``est_ns`` (its
    longer per-launch estimate) date its launches in flight (``inflight_stale``)."""

    owner: int
    cores: int
    busy_total_ns: int
    last_active_ns: int
    use_ppm: int
    inflight_n: int
    reported_ppm: int = 0
    last_complete_ns: int = 0
    inflight_since_ns: int = 0
    est_ns: int = 0

    def inflight_stale(self, now_ns: int) -> bool:
        """Whether its launches in flight have been quiet past the interposer's own expiry
        (module docstring): its last process died with them."""
        quiet = max(INFLIGHT_QUIET_NS, INFLIGHT_QUIET_ESTIMATES * self.est_ns)
        last = max(self.last_complete_ns, self.inflight_since_ns)
        return now_ns > last and now_ns - last > quiet

    def active(self, now_ns: int) -> bool:
        """Launches in flight (not stale), or one within ``IDLE_NS``."""
        return (self.inflight_n > 0 and not self.inflight_stale(now_ns)) or (
            self.last_active_ns > 0 and now_ns - self.last_active_ns <= IDLE_NS)

    def used_percent(self, now_ns: int) -> float:
        """Measured compute use within its bound, % of the card (0 when idle; see the module
        docstring): what decisions believe."""
        return round(min(self.use_ppm, PPM) * 100 / PPM, 2) if self.active(now_ns) else 0.0

    def reported_percent(self, now_ns: int) -> float:
        """Compute use as the share's own file reports it, unbounded, % of the card (0 when
        idle): what monitoring shows, so that a share over its cap is seen."""
        return round(self.reported_ppm * 100 / PPM, 2) if self.active(now_ns) else 0.0

    def over_cap(self, now_ns: int) -> bool:
        """Whether the share reports more than its bound: a strict share over its cap +
        STRICT_CAP_SLACK_PCT (or any share over the whole card)."""
        return self.active(now_ns) and self.reported_ppm > self.use_ppm


@dataclass(frozen=True)
class CardRegion:
    """The shares of one card (its roster), by owner, with their measured use."""

    uuid: str
    slots: dict[int, SlotUse]

    def used_percent(self, now_ns: int) -> float:
        """The shares' measured compute together, % of the card (at most 100)."""
        return min(100.0, round(sum(s.used_percent(now_ns) for s in self.slots.values()), 2))


def use_bound_ppm(entry: RosterEntry) -> int:
    """The most a share can use as the roster booked it (ppm of the card): a strict share with
    a cap, its cap + STRICT_CAP_SLACK_PCT; any other, the card."""
    if entry.policy == POLICY_STRICT and 0 < entry.cores < 100:
        return min(PPM, (entry.cores + STRICT_CAP_SLACK_PCT) * PPM // 100)
    return PPM


def read_card(card_fd: int, path: str) -> CardRegion:
    """The card folder ``card_fd`` (at ``path``): its roster's shares, each with what its
    share file says (an idle share when the file is missing, short or lying). Raises
    FileNotFoundError (no roster yet) or RosterError."""
    roster = read_roster(card_fd, where=path)
    slots: dict[int, SlotUse] = {}
    for entry in roster.shares().values():
        public = read_share_public(card_fd, entry.owner)
        if public is None:
            slots[entry.owner] = SlotUse(entry.owner, entry.cores, 0, 0, 0, 0)
            continue
        slots[entry.owner] = SlotUse(
            owner=entry.owner, cores=entry.cores, busy_total_ns=public["busy_total_ns"],
            last_active_ns=public["last_active_ns"],
            use_ppm=min(public["use_ppm"], use_bound_ppm(entry)), inflight_n=public["inflight_n"],
            reported_ppm=public["use_ppm"], last_complete_ns=public["last_complete_ns"],
            inflight_since_ns=public["inflight_since_ns"],
            est_ns=max(public["est_ns"], public["est_graph_ns"]))
    return CardRegion(roster.uuid or os.path.basename(path), slots)


_reported: dict[str, str] = {}


def _report(path: str, reason: str) -> None:
    """Log ``reason`` for ``path`` once (until the path reads fine again)."""
    if _reported.get(path) != reason:
        _reported[path] = reason
        log.warning("card folder %s skipped: %s", path, reason)


def scan_cards(runtime_dir: str) -> dict[str, CardRegion]:
    """Every readable card folder under ``<runtime_dir>/cards``: card UUID -> its shares.
    What cannot be read is skipped (module docstring), with one log line per path and
    reason."""
    folder = os.path.join(runtime_dir, CARDS_SUBDIR)
    out: dict[str, CardRegion] = {}
    try:
        dir_fd = os.open(folder, _DIR_FLAGS)
    except FileNotFoundError:
        return out
    except OSError as exc:
        _report(folder, str(exc))
        return out
    try:
        for name in os.listdir(dir_fd):
            _scan_one(folder, dir_fd, name, out)
    finally:
        os.close(dir_fd)
    return out


def _scan_one(folder: str, dir_fd: int, name: str, out: dict[str, CardRegion]) -> None:
    """Read one card folder into ``out``; errors are logged once per path and reason."""
    path = os.path.join(folder, name)
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        _report(path, str(exc))
        return
    if stat.S_ISREG(info.st_mode):
        _report(path, "a card region file of the previous version (one file per card); "
                      "the runtime hook replaces it with a card folder")
        return
    if not stat.S_ISDIR(info.st_mode):
        _report(path, f"not a folder (mode {info.st_mode:o})")
        return
    try:
        card_fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        _report(path, str(exc))
        return
    try:
        region = read_card(card_fd, path)
    except FileNotFoundError:
        return  # no roster yet: the hook is making the folder
    except (OSError, RosterError) as exc:
        _report(path, str(exc))
        return
    finally:
        os.close(card_fd)
    _reported.pop(path, None)
    out[region.uuid] = region
