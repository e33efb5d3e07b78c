"""Simulated GPU nodes for the dev cluster, from a cluster description (inputs/cluster.yaml).

Each node is kwok-managed (annotation ``kwok.x-k8s.io/node=fake``, no taint), carries the
labels of the file, capacity/allocatable cpu 64, memory 512Gi, pods 110 and (with
``device_plugin``, as a node agent serving the device plugin) ``egpu.io/gpu`` = cards x
shares_per_card, and the node agent's annotations
``egpu.io/inventory`` (deterministic card UUIDs) and ``egpu.io/inventory-heartbeat``, and (as
the node agent with ``--dra``) its ResourceSlices of the DRA driver gpu.egpu.io
(``devcluster.dra``), each card offering the same shares_per_card.

    create_nodes(api_client, cluster_file, shares_per_card=4, ready_timeout_s=60,
                 dra_slices=True, device_plugin=True) -> list[str]
    node_manifest(spec, shares_per_card=4, now=None, device_plugin=True) -> dict
    wait_nodes_ready(api_client, names, timeout_s=60) -> None
    refresh_heartbeats(api_client, names) -> None
    HeartbeatRefresher(api_client, names, interval_s=10.0)   # context manager / thread

A new Node is born with the ``node.kubernetes.io/not-ready:NoSchedule`` taint (admission
plugin TaintNodesByCondition); the node lifecycle controller removes it once kwok reports the
node Ready. ``create_nodes`` waits for that (``wait_nodes_ready``), so callers never race it.

Requests go through the ``kubernetes`` ApiClient as plain JSON (``api_request`` of
devcluster.kubeapi, also importable from here with ``ApiError`` and ``MERGE_PATCH``).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from devcluster.dra import publish_node_slices
from devcluster.errors import DevClusterError
from devcluster.kubeapi import MERGE_PATCH as MERGE_PATCH
from devcluster.kubeapi import ApiError as ApiError
from devcluster.kubeapi import api_request as api_request
from devcluster.kwok import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE
from egpu.contract import ANN_INVENTORY, ANN_INVENTORY_HEARTBEAT, RES_GPU
from egpu.records import Card, Inventory

NODE_CPU = "64"
NODE_MEMORY = "512Gi"
NODE_PODS = "110"
DEFAULT_SHARES_PER_CARD = 4
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "devcluster.egpu.io")
# Taints of the node lifecycle controller (not-ready, unreachable, pressure conditions...).
LIFECYCLE_TAINT_PREFIX = "node.kubernetes.io/"


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
    spec: dict[str, Any], shares_per_card: int = DEFAULT_SHARES_PER_CARD, now: str | None = None,
    device_plugin: bool = True,
) -> dict[str, Any]:
    """The Node object (as a dict) for one entry of the cluster description; without
    ``device_plugin`` it offers no ``egpu.io/gpu`` (a DRA-only node)."""
    name = spec["name"]
    inv = inventory(spec)
    resources = {
        "cpu": NODE_CPU,
        "memory": NODE_MEMORY,
        "pods": NODE_PODS,
        **({RES_GPU: str(len(inv.cards) * shares_per_card)} if device_plugin else {}),
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
    api_client: Any,
    cluster_file: Path | str,
    shares_per_card: int = DEFAULT_SHARES_PER_CARD,
    ready_timeout_s: float = 60.0,
    dra_slices: bool = True,
    device_plugin: bool = True,
) -> list[str]:
    """Create (or update) the nodes of ``cluster_file``, with ``dra_slices`` their
    ResourceSlices (``devcluster.dra.publish_node_slices``), and wait until each is Ready and
    without lifecycle taints (``wait_nodes_ready``); returns their names. Without
    ``device_plugin`` (a node whose agent runs ``--dra --no-device-plugin``) the nodes offer
    no ``egpu.io/gpu``; their slices still offer ``shares_per_card`` a card.

    ``ready_timeout_s=0`` returns without waiting. Raises ``DevClusterError``."""
    names = []
    for spec in load_cluster(cluster_file):
        names.append(put_node(api_client, node_manifest(spec, shares_per_card,
                                                        device_plugin=device_plugin)))
        if dra_slices:
            publish_node_slices(api_client, names[-1], inventory(spec).cards,
                                shares_per_card=shares_per_card)
    if ready_timeout_s:
        wait_nodes_ready(api_client, names, ready_timeout_s)
    return names


def put_node(api_client: Any, body: dict[str, Any]) -> str:
    """Create the Node ``body`` (``node_manifest``), or update the metadata of an existing
    one, then set its capacity and allocatable (status subresource); returns its name. An
    ``egpu.io/gpu`` the body lacks is removed from an existing node (a merge patch keeps
    what it does not name)."""
    name = body["metadata"]["name"]
    try:
        api_request(api_client, "POST", "/api/v1/nodes", body)
    except ApiError as exc:
        if exc.status != 409:
            raise
        api_request(api_client, "PATCH", f"/api/v1/nodes/{name}",
                    {"metadata": body["metadata"]}, MERGE_PATCH)
    # The create keeps status on most versions; set it explicitly so the resources are
    # there whatever the apiserver does with status on create (and on an update).
    status = {"status": {k: {RES_GPU: None, **body["status"][k]}
                         for k in ("capacity", "allocatable")}}
    api_request(api_client, "PATCH", f"/api/v1/nodes/{name}/status", status, MERGE_PATCH)
    return str(name)


def _not_ready(node: dict[str, Any]) -> str:
    """Why a Node object is not usable yet ("" when it is Ready and has no lifecycle taint)."""
    why = []
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    if ready != "True":
        why.append(f"Ready={ready or 'missing'}")
    taints = [f"{t.get('key')}:{t.get('effect')}" for t in (node.get("spec") or {}).get(
        "taints") or [] if str(t.get("key", "")).startswith(LIFECYCLE_TAINT_PREFIX)]
    if taints:
        why.append(f"taints {', '.join(taints)}")
    return ", ".join(why)


def wait_nodes_ready(
    api_client: Any, names: list[str] | tuple[str, ...], timeout_s: float = 60.0,
    interval_s: float = 0.25,
) -> None:
    """Wait until every node of ``names`` has condition Ready=True and no taint of the node
    lifecycle controller (``node.kubernetes.io/...``, e.g. ``not-ready:NoSchedule``).

    Raises ``DevClusterError`` after ``timeout_s`` naming each node still not usable and why
    (a missing node, ``Ready=Unknown``, the taints left)."""
    wanted = set(names)
    deadline = time.monotonic() + timeout_s
    problems: dict[str, str] = {}
    while True:
        items = api_request(api_client, "GET", "/api/v1/nodes")["items"]
        found = {item["metadata"]["name"]: item for item in items}
        problems = {}
        for name in wanted:
            node = found.get(name)
            why = "missing" if node is None else _not_ready(node)
            if why:
                problems[name] = why
        if not problems:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(interval_s)
    shown = "; ".join(f"{n}: {why}" for n, why in sorted(problems.items())[:10])
    more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
    raise DevClusterError(
        f"{len(problems)} of {len(wanted)} nodes not Ready and untainted after {timeout_s:.0f}s:"
        f" {shown}{more}. kwok marks its nodes Ready and the controller manager then removes"
        " the not-ready taint: are both running (python -m devcluster status; logs in"
        " <state>/logs/kwok.log, kube-controller-manager.log)?"
    )


def refresh_heartbeats(api_client: Any, names: list[str] | tuple[str, ...]) -> None:
    """Set ``egpu.io/inventory-heartbeat`` to now on each node (as the node agent would)."""
    body = {"metadata": {"annotations": {ANN_INVENTORY_HEARTBEAT: now_rfc3339()}}}
    for name in names:
        api_request(api_client, "PATCH", f"/api/v1/nodes/{name}", body, MERGE_PATCH)


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
