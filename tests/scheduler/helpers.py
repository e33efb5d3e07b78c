"""Builders of pod and node objects (Kubernetes JSON dicts) for the scheduler's tests."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from egpu.contract import ANN_INVENTORY, ANN_INVENTORY_HEARTBEAT
from egpu.records import Card, Inventory

_uids = itertools.count(1)
NOW = 1_800_000_000.0  # a fixed "now" (unix seconds) for placement tests


def limits(gpus: int | None = 1, memory: int | None = None, percentage: int | None = None,
           cores: int | None = None) -> dict[str, int]:
    """egpu limits of one container (None: not given)."""
    out: dict[str, int] = {}
    for key, value in (("egpu.io/gpu", gpus), ("egpu.io/gpu-memory", memory),
                       ("egpu.io/gpu-memory-percentage", percentage),
                       ("egpu.io/gpu-cores", cores)):
        if value is not None:
            out[key] = value
    return out


def pod(name: str = "p", *, containers: list[dict[str, int]] | None = None,
        inits: list[dict[str, int]] | None = None, sidecars: list[dict[str, int]] | None = None,
        annotations: dict[str, str] | None = None, namespace: str = "default",
        uid: str | None = None, node: str = "", allocation: str | None = None,
        phase: str = "Pending") -> dict[str, Any]:
    """A pod with one container per entry of ``containers`` (limits dicts)."""
    ann = dict(annotations or {})
    if allocation is not None:
        ann["egpu.io/allocation"] = allocation
    spec: dict[str, Any] = {
        "schedulerName": "egpu-scheduler",
        "containers": [{"name": f"c{i}", "image": "x", "resources": {"limits": lim}}
                       for i, lim in enumerate(containers if containers is not None
                                               else [limits(memory=1000)])],
    }
    init_list = [{"name": f"init{i}", "image": "x", "resources": {"limits": lim}}
                 for i, lim in enumerate(inits or [])]
    init_list += [{"name": f"side{i}", "image": "x", "restartPolicy": "Always",
                   "resources": {"limits": lim}} for i, lim in enumerate(sidecars or [])]
    if init_list:
        spec["initContainers"] = init_list
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "uid": uid or f"uid-{next(_uids)}", "annotations": ann},
        "spec": spec,
        "status": {"phase": phase},
    }


def cards(n: int, model: str = "NVIDIA A10", memory: int = 23028,
          prefix: str = "GPU") -> list[Card]:
    """``n`` healthy cards ``<prefix>-<i>``."""
    return [Card(f"{prefix}-{i}", i, model, memory) for i in range(n)]


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, card_list: list[Card] | None, heartbeat: float | None = NOW) -> dict[str, Any]:
    """A node object with inventory (None: no annotation) and heartbeat annotations."""
    ann: dict[str, str] = {}
    if card_list is not None:
        ann[ANN_INVENTORY] = Inventory(tuple(card_list)).encode()
    if heartbeat is not None:
        ann[ANN_INVENTORY_HEARTBEAT] = rfc3339(heartbeat)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": ann}}
