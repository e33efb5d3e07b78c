"""spread: use the emptiest card (and node) that fits, for the least contention per card.

Cards: emptiest first (lowest booked/capacity), ties by lowest index.
Nodes: score = 10 - round(10 x utilization after placement), floored at 0.
"""

from __future__ import annotations

NAME = "spread"
KEEP_TOGETHER = False  # a pod's shares spread like any others


def card_key(fullness: float, index: int) -> tuple[float, int]:
    """Emptiest card first, then lowest index."""
    return (fullness, index)


def node_score(utilization: float) -> int:
    """10 for an empty node, 0 for a full one."""
    return max(0, 10 - round(10 * utilization))
