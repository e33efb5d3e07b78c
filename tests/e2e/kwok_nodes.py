"""A kwok node with egpu cards, made afresh for an e2e module of the kwok lane
(test_scheduler_e2e.py, test_plugin_scheduler_e2e.py): one helper, so that both wait alike."""

from __future__ import annotations

import contextlib
from typing import Any

from devcluster import nodes as devnodes
from devcluster.cluster import wait_until
from scheduler.kube import ApiStatusError, RawApi


def missing(api: RawApi, path: str) -> bool:
    """Whether GET ``path`` answers 404."""
    try:
        api.json("GET", path)
    except ApiStatusError as exc:
        return exc.status == 404
    return False


def replace_node(api: RawApi, client: Any, body: dict[str, Any]) -> None:
    """Delete the node of ``body`` if it exists, create it with its capacity, and wait until
    it is Ready (kwok plays its kubelet)."""
    name = body["metadata"]["name"]
    with contextlib.suppress(ApiStatusError):
        api.json("DELETE", f"/api/v1/nodes/{name}")
    wait_until(f"node {name} gone", lambda: missing(api, f"/api/v1/nodes/{name}"))
    api.json("POST", "/api/v1/nodes", body=body)
    status = {"status": {k: body["status"][k] for k in ("capacity", "allocatable")}}
    api.json("PATCH", f"/api/v1/nodes/{name}/status", body=status,
             content_type="application/merge-patch+json")
    devnodes.wait_nodes_ready(client, [name], timeout_s=60)
