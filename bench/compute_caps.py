"""How exactly compute caps hold in real time, against the fake GPU.

    python bench/compute_caps.py [--seconds 6] [--at-once 3]

For kernels of 10 us (launched back to back, never synchronised: LLM decoding), 50 us
(synchronised every 16 launches) and 20 ms (every 2): caps 10..90, --at-once shares at a time,
each on its own fake card; then a 30% and a 70% share together on one card (strict). Each
figure is the mean use of the 1 s windows after the first SETTLE_WINDOWS of a --seconds run
(libinterpose/build/compute_load), in % of the card.

The real-time tests hold these shares under their caps and running (tests/compute); the
3-point bound from below is checked on the simulated clock on the shipped gate
(libinterpose/build/compute_sim) and measured in real time here. On a shared
machine the launching thread may not keep up with 10 us kernels: a figure below the cap
there says more about the host than about the gate (docs/benchmarks.md records the machine).

Last line:
    cap_err_max_pts_10us=N cap_err_max_pts_50us=N cap_err_max_pts_20ms=N
    split30_10us=N split30_50us=N split30_20ms=N over_cap_max_pts=N
(cap_err: the largest |use - cap| over caps 10..90; split30: the 30% share's part of the two
shares' use, %; over_cap: the most any share's window went over its cap). Targets (FC-13,
issue 17): cap errors <= 3, split30 in 27..33, over_cap_max_pts <= 3 (+ one kernel).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

from testbed.fakenode import FakeNode, build  # noqa: E402

CAPS = tuple(range(10, 100, 10))
SPLIT = (30, 70)
SETTLE_WINDOWS = 2  # 1 s windows left out: the process's start and the estimate settling
NEVER = 100_000_000  # compute_load -s: synchronise every NEVER launches, i.e. never
# name: (kernel length in us, compute_load -s: synchronise every N launches)
KERNELS = {"10us": (10, NEVER), "50us": (50, 16), "20ms": (20000, 2)}


def run(node: FakeNode, shares: list[tuple[int, int]], kernel: str, seconds: float) -> list[dict]:
    """Run (card, cores) shares at once; their compute_load results, in order."""
    kernel_us, sync = KERNELS[kernel]
    procs = [node.load(node.env(card, cores, kernel_us), seconds, "-s", sync)
             for card, cores in shares]
    return [node.result(p, seconds + 60) for p in procs]


def settled(r: dict) -> float:
    """Mean use (%) of the windows after SETTLE_WINDOWS."""
    w = r["win_use_pct"][SETTLE_WINDOWS:]
    return sum(w) / len(w)


def over_cap(r: dict, cap: int) -> float:
    """Points the share's fullest window after the first went over its cap (0 if none)."""
    return max(0.0, max(r["win_use_pct"][1:]) - cap)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--at-once", type=int, default=3, help="shares run at once, one card each")
    a = ap.parse_args()
    if a.seconds < SETTLE_WINDOWS + 1:
        raise SystemExit(f"--seconds: {a.seconds}; allowed: at least {SETTLE_WINDOWS + 1}")
    if not 1 <= a.at_once <= len(CAPS):
        raise SystemExit(f"--at-once: {a.at_once}; allowed: 1..{len(CAPS)}")
    build()
    figures: dict[str, float] = {}
    worst_over = 0.0
    with tempfile.TemporaryDirectory() as t:
        node = FakeNode(Path(t), a.at_once)
        for kernel in KERNELS:
            errs = []
            for i in range(0, len(CAPS), a.at_once):
                caps = CAPS[i : i + a.at_once]
                rows = run(node, list(enumerate(caps)), kernel, a.seconds)
                for cap, r in zip(caps, rows, strict=True):
                    errs.append(abs(settled(r) - cap))
                    worst_over = max(worst_over, over_cap(r, cap))
                    print(f"{kernel} cap {cap}%: {settled(r):.1f}% windows {r['win_use_pct']}")
            rows = run(node, [(0, SPLIT[0]), (0, SPLIT[1])], kernel, a.seconds)
            sa, sb = settled(rows[0]), settled(rows[1])
            for cap, r in zip(SPLIT, rows, strict=True):
                worst_over = max(worst_over, over_cap(r, cap))
            print(f"{kernel} split 30:70 on one card: {sa:.1f}% and {sb:.1f}%")
            figures[f"cap_err_max_pts_{kernel}"] = max(errs)
            figures[f"split30_{kernel}"] = 100 * sa / (sa + sb)
    figures["over_cap_max_pts"] = worst_over
    print(" ".join(f"{k}={v:.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
