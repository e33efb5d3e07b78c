"""ResourceSlices of the simulated GPU nodes, as the node agent publishes them with ``--dra``.

The slices are built by the same core function (``egpu.dra.slices.sync``) from the same
inventory as the node annotation (``devcluster.nodes.inventory``), owned by the Node (deleted
with it), through the ``kubernetes`` ApiClient as plain JSON (``devcluster.kubeapi.api_request``).

    publish_node_slices(api_client, name, cards, memory_ratio=1.0, *,
                        shares_per_card) -> SlicePlan
    DevSliceStore(api_client)      # egpu.dra.slices.SliceStore

The kube-scheduler of the dev cluster (v1.37.2, default feature gates: DynamicResourceAllocation
GA, DRAConsumableCapacity beta and on, DRAExtendedResource GA) then places ResourceClaims of
the DeviceClasses in manifests/dra on these devices.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from devcluster.kubeapi import ApiError, api_request
from egpu.contract import DRA_DRIVER
from egpu.dra.slices import ResourceSlice, SlicePlan, sync
from egpu.records import Card

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"

class DevSliceStore:
    """``egpu.dra.slices.SliceStore`` through ``api_request``; raises ``ApiError`` for an
    answer that is not 2xx (a 404 on delete excepted)."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        answer = api_request(self.api_client, "GET", SLICES_PATH, query={
            "fieldSelector": f"spec.driver={DRA_DRIVER},spec.nodeName={node}"})
        return list(answer.get("items") or [])

    def create_slice(self, body: ResourceSlice) -> None:
        api_request(self.api_client, "POST", SLICES_PATH, dict(body),
                    query={"fieldValidation": "Strict"})

    def update_slice(self, body: ResourceSlice) -> None:
        name = quote(body["metadata"]["name"], safe="")
        api_request(self.api_client, "PUT", f"{SLICES_PATH}/{name}", dict(body),
                    query={"fieldValidation": "Strict"})

    def delete_slice(self, name: str) -> None:
        try:
            api_request(self.api_client, "DELETE", f"{SLICES_PATH}/{quote(name, safe='')}")
        except ApiError as exc:
            if exc.status != 404:
                raise


def publish_node_slices(api_client: Any, name: str, cards: tuple[Card, ...],
                        memory_ratio: float = 1.0, *,
                        shares_per_card: int) -> SlicePlan:
    """Bring the ResourceSlices of simulated node ``name`` to ``cards`` (owned by the Node,
    whose UID is read first), each card taking ``shares_per_card`` allocations: the number the
    node's own ``egpu.io/gpu`` capacity was made with (``devcluster.nodes.node_manifest``), so
    both paths offer a card the same shares (no default: a forgotten argument once published
    the config's 10 beside a node made with 4).
    Raises ``ApiError`` (a missing node: 404) and ``egpu.dra.slices.SliceError``."""
    node = api_request(api_client, "GET", f"/api/v1/nodes/{quote(name, safe='')}")
    return sync(DevSliceStore(api_client), name, cards, memory_ratio, node["metadata"]["uid"],
                shares_per_card=shares_per_card)
