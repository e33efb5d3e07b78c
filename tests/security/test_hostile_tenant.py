"""A hostile container next to two honest shares of the same card (issue 15; docs/security.md).

One test per attack of demo/hostile_tenant.c. In every one, on the fake GPU's one card:

- an honest high-priority pod (50 cores, 4096 MiB) runs compute_load for HIGH_S seconds,
- an honest low-priority pod (50 cores, 4096 MiB, no floor) starts once the high one is on
  the card and runs compute_load for LOW_S seconds,
- the hostile pod (low priority, 10 cores, 1024 MiB) runs the attack from before the honest
  ones start until they are done (as root in its container, the default capabilities).

Then, whatever the attack:

- both honest containers exit 0 within their time (no SIGBUS, no hang);
- the high share keeps to its cap (each steady 1 s window <= cap + 3 points) and is not
  starved: held to its cap only while it was launching (the time its own thread left the
  stream empty, compute_load's idle_pct, is the host's, not the gate's);
- the low share stays held while the high one is busy (priority holds; no floor is set): it
  uses no more than the high share's empty gaps let through (tests/compute/conftest.py,
  held_busy_and_bound_ms);
- inside each honest container, mid-attack, cuMemGetInfo's total is the share and an
  allocation over it fails with out-of-memory while one within it succeeds;
- the node agent's view of the card (scan_cards) lists the honest shares with their booked
  cores, the high one's measured use within its cap, and no share the node did not book;
- the hostile program could change nothing the node or a co-tenant owns: every write,
  truncate, rename, unlink or create it tried on the roster, a co-tenant's share file, the
  card folder, the config, the preload list or the interposer failed (its own share file
  is its own to wreck).

Real time on a shared machine: every test runs once; what a busy host moves (the high share's gaps
and idle time) is measured in the same run and the bounds follow it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from demo.sandbox import Container, Result
from tests.compute.conftest import held_busy_and_bound_ms

from .conftest import CARD, KERNEL_US, Attempt, Share, Tenancy, attempts, load_rows

HIGH = Share("5ec00000-0000-4000-8000-000000000001", "high", 50, 4096)
LOW = Share("5ec00000-0000-4000-8000-000000000002", "low", 50, 4096)
HOSTILE = Share("5ec00000-0000-4000-8000-0000000000ff", "low", 10, 1024)
HIGH_S = 5.0  # the high share's run
LOW_S = 3.0  # the low share's, inside the high one's
HOSTILE_S = 30  # stopped (SIGTERM, then it reports) once the honest shares are done
# compute_load: 200 us kernels (conftest.KERNEL_US), a synchronisation every 16 launches. With
# longer kernels synchronised one by one a capped high share leaves gaps longer than the
# priority hold between its launches, and a low share runs in them even with no attack
# (1 ms: ~12%, 2 ms: ~39% next to a high share capped at 50%, in these containers).
SYNC_EVERY = "16"
CAP_SLACK = 3  # points over the cap a steady 1 s window may show (FC-13)
LOW_END_SLACK_S = 0.5
GATE_TICK_MS = 50  # the gate's rate tick (libinterpose/src/compute.c, TICK_DEFAULT_NS)
CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY = 0, 2

# What the node or a co-tenant owns, as the hostile program names it (its own share file,
# its own accounting folder and its own rootfs are its own).
PROTECTED = {"roster", "co-share", "card-region", "card-dir", "config", "preload", "interposer"}
# Attempts that change nothing by themselves: opening to lock, advisory locks (a co-tenant
# must not depend on them), temporary files made beside a target (in the container's own
# rootfs, or refused in the card folder; what counts is the rename over the target).
HARMLESS = {"open-lock", "flock-ex", "flock-sh", "setlk-r", "ofd-setlk-r", "create-temp",
            "symlink-temp", "mkfifo-temp", "mkdir-temp", "fork", "dlopen-libcuda", "cuInit",
            "cuCtxCreate", "cuMemAlloc", "ofd-pid-cell-r"}


@dataclass
class Outcome:
    """What one scenario produced."""

    high: Result
    low: Result
    hostile: Result
    high_end: float
    low_end: float
    probes: dict[str, tuple[Result, Result]]  # share -> (over the share, within it)
    view: object  # scan_cards()'s answer mid-attack, or the exception it raised
    view_ns: int
    not_attached: list[str]  # why an honest share was not on the card in time

    @property
    def attempts(self) -> list[Attempt]:
        return attempts(self.hostile)

    def tail(self) -> str:
        h, lo = self.high, self.low
        return (f"\n--- high rc={h.returncode}\n{h.stdout}{h.stderr[-1500:]}"
                f"\n--- low rc={lo.returncode}\n{lo.stdout}{lo.stderr[-1500:]}"
                f"\n--- hostile rc={self.hostile.returncode}\n{self.hostile.stdout[-3000:]}"
                f"{self.hostile.stderr[-1500:]}")


def _wait_all(high: Container, low: Container, timeout_s: float) -> tuple[float, float]:
    """Until both honest containers exit (or the timeout): their exit times."""
    ends: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(ends) < 2 and time.monotonic() < deadline:
        for name, c in (("high", high), ("low", low)):
            if name not in ends and c.proc.poll() is not None:
                ends[name] = time.monotonic()
        time.sleep(0.01)
    return ends.get("high", float("inf")), ends.get("low", float("inf"))


def run_attack(t: Tenancy, attack: str) -> Outcome:
    """The scenario of the module docstring."""
    from node_agent.metrics.card_region import scan_cards

    for share in (HIGH, LOW, HOSTILE):
        t.book(share)
    hostile = t.start(HOSTILE, ["/hostile", attack, str(HOSTILE_S)])
    time.sleep(0.3)  # the attack is under way before the honest shares come
    high = t.start(HIGH, ["/compute_load", "-t", str(HIGH_S), "-s", SYNC_EVERY])
    not_attached = [t.wait_attached(HIGH, high)]
    low = t.start(LOW, ["/compute_load", "-t", str(LOW_S), "-s", SYNC_EVERY])
    not_attached.append(t.wait_attached(LOW, low))
    time.sleep(0.7)
    view_ns = time.monotonic_ns()
    try:
        view: object = scan_cards(str(t.world.runtime_dir))
    except Exception as exc:  # reported by the assertion
        view = exc
    probes = {}
    for share, c in ((HIGH, high), (LOW, low)):
        over = c.exec(["/probe", str(share.memory_mib + 1)])
        within = c.exec(["/probe", "1024"])
        probes[share.priority] = (over, within)
    high_end, low_end = _wait_all(high, low, HIGH_S + 30)
    rh, rl = high.wait(5), low.wait(5)
    hostile.signal("TERM")  # it stops and reports
    rx = hostile.wait(15)
    return Outcome(rh, rl, rx, high_end, low_end, probes, view, view_ns,
                   [why for why in not_attached if why])


# --- what every test checks ---------------------------------------------------------------
def assert_co_tenants_unharmed(o: Outcome) -> None:
    for name, r in (("high", o.high), ("low", o.low)):
        assert r.returncode == 0, (
            f"the {name} share's container did not end well: rc={r.returncode} (135: SIGBUS, "
            f"124: still running, killed){o.tail()}")
    assert not o.not_attached, f"{'; '.join(o.not_attached)}{o.tail()}"
    rh, rl = load_rows(o.high), load_rows(o.low)
    assert len(rh) == 1 and len(rl) == 1, o.tail()
    high, low = rh[0], rl[0]
    steady = high["win_use_pct"][1:]
    assert steady, high
    cap = HIGH.cores
    assert max(steady) <= cap + CAP_SLACK, f"high share over its cap {cap}%: {high}"
    # held to its cap only while launching: a gate that an attack stalls holds it below
    launching = 1 - high["idle_pct"] / 100
    assert high["use_pct"] >= (cap - CAP_SLACK) * launching - CAP_SLACK, (
        f"high share starved: {high}")
    # a held low share's last launch may return only when the high one stops: it ends with it
    assert o.low_end <= o.high_end + LOW_END_SLACK_S, (
        "setup: the low share outlived the high one (host too slow to start it): "
        f"{o.low_end - o.high_end:.2f} s later{o.tail()}")
    assert low["win_use_pct"][1:], low
    busy, bound = held_busy_and_bound_ms(high, low, KERNEL_US)
    assert busy <= bound, (
        f"low share not held while the high one was busy: {busy:.0f} ms of the card, "
        f"its bound {bound:.0f} ms: {low}; the high share: {high}")
    for name, (over, within) in o.probes.items():
        for r in (over, within):
            assert r.returncode == 0, f"{name} share's probe: rc={r.returncode}\n{r.stderr}"
        v, w = over.values, within.values
        mib = {"high": HIGH, "low": LOW}[name].memory_mib
        assert v["total_mib"] == mib, f"{name}: {over.stdout}"
        assert v["alloc"] == CUDA_ERROR_OUT_OF_MEMORY, f"{name}: over the share: {over.stdout}"
        assert w["total_mib"] == mib and w["alloc"] == CUDA_SUCCESS, (
            f"{name}: within the share: {within.stdout}")
    assert isinstance(o.view, dict), f"the node agent's view raised {o.view!r}"
    assert CARD in o.view, f"the node agent does not see card {CARD}: {o.view}"
    slots = o.view[CARD].slots
    for share in (HIGH, LOW):
        assert share.owner in slots, f"{share.priority} share missing from {slots}"
        assert slots[share.owner].cores == share.cores, slots[share.owner]
    assert set(slots) <= {HIGH.owner, LOW.owner, HOSTILE.owner}, (
        f"the node agent sees shares the node never booked: {sorted(map(hex, slots))}")
    # what the share reports, unbounded (the exporter's reported figure): the bounded figure
    # is clamped to cap + CAP_SLACK by the agent, so a check on it could never fail
    used = slots[HIGH.owner].reported_percent(o.view_ns)
    assert 0 < used <= cap + CAP_SLACK, f"high share's reported use {used}%: {slots}"
    assert not slots[HIGH.owner].over_cap(o.view_ns), slots[HIGH.owner]
    # the low share's figure is its use smoothed over the gate's 50 ms ticks (halved each
    # tick): at most half of all the card time it ever used, over one tick -- bounded by what
    # the program itself launched (an independent count), not by its 1 s windows, which a
    # burst inside one tick can exceed twentyfold
    low_used = slots[LOW.owner].used_percent(o.view_ns)
    low_busy_ms = low["use_pct"] * low["wall_s"] * 10
    assert low_used <= 100 * low_busy_ms / (2 * GATE_TICK_MS) + CAP_SLACK, (
        f"low share's measured use {low_used}%: {slots[LOW.owner]}; what it launched: {low}")


def assert_nothing_protected_changed(o: Outcome) -> None:
    """The hostile program ran to its end, reached the roster and the co-tenants' files, and
    changed none of what the node or a co-tenant owns."""
    assert o.hostile.returncode == 0 and "done attack=" in o.hostile.stdout, (
        f"the hostile program did not finish: rc={o.hostile.returncode}{o.tail()}")
    seen = {a.target for a in o.attempts}
    assert {"roster", "co-share"} <= seen, (
        f"the attack did not reach the roster and the co-tenants' share files: {sorted(seen)}"
        f"{o.tail()}")
    changed = [a for a in o.attempts
               if a.target in PROTECTED and a.op not in HARMLESS and a.ok]
    assert not changed, "the hostile tenant changed what it does not own:\n" + "\n".join(
        f"  {a.op} on {a.target}: {a.ok} succeeded ({a.fail} failed {a.errnos})"
        for a in changed) + o.tail()


def refused_with(o: Outcome, op: str, target: str) -> set[str]:
    """The errnos with which ``op`` on ``target`` failed (it was tried and never succeeded)."""
    hits = [a for a in o.attempts if a.op == op and a.target == target]
    assert hits and not any(a.ok for a in hits), (op, target, hits)
    return {e for a in hits for e in a.errnos}


# --- one test per attack ------------------------------------------------------------------
def test_without_an_attack_the_honest_shares_keep_their_caps_and_priority(
        tenancy: Tenancy) -> None:
    """The control: the same scenario, the third tenant idle."""
    o = run_attack(tenancy, "idle")
    assert o.hostile.returncode == 0 and "done attack=idle" in o.hostile.stdout, o.tail()
    assert_co_tenants_unharmed(o)


def test_truncating_every_reachable_file_hurts_no_co_tenant(tenancy: Tenancy) -> None:
    o = run_attack(tenancy, "truncate")
    assert_nothing_protected_changed(o)
    assert refused_with(o, "open-w", "roster") == {"EROFS"}
    assert refused_with(o, "open-w", "co-share") == {"EROFS"}
    assert refused_with(o, "truncate-path", "co-share") == {"EROFS"}
    assert_co_tenants_unharmed(o)


def test_overwriting_every_reachable_file_with_random_bytes_hurts_no_co_tenant(
        tenancy: Tenancy) -> None:
    o = run_attack(tenancy, "random-bytes")
    assert_nothing_protected_changed(o)
    assert refused_with(o, "open-w", "co-share") == {"EROFS"}
    own = [a for a in o.attempts if a.target == "own-share" and a.op.startswith("pwrite")]
    assert own and all(a.ok for a in own), (
        f"it could not write (and lie in) its own share file: {own}")
    assert_co_tenants_unharmed(o)


def test_growing_every_reachable_file_to_a_gib_hurts_no_co_tenant(tenancy: Tenancy) -> None:
    o = run_attack(tenancy, "grow")
    assert_nothing_protected_changed(o)
    assert refused_with(o, "open-w", "roster") == {"EROFS"}
    assert_co_tenants_unharmed(o)


def test_replacing_every_reachable_file_hurts_no_co_tenant(tenancy: Tenancy) -> None:
    """A file, a symlink and a FIFO renamed over each file; unlink and create anew."""
    o = run_attack(tenancy, "replace")
    assert_nothing_protected_changed(o)
    assert refused_with(o, "unlink", "co-share") == {"EROFS"}
    assert refused_with(o, "create-temp", "roster") == {"EROFS"}  # in the card folder
    assert_co_tenants_unharmed(o)


def test_deleting_every_reachable_file_and_folder_hurts_no_co_tenant(tenancy: Tenancy) -> None:
    o = run_attack(tenancy, "delete")
    assert_nothing_protected_changed(o)
    assert refused_with(o, "unlink", "roster") == {"EROFS"}
    assert refused_with(o, "rmdir", "card-dir") <= {"EBUSY", "EROFS", "ENOTEMPTY"}
    assert_co_tenants_unharmed(o)


def test_holding_every_lock_it_can_take_hurts_no_co_tenant(tenancy: Tenancy) -> None:
    """flock, fcntl and OFD locks on every file (read locks where it may only read: the
    roster, the co-tenants' share files, each of their pid cells), held to the end; the
    robust mutex of its own share file taken and a fake locked one written there."""
    o = run_attack(tenancy, "hold-locks")
    assert_nothing_protected_changed(o)
    held = [a for a in o.attempts if a.target in ("roster", "co-share") and a.ok
            and a.op in ("flock-ex", "flock-sh", "setlk-r", "ofd-setlk-r", "ofd-pid-cell-r")]
    assert held, f"it held no lock on the roster or a co-tenant's file: {o.attempts}"
    assert_co_tenants_unharmed(o)


def test_flooding_slots_files_and_processes_hurts_no_co_tenant(tenancy: Tenancy) -> None:
    """Files and share-<random> files in the card folder, fake roster entries, fake pids in
    every share file's pid cells, 24 processes of its own share starting CUDA."""
    o = run_attack(tenancy, "flood-slots")
    assert_nothing_protected_changed(o)
    assert refused_with(o, "open-w", "co-share") == {"EROFS"}  # the pid cells stay theirs
    assert refused_with(o, "create-file", "card-dir") == {"EROFS"}
    assert refused_with(o, "create-share-file", "card-dir") == {"EROFS"}
    assert refused_with(o, "open-w", "roster") == {"EROFS"}
    forks = [a for a in o.attempts if a.op == "fork"]
    assert forks and forks[0].ok >= 16, forks
    assert_co_tenants_unharmed(o)


def test_the_hostile_program_ends_by_its_deadline(tenancy: Tenancy) -> None:
    """Alone on the card, for 1 s: it reports what it tried and exits on its own."""
    tenancy.book(HOSTILE)
    c = tenancy.start(HOSTILE, ["/hostile", "truncate", "1"])
    started = time.monotonic()
    r = c.wait(20)
    assert r.returncode == 0 and "done attack=truncate" in r.stdout, r
    assert time.monotonic() - started < 10, r
    assert attempts(r), r
