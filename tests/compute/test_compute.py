"""Compute shares and co-location (issue 8): caps, splits, priority, the floor, oversubscription.

Two levels:
- the controller core in C on a simulated clock (libinterpose/build/compute_sim): 20
  simulated seconds per case, exact figures, no sleeping;
- end to end: compute_load under the interposer against the fake GPU, whose kernels take
  FAKEGPU_KERNEL_US of device time on a timeline shared by every process on a card. Time is
  real here, so windows are scaled down (1 s windows over 3-4 s runs instead of 10 s over a
  minute) and the shares run side by side on separate fake cards to keep the suite short.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
from pathlib import Path

import pytest

from tests.probes import wait_for_hold

from . import cardregion
from .conftest import (
    LIB,
    SPLIT_RUN_S,
    Node,
    held_busy_and_bound_ms,
    ran_in_every_window,
    result,
    settled_mean,
    unheld,
)

# --------------------------------------------------------------------------------------
# The controller core on a simulated clock


def sim(case: str) -> list[str]:
    p = subprocess.run(
        [str(LIB / "compute_sim"), case], capture_output=True, text=True, timeout=120
    )
    lines = p.stdout.splitlines()
    assert lines, p.stderr
    # "info" lines report a figure without checking it
    bad = [line for line in lines if not line.startswith(("ok ", "info "))]
    assert not bad and p.returncode == 0, "\n".join(bad)
    return lines


def _make_list(makefile: str, name: str) -> set[str]:
    """The file names a Makefile variable lists (continued lines joined)."""
    text = makefile.replace("\\\n", " ")
    line = next(x for x in text.splitlines() if x.startswith(f"{name} ="))
    return set(line.split("=", 1)[1].split())


def test_the_simulated_clock_runs_the_shipped_gate() -> None:
    """The exact compute checks judge the code that ships: gate_sim.so is built from the
    interposer's own gate and controller sources, all but the clock (fastclock.c), and the
    clock functions are all that the simulation supplies. Fails if a model of the gate (as
    compute_sim.c once held) or any other substitute comes back."""
    makefile = (LIB.parent / "Makefile").read_text()
    shipped, simulated = _make_list(makefile, "SRCS"), _make_list(makefile, "GATE_SRCS")
    assert simulated <= shipped
    gate = {f for f in shipped if f.startswith(("src/compute", "src/card_region"))}
    assert gate and gate <= simulated
    assert "src/fastclock.c" in shipped - simulated
    undefined = subprocess.run(
        ["nm", "-u", str(LIB / "gate_sim.so")], capture_output=True, text=True, check=True
    ).stdout.split()
    supplied = {name for name in undefined if name.startswith("egpu_")}
    assert supplied == {
        "egpu_now_ns", "egpu_fastclock_ns", "egpu_fastclock_init", "egpu_fastclock_rebase",
        "egpu_sleep_ns", "egpu_nap_ns", "egpu_nap_wake",
    }


def test_fc13_sim_caps_long_and_short_kernels() -> None:
    """FC-13: caps 10..90 hold within 3 points over 10 s windows, 50 us and 20 ms kernels."""
    lines = sim("caps")
    assert sum("window=" in line for line in lines) == 2 * 9 * 2


def test_sim_caps_hold_for_5_and_8us_kernels_at_a_real_drivers_call_costs() -> None:
    """Issue 17: 5 and 8 us kernels back to back from one thread, never synchronised, with a
    real driver's CPU per call (2.5 us a launch, 2.5 us an event record): caps 10..90 hold
    within 3 points over 10 s windows, and 30:70 splits (strict and elastic). The real-time
    version failed on loaded CPUs (the host, not the gate); 2 us kernels, shorter than a
    launch, are only reported (docs/compute.md, Known limits)."""
    lines = sim("realistic")
    assert sum("window=" in line for line in lines) == 2 * 9 * 2
    assert sum(line.startswith("ok realistic-split ") for line in lines) == 2 * 4 + 2 * 2
    assert sum(line.startswith("info realistic-2us ") and " use " in line for line in lines) == 2


def test_sim_caps_hold_for_10us_kernels_back_to_back() -> None:
    """Issue 17: 10 us kernels launched back to back from one thread, never synchronised, with
    the fake's and a real driver's CPU per launch: caps 10..90 within 3 points in every 10 s
    window (the real-time test, tests/compute/test_small_kernels.py, holds them from above and
    "not starved" from below), events <= 50 per 1000 launches."""
    lines = sim("caps10us")
    assert sum(" w=" in line and " use " in line for line in lines) == 2 * 9 * 2


def test_sim_split_30_70_for_10us_kernels_back_to_back() -> None:
    sim("split10us")


def test_sim_grouped_measuring_matches_the_true_gpu_time() -> None:
    """One event per group of launches (decode-like steps, a launch-bound loop): what the gate
    measures is within 5% of the true GPU time, with few events."""
    sim("gaps")


def test_fc13_sim_split_30_70() -> None:
    """FC-13: shares of 30 and 70 split 30:70 (strict and elastic), no share over its cap."""
    sim("split")


def test_sim_elastic_borrows_and_gives_back() -> None:
    sim("elastic")


def test_fc14_sim_priority_gating_and_resumption() -> None:
    """FC-14: high-priority latency near solo; low resumes within 20 ms; with and without cap."""
    sim("priority")


def test_fc14_sim_starvation_floor() -> None:
    sim("floor")


def test_sim_an_idle_poller_naps_and_the_first_launch_wakes_it() -> None:
    """A share that launches nothing for seconds passes its poller at most 5 times a quiet
    second (it polled every 5 ms, 200 times, before the nap); its first launch wakes the
    poller at once (not at the nap's end), and its 30% cap holds in the first second. A
    launch that waited in admission past the quiet second wakes the poller after its wait, so
    a high share's mark holds a low co-tenant off its kernels; launches the poller never
    counts (into a capture) do not wake it once a launch. Catches a poller that polls while
    quiet, a nap that only times out, a wake only before admission (low launches inside 12 of
    14 high kernels), and a poller that naps again at once after each wake (100 001 passes in
    a second)."""
    sim("nap")


# An idle share's poller sleeps in QUIET_NAP_NS (250 ms) naps once quiet for 1 s
# (libinterpose/src/compute_poll.c): over QUIET_S a second of quiet, at most QUIET_MAX_SLEEPS
# sleeps of any of its threads (a poll at the idle 5 ms is 400), and at most QUIET_MAX_CPU_S of
# CPU (a nap that returns at once, a spinning poller, sleeps never and burns a core; napping,
# ~1 ms in 2 s, polling every 5 ms ~10 ms).
QUIET_S = 2.0
QUIET_MAX_SLEEPS = 20
QUIET_MAX_CPU_S = 0.1


def _sleeps_and_cpu_s(pid: int) -> tuple[int, float]:
    """Voluntary context switches of every thread of process pid (each is one sleep), and
    the process's CPU time (user + system, s)."""
    sleeps = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                sleeps += int(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sleeps, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_capped_process_sleeps_in_naps(node: Node) -> None:
    """A process holding a context under a 30% cap, launching nothing: after its first quiet
    second its threads sleep at most QUIET_MAX_SLEEPS times in QUIET_S (a 5 ms poll: 400)
    and use at most QUIET_MAX_CPU_S (a poller spinning on a nap that returns at once: a
    core), so that 256 idle shares on a node cost no core. Sleeps are counted, not timed, and
    the CPU bound is 100 times what a nap takes: a loaded host moves neither past its bound."""
    p = node.spawn("cuprobe", ["init", "ctx", "hold"], node.env("idle", [0], cores=30))
    wait_for_hold(p, every_ok=True)
    time.sleep(1.5)
    sleeps0, cpu0 = _sleeps_and_cpu_s(p.pid)
    time.sleep(QUIET_S)
    sleeps1, cpu1 = _sleeps_and_cpu_s(p.pid)
    assert sleeps1 - sleeps0 <= QUIET_MAX_SLEEPS and cpu1 - cpu0 <= QUIET_MAX_CPU_S, (
        sleeps1 - sleeps0, cpu1 - cpu0)


# --------------------------------------------------------------------------------------
# Hostile co-tenants on the simulated clock: a lie may cost the liar, never a co-tenant
# (docs/security.md). Each liar is a process of its share writing its own share file.


def test_a_co_tenant_reporting_full_use_does_not_pin_an_elastic_neighbour() -> None:
    """A strict 10% share that never launches and writes use = demand = 100% (and "launched
    just now") into its share file. Catches co-tenants' use believed up to the whole card
    (compute.c reserved it whatever the booking; card_region.c clamped it only to 100%): an
    elastic 30% neighbour was held at 30% with the card 70% idle. Believed within its booking
    (10% + 3 points), the neighbour takes the rest less the 2-point headroom: 85%."""
    lines = sim("liar-use")
    assert sum(line.startswith("ok liar-use ") for line in lines) == 1


def test_elastic_shares_of_mixed_kernel_lengths_each_keep_their_guarantee() -> None:
    """Three elastic shares, all busy, of 30/35/35% with 2 ms / 1 ms / 50 us kernels: each
    gets its guarantee within 4 points (the meter's known error on mixed kernel lengths).
    Catches an elastic co-tenant's claimed use believed only up to its booking (a strict
    liar's bound applied to elastic shares too): the 50 us share got 2% of the card."""
    lines = sim("elastic-mix")
    assert sum(line.startswith("ok elastic-mix ") for line in lines) == 3


def test_a_share_killed_with_work_in_flight_stops_holding_its_co_tenants() -> None:
    """A strict 60% share's only process is SIGKILLed with launches in flight: they never
    settle, and its file keeps inflight_n > 0 and its last use. Catches readers that counted
    such a share active until a process of it launched again (only its own launch path
    expired stale in-flight work): its elastic 30% neighbour stayed at 38%. Readers apply the
    owner's quiet rule (250 ms or 8 estimates without news): the neighbour gets 98%."""
    lines = sim("killed")
    assert sum(line.startswith("ok killed ") for line in lines) == 2


def test_a_co_tenants_word_on_its_own_work_cannot_shrink_a_neighbours_measured_kernels() -> None:
    """A strict 10% share writes "my measured work ended 1 ms ago" (busy_until_ns) and
    "launched just now" at every moment. Catches one-launch samples whose start moved to any
    co-tenant's end inside them (compute_settle.c): a strict 30% share with 20 ms kernels ran
    at 100% charged 4.6%, and beside a strict 50% share with 50 us kernels took 96% of the card
    (the 50% share got 3.9%). A co-tenant's end now moves a start only as far as work it
    measured and counted as its own pays for: the caps, the charges (within 5% of the truth)
    and the third share's 50% hold. A liar that also counts that time as its own use (which
    the node agent then reports) is only reported (info lines): not bounded yet."""
    lines = sim("liar-shift")
    assert sum(line.startswith("ok liar-shift ") for line in lines) == 2 + 3 + 3


# --------------------------------------------------------------------------------------
# The region layout that docs/compute.md gives the node agent


def test_card_files_layout_matches_the_python_codecs() -> None:
    from egpu import card_roster

    out = subprocess.run([str(LIB / "compute_layout")], capture_output=True, text=True, check=True)
    c = {}
    for line in out.stdout.splitlines():
        name, off, size = line.split()
        c[name] = (int(off), int(size))
    assert c["slot.size"][1] == cardregion.SLOT_SIZE
    assert c["slot.public"][1] == cardregion.SLOT_PUBLIC
    for name, code, off in cardregion.SLOT_FIELDS:
        assert c[f"slot.{name}"] == (off, struct.calcsize("<" + code)), name
    assert c["roster.size"][1] == card_roster.ROSTER_SIZE
    assert c["entry.size"][1] == card_roster.ENTRY_SIZE
    assert c["roster.magic_value"][1] == card_roster.ROSTER_MAGIC
    assert c["roster.version_value"][1] == card_roster.ROSTER_VERSION
    assert c["roster.entry"][0] == card_roster.HEADER_SIZE


# --------------------------------------------------------------------------------------
# End to end against the fake GPU


@pytest.mark.parametrize(("kernel_us", "sync"), [(50, 16), (20000, 2)], ids=["50us", "20ms"])
def test_fc13_caps_hold_end_to_end(node: Node, kernel_us: int, sync: int) -> None:
    """FC-13: caps 10..90 (one share per fake card, all at once). Never above the cap: each
    1 s window after the first within cap + 3 (+ one kernel: 2 points of a 1 s window for
    20 ms kernels); no multi-second stalls. Not far below: for 20 ms kernels the steady
    windows average within 3 points; for 50 us kernels (18 000 gated launches a second at
    90%) a shared 2-core test machine may not launch fast enough to reach the cap, so there
    the bound below is loose -- the simulated-clock test holds it to 3 points."""
    caps = list(range(10, 100, 10))
    seconds = 3 if kernel_us < 1000 else 4
    procs = [
        (
            cap,
            node.load(
                node.env(f"s{cap}", [i], cores=cap, kernel_us=kernel_us), seconds, "-s", sync
            ),
        )
        for i, cap in enumerate(caps)
    ]
    quantum = 100.0 * kernel_us / 1e6  # one kernel in a 1 s window, in points
    for cap, p in procs:
        r = result(p)[0]
        steady = r["win_use_pct"][1:]
        mean = sum(steady) / len(steady)
        assert r["use_pct"] <= cap + 3, r
        assert max(steady) <= cap + 3 + quantum, r
        # 50 us kernels: nine shares need ~90 000 gated launches a second in all from two
        # cores: the host decides how close to the cap they get (conftest); the sim holds it
        if kernel_us >= 1000:
            assert mean >= cap - 3, r
        assert ran_in_every_window(r), r
        assert r["max_gap_ms"] < 1000, r  # 20 ms kernels at 10%: ~180 ms between launches


@pytest.mark.parametrize(("kernel_us", "sync"), [(50, 16), (20000, 2)], ids=["50us", "20ms"])
def test_fc13_split_30_70_end_to_end(node: Node, kernel_us: int, sync: int) -> None:
    a = node.load(node.env("a", [0], cores=30, kernel_us=kernel_us), SPLIT_RUN_S, "-s", sync)
    b = node.load(node.env("b", [0], cores=70, kernel_us=kernel_us), SPLIT_RUN_S, "-s", sync)
    ra, rb = result(a)[0], result(b)[0]
    sa, sb = settled_mean(ra), settled_mean(rb)
    assert ra["use_pct"] <= 33 and rb["use_pct"] <= 73, (ra, rb)
    if kernel_us >= 1000:
        assert 27 <= 100 * sa / (sa + sb) <= 33, (ra, rb)
        assert sa + sb >= 85, (ra, rb)
    else:  # launch-bound: the host may hold either share under its cap (conftest)
        assert ran_in_every_window(ra) and ran_in_every_window(rb), (ra, rb)


def test_fc13_multi_card_container_capped_on_every_card(node: Node) -> None:
    """FC-13: one container with two cards at 30% loading both."""
    p = node.load(node.env("m", [0, 1], cores=30, kernel_us=50), 3, "-d", 2, "-s", 16)
    time.sleep(2.2)
    # the node agent's view while it runs: each card's region shows the share's measured use
    for card in (0, 1):
        _, shares = cardregion.read(node.region(card))
        assert len(shares) == 1 and shares[0].cores == 30 and shares[0].pids == [p.pid]
        assert 20 <= shares[0].window_use_pct <= 33, shares[0]
    rows = result(p)
    assert len(rows) == 2
    for r in rows:
        steady = r["win_use_pct"][1:]
        assert max(steady) <= 33 and sum(steady) / len(steady) >= 0.8 * 30 - 3, rows
    # the share's processes are gone from its slot when the last one exits
    assert all(not s.pids for s in cardregion.read(node.region(0))[1])


@pytest.mark.parametrize(
    "entry", ["-e", "-c"], ids=["cuLaunchKernelEx", "cuLaunchCooperativeKernel"]
)
def test_fc13_every_launch_entry_point_is_capped(node: Node, entry: str) -> None:
    p = node.load(node.env("x", [0], cores=30, kernel_us=200), 2.5, "-s", 8, entry)
    r = result(p)[0]
    steady = r["win_use_pct"][1:]
    assert max(steady) <= 33 and sum(steady) / len(steady) >= 0.8 * 30 - 3, r


@pytest.mark.parametrize("lo_cores", [0, 50], ids=["uncapped", "capped-50"])
def test_fc14_high_priority_goes_first(node: Node, lo_cores: int) -> None:
    """FC-14: a high-priority loop of small kernels (0.5 ms every 100 ms) beside a
    low-priority loop of 2 ms kernels: its median latency stays near that of the same loop
    alone on another card in the same run (at most the low work already queued ahead of it:
    preemption is at kernel boundaries); a capped low loop stays under its cap. The tail
    latency, the low loop's longest pause and its use are figures of
    bench/compute_priority.py: a busy host moves them (a low loop's time in the gate also
    grows with its queue limit near high work, which no same-run figure bounds exactly)."""
    solo = node.load(node.env("solo", [1], kernel_us=500), 2.5, "-p", 100000)
    lo = node.load(node.env("lo", [0], cores=lo_cores, priority="low", kernel_us=2000), 4, "-s", 4)
    hi = node.load(node.env("hi", [0], kernel_us=500), 3, "-p", 100000, delay=0.5)
    rs, rh, rl = result(solo)[0], result(hi)[0], result(lo)[0]
    assert rh["lat_n"] >= 25
    # solo latency plus what the low share may keep queued (one 2 ms kernel while high
    # priority was seen in the last second); without the gate the low loop's queue of four
    # 2 ms kernels would add ~4 ms at the median
    assert rh["lat_us_p50"] <= rs["lat_us_p50"] + 2500, (rs, rh)
    if lo_cores:
        assert max(rl["win_use_pct"][1:]) <= lo_cores + 3, rl


def test_fc14_low_priority_waits_while_high_is_busy_and_resumes(node: Node) -> None:
    """A busy high-priority share holds a low one off the card (the low share uses no more
    than the high one's empty gaps allow); once it stops, the low one takes the card again
    (no cap set). Windows of 0.5 s, placed by the processes' own clocks."""
    window_ms = 500
    lo = node.load(node.env("lo", [0], priority="low", kernel_us=1000), 5, "-s", 2,
                   "-w", window_ms)
    # the high share starts a little over 1 s into the low one's run, whatever its start-up
    # took: a fixed delay from the spawn left no window before it on a loaded host
    node.wait_attached(0, lo)
    hi = node.load(node.env("hi", [0], kernel_us=1000), 1.5, "-s", 1, delay=1.2)
    rh, rl = result(hi)[0], result(lo)[0]
    assert unheld(rh), rh  # the high share had the card, but for its own gaps
    hi_start = rh["t0_ns"]
    hi_end = hi_start + rh["wall_s"] * 1e9
    win_ns = window_ms * 1e6

    def starts(i: int) -> float:
        return rl["t0_ns"] + i * win_ns

    n = len(rl["win_use_pct"])
    during = [i for i in range(n) if starts(i) >= hi_start and starts(i + 1) <= hi_end]
    before = [i for i in range(1, n) if starts(i + 1) <= hi_start]
    after = [i for i in range(n) if starts(i) >= hi_end + 20e6]  # resumed within 20 ms
    assert during and before and after, ("the runs did not overlap as set up", rh, rl)
    busy, bound = held_busy_and_bound_ms(
        rh, rl, 1000, window_ms=window_ms, windows=slice(during[0], during[-1] + 1))
    assert busy <= bound, (busy, bound, rh, rl)
    # resumed: after the high share, the low one runs as it did alone before it (a held
    # share that never resumes shows ~0)
    alone = sum(rl["win_use_pct"][i] for i in before) / len(before)
    resumed = min(rl["win_use_pct"][i] for i in after)
    assert resumed >= 0.7 * alone, (alone, resumed, rl)


@pytest.mark.parametrize("source", ["env", "file"])
@pytest.mark.parametrize("floor", [0, 10])
def test_fc14_starvation_floor(node: Node, floor: int, source: str) -> None:
    """The floor (off by default) keeps a low share alive beside a high share that never goes
    idle; set by the config file's low_priority_floor (clusters: lowPriorityFloorPercent) or,
    on raw nodes, EGPU_LOW_PRIORITY_FLOOR. The setting the share runs with is read from its
    slot on the card; what it does in real time is checked against the high share's gaps."""
    if source == "file":
        # the file wins over the environment, also when it says 0
        extra: dict = {"low_priority_floor": floor, "EGPU_LOW_PRIORITY_FLOOR": 10 - floor}
    else:
        extra = {"EGPU_LOW_PRIORITY_FLOOR": floor} if floor else {}
    hi = node.load(node.env("hi", [0], kernel_us=1000), 3, "-s", 1)
    node.wait_attached(0, hi)  # the low share starts beside a running high share
    lo = node.load(node.env("lo", [0], priority="low", kernel_us=1000, **extra), 2.5, "-s", 1)
    node.wait_attached(0, lo)
    _, shares = cardregion.read(node.region(0))
    [low_slot] = [s for s in shares if lo.pid in s.pids]
    assert low_slot.raw["floor_pct"] == floor, low_slot.raw
    rl, rh = result(lo)[0], result(hi)[0]
    assert unheld(rh), rh
    busy, bound = held_busy_and_bound_ms(rh, rl, 1000)
    if floor:
        # the floor's trickle on top of what the high share's gaps let through
        span_ms = 1000 * len(rl["win_use_pct"][1:])
        assert busy <= bound + (floor + 3) / 100 * span_ms, (busy, bound, rl, rh)
        # the floor's own bound (10 +- 3 points) is held on the shipped gate by the simulated
        # clock (compute_sim floor); in real time the host decides how much of it a launching
        # thread gets, and the check is that the low share ran in every window
        assert ran_in_every_window(rl), rl
    else:
        assert busy <= bound, (busy, bound, rl, rh)


def test_fc14_a_low_share_that_booked_cores_still_yields_to_an_uncapped_high_share(
        node: Node) -> None:
    """A high share with nothing booked is elastic beside shares that booked; a low share's
    booking is no reservation against it (low yields while high-priority work runs). Before,
    the low share's wait counted as demand, the high share's rate fell to 48% and the low
    one ran in the gaps (13%): the high share held in the gate, the low one past its gaps."""
    hi = node.load(node.env("hi", [0], kernel_us=1000), 3, "-s", 1)
    node.wait_attached(0, hi)
    lo = node.load(node.env("lo", [0], priority="low", cores=50, kernel_us=1000), 2.5, "-s", 1)
    rl, rh = result(lo)[0], result(hi)[0]
    assert unheld(rh), (rh, rl)
    busy, bound = held_busy_and_bound_ms(rh, rl, 1000)
    assert busy <= bound, (busy, bound, rl, rh)


def test_fc15_oversubscription_never_fails_below_the_cap(node: Node) -> None:
    """FC-15: a 24 GiB card; share B holds 8 GiB; share A (oversubscribed, 40 GiB limit)
    allocates 36 x 1 GiB, then everything its capacity view says is free: all succeed (what
    the card cannot hold comes from managed memory); one more MiB fails with out-of-memory."""
    b_env = node.env("b", [0], memory_mib=9216)  # 8 GiB + the context's overhead
    b = node.spawn("cuprobe", ["init", "ctx", "alloc", "8192", "hold"], b_env)
    wait_for_hold(b, every_ok=True)  # B holds its 8 GiB until killed
    a_env = node.env("a", [0], memory_mib=40960, oversubscription=True, FAKEGPU_MANAGED_HOST=1)
    rows = probe(a_env, "init", "ctx", "loop", "36", "alloc", "1024", ";", "meminfo")
    assert all(r[1] == "rc=0" for r in rows), rows  # the loop prints only failures
    kv = dict(x.split("=", 1) for x in rows[-1][2:])
    assert int(kv["total"]) == 40960 << 20, rows[-1]  # the share as booked, beyond the card
    free_mib = int(kv["free"]) >> 20
    assert free_mib >= 40960 - 36 * 1024 - 512, rows[-1]  # only the context overhead besides
    rows = probe(
        a_env, "init", "ctx", "loop", "36", "alloc", "1024", ";", "alloc", free_mib, "alloc", "1"
    )
    allocs = [r for r in rows if r[0] == "alloc"]
    assert [r[1] for r in allocs] == ["rc=0", "rc=2"], rows  # up to the cap yes, past it no
    # the same share without oversubscription stops where the card is full
    c_env = node.env("c", [0], memory_mib=40960)
    rows = probe(c_env, "init", "ctx", "loop", "36", "alloc", "1024", ";")
    assert any(r[0] == "alloc" and r[1] == "rc=2" for r in rows), rows


def probe(env: dict, *steps: object) -> list[list[str]]:
    p = subprocess.run(
        [str(LIB / "cuprobe"), *map(str, steps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return [line.split() for line in p.stdout.splitlines()]


def test_an_uncapped_share_alone_adds_no_driver_call(node: Node) -> None:
    """No cap, high priority, no low share on the card: launches go straight to the driver,
    and the gate adds no call of its own (no event recorded or queried: the fake driver's
    call counts). What the fast path costs in ns is bench/compute.py's uncapped_added_ns (a
    timing: a host moves it)."""
    counts = node.tmp / "calls.jsonl"
    env = node.env("u", [0], kernel_us=0, FAKEGPU_CALL_COUNTS=counts)
    r = result(node.load(env, 0.5, "-s", 1000000))[0]
    [calls] = [json.loads(line) for line in counts.read_text().splitlines()]
    assert calls["launch"] == r["launches"], (calls, r)
    assert calls["event_record"] == 0 and calls["event_query"] == 0, calls
