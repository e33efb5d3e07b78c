"""A card's folder (/var/run/egpu/cards/<uuid>/: the node's roster and one file per share) as
Python reads it: struct + pread, no ctypes, no mmap (a share may truncate its own file). The
full slot layout is described here; the tests check it against the C compiler's
(libinterpose/tests/compute_layout.c). The roster's codec is egpu.card_roster's.

Read without a lock: every field is an aligned 64- or 32-bit word, so one read is never
torn; two fields may come from different moments (fine for metrics).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

SLOT_SIZE = 4096  # a share file
SLOT_PUBLIC = 512  # what others read of it

SLOT_FIELDS = [
    ("owner", "Q", 0),
    ("pids", "16i", 8),
    ("priority", "I", 72),  # 0 high, 1 low
    ("policy", "I", 76),  # 0 strict, 1 elastic
    ("cores", "I", 80),
    ("flags", "I", 84),
    ("floor_pct", "I", 88),
    ("rate_ppm", "I", 92),
    ("level_ns", "q", 96),
    ("refill_ns", "Q", 104),
    ("floor_level_ns", "q", 112),
    ("pi_integral_ppm", "q", 120),
    ("est_ns", "Q", 128),
    ("inflight_ns", "Q", 136),
    ("win_start_ns", "Q", 144),
    ("win_busy_ns", "Q", 152),
    ("last_win_busy_ns", "Q", 160),
    ("last_win_len_ns", "Q", 168),
    ("busy_total_ns", "Q", 176),
    ("launches_total", "Q", 184),
    ("wait_total_ns", "Q", 192),
    ("last_active_ns", "Q", 200),
    ("busy_until_ns", "Q", 208),
    ("use_ppm", "Q", 216),
    ("demand_ppm", "Q", 224),
    ("tick_start_ns", "Q", 232),
    ("tick_busy_ns", "Q", 240),
    ("tick_wait_ns", "Q", 248),
    ("inflight_n", "Q", 256),
    ("inflight_since_ns", "Q", 264),
    ("est_graph_ns", "Q", 272),
    ("solo_ns", "2Q", 280),
    ("overlapped_total", "Q", 296),
    ("last_complete_ns", "Q", 304),
    ("events_total", "Q", 320),  # events the gate recorded to measure the share (one a group)
    ("queued_until_ns", "Q", 328),
    ("solo_n", "2I", 336),
    ("hi_mark_ns", "Q", 344),
]


@dataclass
class Share:
    index: int
    owner: int
    pids: list[int]
    priority: str
    policy: str
    cores: int
    busy_total_ns: int
    last_win_busy_ns: int
    last_win_len_ns: int
    launches_total: int
    wait_total_ns: int
    raw: dict

    @property
    def window_use_pct(self) -> float:
        """GPU use over the last complete window (1 s by default), % of the card."""
        if not self.last_win_len_ns:
            return 0.0
        return 100.0 * self.last_win_busy_ns / self.last_win_len_ns


def _unpack(buf: bytes, base: int, fields: list[tuple[str, str, int]]) -> dict:
    out: dict = {}
    for name, code, off in fields:
        vals = struct.unpack_from("<" + code, buf, base + off)
        out[name] = vals[0] if len(vals) == 1 else list(vals)
    return out


def read(path: str | Path) -> tuple[dict, list[Share]]:
    """The roster's header and the shares of a card folder (their public slots, with the
    priority, policy and cores the roster books)."""
    from egpu.card_roster import read_roster, share_file_name

    folder = Path(path)
    roster = read_roster(str(folder))
    shares = []
    for i, entry in roster.shares().items():
        try:
            with open(folder / share_file_name(entry.owner), "rb") as f:
                data = f.read(SLOT_PUBLIC)
        except FileNotFoundError:
            data = b""
        s = _unpack(data.ljust(SLOT_PUBLIC, b"\0"), 0, SLOT_FIELDS)
        shares.append(
            Share(
                index=i,
                owner=entry.owner,
                pids=[p for p in s["pids"] if p],
                priority=("high", "low")[entry.priority & 1],
                policy=("strict", "elastic")[entry.policy & 1],
                cores=entry.cores,
                busy_total_ns=s["busy_total_ns"],
                last_win_busy_ns=s["last_win_busy_ns"],
                last_win_len_ns=s["last_win_len_ns"],
                launches_total=s["launches_total"],
                wait_total_ns=s["wait_total_ns"],
                raw=s,
            )
        )
    return {"generation": roster.generation, "uuid": roster.uuid}, shares
