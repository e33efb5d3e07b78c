"""Placement strategies: which card of a node, and how a node scores (one small module each).

A strategy orders the cards of a node that fit a share (the first is taken) and scores a node
0..10 from how full its cards would be after the pod is placed. ``get(policy)`` returns one by
its ``egpu.policies.PlacementPolicy`` (``binpack`` or ``spread``, the values of the
``egpu.io/gpu-policy`` and ``egpu.io/node-policy`` annotations and of the config defaults).

Fullness (``card_fullness``): booked MiB / capacity MiB of one card (may exceed 1 with memory
oversubscription); node utilization: booked MiB / capacity MiB summed over the node's healthy
cards, after placing the pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from egpu.policies import PlacementPolicy
from scheduler.strategies import binpack, spread

MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority


class _Module(Protocol):
    NAME: str
    KEEP_TOGETHER: bool

    def card_key(self, fullness: float, index: int) -> tuple[float, int]: ...

    def node_score(self, utilization: float) -> int: ...


@dataclass(frozen=True)
class Strategy:
    """A named pair of functions: ``card_key`` (sort key, smallest first) and ``node_score``."""

    name: PlacementPolicy
    module: _Module

    @property
    def keep_together(self) -> bool:
        """Prefer a card that takes all of a pod's one-card shares (binpack: yes)."""
        return self.module.KEEP_TOGETHER

    def card_key(self, fullness: float, index: int) -> tuple[float, int]:
        """Sort key of a card that fits; the card with the smallest key is taken first."""
        return self.module.card_key(fullness, index)

    def node_score(self, utilization: float) -> int:
        """Score 0..10 of a node whose cards would be ``utilization`` full (0..1, or more)."""
        return max(0, min(MAX_SCORE, self.module.node_score(utilization)))


STRATEGIES: dict[PlacementPolicy, Strategy] = {
    PlacementPolicy(m.NAME): Strategy(PlacementPolicy(m.NAME), m) for m in (binpack, spread)}


def get(name: PlacementPolicy | str) -> Strategy:
    """The strategy of the policy ``name``; raises KeyError naming the allowed ones."""
    policy = PlacementPolicy.of(name)
    if policy is None:
        raise KeyError(f"unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[policy]
