"""The node annotations ``egpu.io/inventory`` and ``egpu.io/inventory-heartbeat``.

``inventory_patch(cards, now)`` is the pure merge patch; ``publish`` sends it with the
kubernetes client (PATCH nodes/<name>, needs RBAC ``nodes: patch``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from egpu.contract import ANN_INVENTORY, ANN_INVENTORY_HEARTBEAT
from egpu.records import Card, Inventory


def rfc3339(moment: datetime) -> str:
    """``2024-01-02T03:04:05Z`` (UTC, seconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def inventory_patch(cards: tuple[Card, ...], now: datetime) -> dict[str, Any]:
    """The strategic-merge patch body that sets both annotations."""
    return {"metadata": {"annotations": {
        ANN_INVENTORY: Inventory(cards=tuple(cards)).encode(),
        ANN_INVENTORY_HEARTBEAT: rfc3339(now),
    }}}


def publish(core_v1: Any, node: str, cards: tuple[Card, ...]) -> None:
    """PATCH the node's annotations now. Raises kubernetes ApiException on failure."""
    core_v1.patch_node(node, inventory_patch(cards, datetime.now(UTC)))
