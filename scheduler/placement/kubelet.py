"""What the kubelet's device manager does with egpu's slots (kubelet v1.37, pkg/kubelet/cm/
devicemanager: ``Allocate``, ``devicesToAllocate``), so that placement never asks it for a
card it would not give (docs/node.md, "One binding of pod to cards").

Two facts decide which card a container's slots land on:

1. Reuse. A regular init container's devices go to the pod's reuse pool; the next container
   that asks for ``egpu.io/gpu`` takes the pool's devices first without asking the plugin: all
   of them when it needs at least as many, an arbitrary subset (a Go map's order) when it needs
   fewer. A sidecar (restartable init container) or app container then removes what it took
   from the pool. ``reuse_conflict`` says where a placement disagrees with that.
2. No pod identity. GetPreferredAllocation and Allocate name slots, never the pod. The node
   agent answers GetPreferredAllocation with the cards of the first pending container of the
   asked size (node_agent.deviceplugin.matching); that is the container being admitted
   whenever the pods that await admission on the node agree on the cards of each size, or one
   pod alone has containers of that size. egpu-kube-scheduler binds a pod only when that holds
   (its bind gate: kube-scheduler/gate).

Pure functions over card sets: no Kubernetes objects, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

_Card = TypeVar("_Card", bound=Hashable)  # a card: its UUID, or its position in a search


def reuse_conflict(steps: Sequence[tuple[bool, frozenset[_Card]]],
                   names: Sequence[str] = ()) -> str | None:
    """Why the kubelet's reuse of init containers' devices (module doc, 1.) would give some
    container other cards than ``steps`` say, or None when it gives each exactly its cards.

    ``steps``: (regular init?, cards) per container with a share, in the kubelet's order;
    ``names``: the containers' names in the same order (messages)."""
    pool: frozenset[_Card] = frozenset()
    before = ""
    for i, (regular_init, cards) in enumerate(steps):
        name = names[i] if i < len(names) else f"#{i}"
        if len(pool) > len(cards):
            return (f"container {name!r} asks for {len(cards)} card(s) after init container "
                    f"{before!r}, which had {len(pool)}: the kubelet hands it an arbitrary "
                    f"{len(cards)} of those")
        if not pool <= cards:
            return (f"container {name!r} would get init container {before!r}'s card(s) from "
                    "the kubelet, which reuses them for the next container")
        pool = cards if regular_init else frozenset()
        before = name
    return None
