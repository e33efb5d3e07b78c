"""Simulated GPU nodes for the dev cluster, from a cluster description (inputs/cluster.yaml).

Each node is kwok-managed (annotation ``kwok.x-k8s.io/node=fake``, no taint), carries the
labels of the file, capacity/allocatable cpu 64, memory 512Gi, pods 110 and
``egpu.io/gpu`` = cards x shares_per_card, and the node agent's annotations
``egpu.io/inventory`` (deterministic card UUIDs) and ``egpu.io/inventory-heartbeat``.

    create_nodes(api_client, cluster_file, shares_per_card=4) -> list[str]
    node_manifest(spec, shares_per_card=4, now=None) -> dict
    refresh_heartbeats(api_client, names) -> None
    HeartbeatRefresher(api_client, names, interval_s=10.0)   # context manager / thread
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from pathlib import Path
from typing import Any

import yaml

from devcluster.cluster import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE
from egpu.contract import ANN_INVENTORY, ANN_INVENTORY_HEARTBEAT, RES_GPU
from egpu.records import Card, Inventory

NODE_CPU = "64"
NODE_MEMORY = "512Gi"
NODE_PODS = "110"
DEFAULT_SHARES_PER_CARD = 4
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "devcluster.egpu.io")


def card_uuid(node: str, index: int) -> str:
    """``GPU-<uuid5(node/index)>``: stable across runs, distinct across nodes and cards."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def load_cluster(path: Path | str) -> list[dict[str, Any]]:
    """The ``nodes`` list of a cluster description."""
    data = yaml.safe_load(Path(path).read_text())
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list):
        raise ValueError(f"{path}: expected a mapping with a `nodes` list")
    return nodes


def inventory(spec: dict[str, Any]) -> Inventory:
    name = spec["name"]
    cards = spec.get("cards") or {}
    count = int(cards.get("count", 0))
    return Inventory(
        cards=tuple(
            Card(
                uuid=card_uuid(name, i),
                index=i,
                model=str(cards["model"]),
                memory_mib=int(cards["memoryMiB"]),
                healthy=True,
                # first half of the cards on NUMA node 0, second half on 1 (as on 8-GPU boxes)
                numa_node=(i * 2) // count if count >= 2 else 0,
            )
            for i in range(count)
        )
    )


def node_manifest(
    spec: dict[str, Any], shares_per_card: int = DEFAULT_SHARES_PER_CARD, now: str | None = None
) -> dict[str, Any]:
    """The Node object (as a dict) for one entry of the cluster description."""
    name = spec["name"]
    inv = inventory(spec)
    resources = {
        "cpu": NODE_CPU,
        "memory": NODE_MEMORY,
        "pods": NODE_PODS,
        RES_GPU: str(len(inv.cards) * shares_per_card),
    }
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **{str(k): str(v) for k, v in (spec.get("labels") or {}).items()},
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
                ANN_INVENTORY: inv.encode(),
                ANN_INVENTORY_HEARTBEAT: now or now_rfc3339(),
            },
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "phase": "Running",
        },
    }


def create_nodes(
    api_client: Any, cluster_file: Path | str, shares_per_card: int = DEFAULT_SHARES_PER_CARD
) -> list[str]:
    """Create (or update) the nodes of ``cluster_file``; returns their names."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api_client)
    names = []
    for spec in load_cluster(cluster_file):
        body = node_manifest(spec, shares_per_card)
        name = body["metadata"]["name"]
        try:
            core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.patch_node(name, {"metadata": body["metadata"]})
        # The create keeps status on most versions; set it explicitly so the resources are
        # there whatever the apiserver does with status on create.
        core.patch_node_status(
            name,
            {
                "status": {
                    "capacity": body["status"]["capacity"],
                    "allocatable": body["status"]["allocatable"],
                }
            },
        )
        names.append(name)
    return names


def refresh_heartbeats(api_client: Any, names: list[str] | tuple[str, ...]) -> None:
    """Set ``egpu.io/inventory-heartbeat`` to now on each node (as the node agent would)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    stamp = now_rfc3339()
    for name in names:
        core.patch_node(name, {"metadata": {"annotations": {ANN_INVENTORY_HEARTBEAT: stamp}}})


class HeartbeatRefresher:
    """Keeps the nodes' inventory heartbeats fresh from a daemon thread during a long test.

    with HeartbeatRefresher(api_client, names, interval_s=10):
        ...
    """

    def __init__(self, api_client: Any, names: list[str], interval_s: float = 10.0) -> None:
        self.api_client = api_client
        self.names = list(names)
        self.interval_s = interval_s
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="egpu-heartbeats", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                refresh_heartbeats(self.api_client, self.names)
            except Exception as exc:  # keep going; the test can inspect .errors
                self.errors.append(exc)

    def start(self) -> HeartbeatRefresher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)

    def __enter__(self) -> HeartbeatRefresher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
