"""The host's NVIDIA device nodes: which a card needs, and which this node has.

A container uses a card through its device nodes: ``/dev/nvidiactl`` (every card) and
``/dev/nvidia<index>`` (the card's own). A card whose node is missing on the host cannot be used
by any container, so the agent marks it unhealthy (the device plugin reports it Unhealthy, the
DRA ResourceSlices leave it out) and says which node is missing, until the node is there again.
``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` are created on demand by the driver's
nvidia-modprobe on a real node: missing, they are only left out of the CDI spec.

The agent sees the host's ``/dev`` at ``dev_root`` (the chart mounts it read-only at
``/host/dev``); only character devices count (a regular file at ``/dev/nvidia0`` is a broken
setup, not a card). The fake GPU provides its own nodes (``devcluster.fake_toolkit``).

    present_under(dev_root) -> present(path)       path: a host path under /dev
    missing_card_nodes(cards, present) -> {uuid: (path, ...)}   only cards with a node missing
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence

from egpu.records import Card
from node_agent.cdi import CARD_DEVICE_NODE

HOST_DEV = "/dev"
CARD_CONTROL_NODE = "/dev/nvidiactl"  # every card's: no CUDA context without it


def present_under(dev_root: str) -> Callable[[str], bool]:
    """A check of host device node ``path`` (``/dev/...``) seen under ``dev_root``: whether it
    exists there as a character device."""

    def present(path: str) -> bool:
        rel = os.path.relpath(path, HOST_DEV)
        if rel.startswith(".."):
            raise ValueError(f"device node {path!r}: not under {HOST_DEV}")
        try:
            return stat.S_ISCHR(os.stat(os.path.join(dev_root, rel)).st_mode)
        except OSError:
            return False

    return present


def missing_card_nodes(cards: Sequence[Card], present: Callable[[str], bool]
                       ) -> dict[str, tuple[str, ...]]:
    """For each card with a device node missing (``present`` False): its UUID and the missing
    paths, the control node first. Cards with all their nodes are left out."""
    control = () if present(CARD_CONTROL_NODE) else (CARD_CONTROL_NODE,)
    missing = {}
    for card in cards:
        own = CARD_DEVICE_NODE.format(index=card.index)
        paths = control + (() if present(own) else (own,))
        if paths:
            missing[card.uuid] = paths
    return missing
