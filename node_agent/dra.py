"""The node's ResourceSlices for the DRA driver ``gpu.egpu.io`` (``egpu-node-agent --dra``).

The slices come from ``egpu.dra.slices`` (one device per healthy card, consumable ``memory``,
``cores`` and ``shares``: the config's ``sharesPerCard``, at most the roster's 32); this
module is the API edge: ``KubeSliceStore`` lists, creates, replaces and deletes
ResourceSlices through the kubernetes client (``CustomObjectsApi``, plain JSON: the client's
model classes would drop v1 fields that are newer than the client), and
``DraPublisher.publish(cards)`` runs ``egpu.dra.slices.sync`` for this node with the Node's UID
as owner. The heartbeat loop calls it, and the health watcher's wake-up makes it run at once
when a card turns unhealthy.

RBAC: ``resourceslices`` (resource.k8s.io) get, list, watch, create, update, delete; ``nodes``
get (the owner's UID). Needs Kubernetes >= 1.34 (resource.k8s.io/v1) with consumable capacity
(``DRAConsumableCapacity``, on by default since 1.36).
"""

from __future__ import annotations

import logging
from typing import Any

from egpu.contract import DRA_DRIVER
from egpu.dra.slices import ResourceSlice, SlicePlan, sync
from egpu.records import Card

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSION = "v1"
PLURAL = "resourceslices"
FIELD_MANAGER = "egpu-node-agent"


class KubeSliceStore:
    """``egpu.dra.slices.SliceStore`` over a kubernetes ``ApiClient``. Raises the client's
    ``ApiException`` for an answer that is not 2xx (a 404 on delete excepted)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._api = client.CustomObjectsApi(api_client)

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        answer: Any = self._api.list_cluster_custom_object(
            GROUP, VERSION, PLURAL,
            field_selector=f"spec.driver={DRA_DRIVER},spec.nodeName={node}")
        return list(answer.get("items") or [])

    def create_slice(self, body: ResourceSlice) -> None:
        self._api.create_cluster_custom_object(GROUP, VERSION, PLURAL, dict(body),
                                               field_manager=FIELD_MANAGER,
                                               field_validation="Strict")

    def update_slice(self, body: ResourceSlice) -> None:
        self._api.replace_cluster_custom_object(GROUP, VERSION, PLURAL, body["metadata"]["name"],
                                                dict(body), field_manager=FIELD_MANAGER,
                                                field_validation="Strict")

    def delete_slice(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._api.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                raise


class DraPublisher:
    """Publishes one node's slices (``publish``), each time with the Node's current UID as
    owner (a Node deleted and created again gets its slices owned anew). ``shares_per_card``:
    the config's ``sharesPerCard``, how many allocations a card takes (``egpu.dra.slices``)."""

    def __init__(self, core_v1: Any, node: str, memory_ratio: float = 1.0, *,
                 shares_per_card: int) -> None:
        self.core_v1 = core_v1
        self.node = node
        self.memory_ratio = memory_ratio
        self.shares_per_card = shares_per_card
        self.store = KubeSliceStore(core_v1.api_client)

    def publish(self, cards: tuple[Card, ...]) -> SlicePlan:
        """Bring the node's ResourceSlices to ``cards`` (unhealthy ones leave). Raises
        ``egpu.dra.slices.SliceError`` for cards that cannot be published and the client's
        ``ApiException`` (a 409 when another writer came in between: the next beat retries)."""
        uid = self.core_v1.read_node(self.node).metadata.uid
        done = sync(self.store, self.node, cards, self.memory_ratio, uid,
                    shares_per_card=self.shares_per_card)
        if done.changed:
            log.info("ResourceSlices of %s: generation %d, %d created, %d updated, %d deleted",
                     self.node, done.generation, len(done.create), len(done.update),
                     len(done.delete))
        return done

    def withdraw(self) -> int:
        """Delete every ResourceSlice of this node's driver (egpu is being removed from the
        node: node_agent.uninstall); returns how many. Raises the client's ApiException."""
        slices = self.store.list_slices(self.node)
        for item in slices:
            self.store.delete_slice(item["metadata"]["name"])
        return len(slices)
