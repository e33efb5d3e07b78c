"""The node annotations ``egpu.io/inventory``, ``egpu.io/inventory-heartbeat``,
``egpu.io/usage`` (measured use, node_agent.usage), ``egpu.io/allocation-mode`` (``dra`` on
a node of the DRA pool, whose agent serves no device plugin: the scheduler places no share
there) and ``egpu.io/config`` (the config the agent runs: ``<generation> <source>``), sent
together in one PATCH.

``inventory_patch(cards, now, usage, mode)`` is the pure merge patch; ``publish`` sends it with the
kubernetes client (PATCH nodes/<name>, needs RBAC ``nodes: patch``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from egpu.contract import (
    ALLOCATION_MODE_EXTENDER,
    ALLOCATION_MODES,
    ANN_ALLOCATION_MODE,
    ANN_CONFIG,
    ANN_INVENTORY,
    ANN_INVENTORY_HEARTBEAT,
    ANN_USAGE,
)
from egpu.records import Card, Inventory, NodeUsage


def rfc3339(moment: datetime) -> str:
    """``2024-01-02T03:04:05Z`` (UTC, seconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def inventory_patch(cards: tuple[Card, ...], now: datetime, usage: NodeUsage | None = None,
                    mode: str = ALLOCATION_MODE_EXTENDER, config: str | None = None
                    ) -> dict[str, Any]:
    """The strategic-merge patch body that sets the annotations (usage: left as it is when
    None, e.g. when it could not be measured this time; mode: one of ALLOCATION_MODES, else
    ValueError; config: ``<generation> <source>``, left as it is when None)."""
    if mode not in ALLOCATION_MODES:
        raise ValueError(f"mode: {mode!r}; allowed: {', '.join(ALLOCATION_MODES)}")
    annotations = {
        ANN_INVENTORY: Inventory(cards=tuple(cards)).encode(),
        ANN_INVENTORY_HEARTBEAT: rfc3339(now),
        ANN_ALLOCATION_MODE: mode,
    }
    if usage is not None:
        annotations[ANN_USAGE] = usage.encode()
    if config is not None:
        annotations[ANN_CONFIG] = config
    return {"metadata": {"annotations": annotations}}


def publish(core_v1: Any, node: str, cards: tuple[Card, ...], usage: NodeUsage | None = None,
            mode: str = ALLOCATION_MODE_EXTENDER, config: str | None = None) -> None:
    """PATCH the node's annotations now. Raises kubernetes ApiException on failure."""
    core_v1.patch_node(node, inventory_patch(cards, datetime.now(UTC), usage, mode, config))
