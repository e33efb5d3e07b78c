"""Fixtures for the compute tests: a fake node (fake GPU cards, an egpu runtime dir) on which
shares run compute_load under the interposer, each with its own config file."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from egpu.contract import container_region_path
from tests.probes import wait_for_hold

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "fakegpu" / "build"
LIB = ROOT / "libinterpose" / "build"
INTERPOSER = LIB / "libegpu_interpose.so"
NCARDS = 12


def card_uuid(i: int) -> str:
    return f"GPU-c0c0c0c0-0000-4000-8000-{i:012x}"


# Real-time tests (compute_load against the fake GPU's timeline, fixtures `node` and `card`)
# share two cores with whatever else runs. None is ever rerun: a check that a busy host can
# move is either relative to what the host let the same run do (an uncapped control share, the
# high share's own idle gaps), or it is a figure of bench/compute_realtime.py, not a test.
# The exact bounds are checked on the simulated clock (compute_sim), which has no host.


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    for d in ("fakegpu", "libinterpose"):
        subprocess.run(["make", "-s", "-C", str(ROOT / d)], check=True, capture_output=True)


@dataclass
class Node:
    """One fake node with NCARDS cards of card_mib each."""

    tmp: Path
    card_mib: int = 24576
    procs: list = field(default_factory=list)

    def __post_init__(self) -> None:
        ini = "".join(
            f"[card]\nuuid = {card_uuid(i)}\nname = NVIDIA Fake GPU\n"
            f"memory_mib = {self.card_mib}\n\n"
            for i in range(NCARDS)
        )
        (self.tmp / "fakegpu.ini").write_text(ini)

    def region(self, card: int) -> Path:
        return self.tmp / "egpu" / "cards" / card_uuid(card)

    def env(
        self,
        share: str,
        cards: list[int],
        *,
        cores: int = 0,
        priority: str = "high",
        policy: str = "strict",
        memory_mib: int = 4096,
        oversubscription: bool = False,
        kernel_us: float | None = None,
        preload: bool = True,
        low_priority_floor: int | None = None,
        **extra: object,
    ) -> dict:
        cfg = {
            "version": 1,
            "namespace": "ns",
            "pod": share,
            "pod_uid": f"uid-{share}",
            "container": "c",
            "priority": priority,
            "compute_policy": policy,
            "memory_oversubscription": oversubscription,
            "container_region": container_region_path(f"uid-{share}_c", str(self.tmp / "egpu")),
            "cards": [
                {
                    "uuid": card_uuid(c),
                    "memory_mib": memory_mib,
                    "cores": cores,
                    "card_region": str(self.region(c)),
                }
                for c in cards
            ],
        }
        if low_priority_floor is not None:
            cfg["low_priority_floor"] = low_priority_floor
        path = self.tmp / f"config-{share}.json"
        path.write_text(json.dumps(cfg))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(FAKE),
            "FAKEGPU_CONFIG": str(self.tmp / "fakegpu.ini"),
            "FAKEGPU_STATE_DIR": str(self.tmp / "fakegpu"),
            "EGPU_RUNTIME_DIR": str(self.tmp / "egpu"),
            "EGPU_CONFIG_PATH": str(path),
            "CUDA_VISIBLE_DEVICES": ",".join(card_uuid(c) for c in cards),
        }
        if preload:
            env["LD_PRELOAD"] = str(INTERPOSER)
        if kernel_us is not None:
            env["FAKEGPU_KERNEL_US"] = str(kernel_us)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def spawn(self, prog: str, args: list[str], env: dict, delay: float = 0) -> subprocess.Popen:
        if delay:
            time.sleep(delay)
        p = subprocess.Popen(
            [str(LIB / prog), *map(str, args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return p

    def load(self, env: dict, seconds: float, *args: object, delay: float = 0) -> subprocess.Popen:
        return self.spawn("compute_load", ["-t", str(seconds), *map(str, args)], env, delay)

    def wait_attached(self, card: int, p: subprocess.Popen, timeout_s: float = 10.0) -> None:
        """Until process p holds a slot in `card`'s region (its share is set up there): a fixed
        delay is no start order on a loaded machine, where a process's start-up can take
        longer than the delay."""
        from . import cardregion

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert p.poll() is None, result(p)
            try:
                _, shares = cardregion.read(self.region(card))
            except (OSError, ValueError):  # not created yet
                shares = []
            if any(p.pid in s.pids for s in shares):
                return
            time.sleep(0.02)
        raise AssertionError(f"pid {p.pid} has no slot on card {card} after {timeout_s} s")


# Two shares started together on a card they book whole: the newcomer's estimate of its
# kernels starts from launches queued behind the other's work, and on a loaded 2-core machine
# it can take up to ~2 s to settle (3 of 12 runs in full-suite runs: a 30% share at 13-20% in
# its second 1 s window; docs/compute.md, Known limits). FC-13 judges 10 s windows, where such
# a start costs under 3 points; the scaled-down split tests judge the windows after it.
SPLIT_SETTLE_WINDOWS = 2
SPLIT_RUN_S = 5  # three settled 1 s windows


# Launch-bound shares (kernels of 10-50 us, tens of thousands of gated launches a second) on a
# shared 2-core test machine: the launching thread, not the gate, often decides how close to
# its cap a share gets (26.8% seen for a 40% cap, 10 us kernels, 1 CI run in ~5; 59% for 80%,
# 50 us). Host load only lowers use, so these tests hold the cap from above exactly and from
# below only as "ran in every window" (a gate that holds a share for good fails it); the
# 3-point bound from below is held on the simulated clock, on the shipped gate (compute_sim
# caps10us, split10us, realistic), and measured in real time by bench/compute_caps.py.
def ran_in_every_window(r: dict) -> bool:
    """Whether a share's GPU use was above 0 in each 1 s window after the first."""
    return all(w > 0 for w in r["win_use_pct"][1:])


def settled_mean(r: dict) -> float:
    """Mean use (%) of a split run's 1 s windows after SPLIT_SETTLE_WINDOWS."""
    w = r["win_use_pct"][SPLIT_SETTLE_WINDOWS:]
    return sum(w) / len(w)


# A low-priority share (no floor) beside a busy high-priority one may run only where the high
# share's stream was empty for longer than the hold lets its mark stand (2 ms: at least 3/4 of
# it after the last mark, less a 0.5 ms poll; compute_load -i, 1000 us by default, reports
# those gaps as empty_over_ms / empty_over_n), and in each such gap at most
# HELD_KERNELS_A_GAP of its own kernels: one launched as the gap closes and one while its view
# of the mark is a refresh (hold / 8) old.
HELD_KERNELS_A_GAP = 2
# ... and besides, this % of the low share's steady span that no gap explains (its view of
# the card settling; what the tests allowed on a quiet host before: 1.5 points a window).
HELD_SLACK_PCT = 1.5


def held_busy_and_bound_ms(hi: dict, lo: dict, lo_kernel_us: float, *, window_ms: float = 1000,
                           windows: slice = slice(1, None)) -> tuple[float, float]:
    """(busy, bound): the ms of card time low share ``lo`` used in its ``windows`` (compute_load
    results; 1 s windows after the first unless told), and the most a low share held by the
    high share ``hi`` may use there: a lapsed priority (a low share beside a busy high share
    took ~45%) exceeds it; a busy host only widens the high share's gaps, which the bound
    follows. Both shares on one card, ``hi`` running throughout those windows."""
    w = lo["win_use_pct"][windows]
    busy = sum(w) * window_ms / 100
    bound = (hi["empty_over_ms"] + hi["empty_over_n"] * HELD_KERNELS_A_GAP * lo_kernel_us / 1000
             + HELD_SLACK_PCT / 100 * len(w) * window_ms)
    return busy, bound


# An uncapped high-priority share is never held by the gate: the card's time is its kernels'
# (use_pct), or its stream's while empty (idle_pct: the host's, the program's or a co-tenant's
# kernels' delay), within this many points (launch calls and the clock reads between).
UNHELD_SLACK_PTS = 3


def unheld(hi: dict) -> bool:
    """Whether compute_load result ``hi`` shows no time held in the gate (its use and its
    idle time fill the run, within UNHELD_SLACK_PTS)."""
    return hi["use_pct"] + hi["idle_pct"] >= 100 - UNHELD_SLACK_PTS


def result(p: subprocess.Popen, timeout: float = 60) -> list[dict]:
    """The JSON lines a compute_load process printed (one per device)."""
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"rc={p.returncode}\n{out}\n{err}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path)
    yield n
    for p in n.procs:
        if p.poll() is None:
            p.kill()
            p.wait()


# A node of small cards where another share holds part of card 0: what the oversubscription
# tests fill past the card (tests/compute/test_oversubscription_paths.py, test_stream_capture.py).
CARD_MIB = 2048
HELD_MIB = 512  # share B's allocation on card 0
CTX_MIB = 256  # EGPU_CONTEXT_OVERHEAD_MIB's default, charged to the share (not the card)


@pytest.fixture
def card(tmp_path: Path):
    """A node of CARD_MIB cards; share B holds HELD_MIB of card 0 until the test ends."""
    n = Node(tmp_path, card_mib=CARD_MIB)
    b = subprocess.Popen(
        [str(LIB / "cuprobe"), "init", "ctx", "alloc", str(HELD_MIB), "hold"],
        env=n.env("b", [0], memory_mib=HELD_MIB + CTX_MIB),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    n.procs.append(b)
    wait_for_hold(b, every_ok=True)
    yield n
    for p in n.procs:
        if p.poll() is None:
            p.kill()
            p.wait()
