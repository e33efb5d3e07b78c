"""Launch-bound work under a cap (issue 17): 10 us kernels launched back to back from one
thread, never synchronised, as LLM decoding, embedding and reranking services launch them.

The gate measures such a share with one event per group of launches (docs/compute.md,
"Measuring"), not one per launch. Here, in real time: no share over its cap by more than 3
points, each running in every window, and the shipped interposer groups its launches at all.
That the caps also hold within 3 points from below, and that the events stay within issue
17's 50 per 1000 launches, is checked on the simulated clock, on the shipped gate
(compute_sim caps10us, split10us: tests/compute/test_compute.py) and measured by
bench/compute.py and bench/compute_caps.py: on two shared cores the launching thread, not the
gate, decides how close to its cap such a share gets, and how many launches an event covers
(a slower host launches fewer per event: a cap-10 share recorded 89 per 1000 in a fresh-clone
run on a host 35% slower than usual, 2026-12-07).
"""

from __future__ import annotations

import time

import pytest

from . import cardregion
from .conftest import SPLIT_RUN_S, Node, ran_in_every_window, result, settled_mean

KERNEL_US = 10
NEVER = 100_000_000  # compute_load -s: synchronise every NEVER launches, i.e. never
# events per 1000 launches above which launches are not grouped: one event per launch is 1000;
# issue 17's 50 is held on the simulated clock (the module docstring)
UNGROUPED_EVENTS_PER_1000 = 250


def steady(r: dict) -> float:
    """Mean use of the 1 s windows after the first (the first holds the process's start)."""
    w = r["win_use_pct"][1:]
    return sum(w) / len(w)


# Three shares at a time, each on its own fake card: nine 10 us loops at once (up to 90 000
# gated launches a second each) would be more than two shared cores can launch.
@pytest.mark.parametrize(
    "caps", [(10, 40, 70), (20, 50, 80), (30, 60, 90)], ids=lambda c: "-".join(map(str, c))
)
def test_caps_hold_for_10us_kernels_back_to_back(node: Node, caps: tuple[int, ...]) -> None:
    procs = [
        (
            cap,
            i,
            node.load(node.env(f"s{cap}", [i], cores=cap, kernel_us=KERNEL_US), 3.5, "-s", NEVER),
        )
        for i, cap in enumerate(caps)
    ]
    time.sleep(2.6)
    # the events the gate recorded, seen where the node agent sees them (the slot goes when
    # the process exits): grouped, not one per launch
    seen = {}
    for cap, i, _ in procs:
        _, shares = cardregion.read(node.region(i))
        s = shares[0].raw
        seen[cap] = 1000 * s["events_total"] / max(1, s["launches_total"])
    for cap, _, p in procs:
        r = result(p)[0]
        assert steady(r) <= cap + 3 and ran_in_every_window(r), (cap, r)
        assert max(r["win_use_pct"][1:]) <= cap + 3 + 1, (cap, r)  # + a window's edge
        assert seen[cap] < UNGROUPED_EVENTS_PER_1000, (cap, seen[cap])


@pytest.mark.parametrize("policy", ["strict", "elastic"])
def test_split_30_70_for_10us_kernels_back_to_back(node: Node, policy: str) -> None:
    env_a = node.env("a", [0], cores=30, policy=policy, kernel_us=KERNEL_US)
    env_b = node.env("b", [0], cores=70, policy=policy, kernel_us=KERNEL_US)
    a = node.load(env_a, SPLIT_RUN_S, "-s", NEVER)
    b = node.load(env_b, SPLIT_RUN_S, "-s", NEVER)
    ra, rb = result(a)[0], result(b)[0]
    sa, sb = settled_mean(ra), settled_mean(rb)
    if policy == "strict":
        assert sa <= 33 and sb <= 73, (ra, rb)
    # how close to 30:70 they get is the host's here: the sim holds it (split10us)
    assert ran_in_every_window(ra) and ran_in_every_window(rb), (ra, rb)
