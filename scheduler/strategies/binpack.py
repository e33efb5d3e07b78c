"""binpack: fill the fullest card (and node) that fits, keeping other cards whole for big pods.

Cards: fullest first (highest booked/capacity), ties by lowest index.
Nodes: score = round(10 x utilization after placement), capped at 10.
"""

from __future__ import annotations

NAME = "binpack"
KEEP_TOGETHER = True  # a pod's one-card shares go on one card when one card takes them all


def card_key(fullness: float, index: int) -> tuple[float, int]:
    """Fullest card first, then lowest index."""
    return (-fullness, index)


def node_score(utilization: float) -> int:
    """0 for an empty node, 10 for a full one."""
    return min(10, round(10 * utilization))
