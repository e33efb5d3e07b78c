"""Prepare and unprepare claims of the DRA driver ``gpu.egpu.io`` on this node.

``DraDriver.prepare(namespace, uid, name)`` (NodePrepareResources, one claim):

1. a claim prepared before (its state file, ``state.ClaimStore``) answers the same again
   (the kubelet retries; restarts keep it) after rewriting any of its files that is missing;
2. otherwise the ResourceClaim and the pods of its ``status.reservedFor`` are read from the
   API server (``ApiReader``) and the shared core's ``egpu.dra.allocation.prepare`` makes the
   ``PreparedClaim``; a claim whose UID differs (deleted and created again under the same
   name) is refused;
3. each of its pods' allocation file is composed from all of the pod's prepared claims
   (``egpu.dra.allocation.pod_shares``; conflicts refuse the claim before anything is
   written), then the state, the pods' allocation files, the claim's shares file (for pods
   that join the claim later: the kubelet prepares a claim once) and the claim's CDI spec
   are written (``CdiPublisher.publish_claim``);
4. the answer: per device (allocation result) its request, pool, device, share ID and CDI
   device IDs: the card's (``egpu.io/gpu=<uuid>``, and ``nvidia.com/gpu=...`` where the
   toolkit's spec names it: ``CdiPublisher.names``, as the device plugin's Allocate) and the
   device of the result's request, ``egpu.io/gpu=claim-<uid>-<request>``.

The runtime hook, which the cards' CDI devices run, then reads the pod's allocation file (a pod
that joined later: the claim's shares file) and writes the container's ``ContainerConfig``,
and the card region files, as for a share of the extender path (docs/node.md). Every
container naming the same requests of the claim, of any pod, draws on one accounting folder
``claim-<uid>_<requests>``: one memory budget and one compute cap.

``init_only_folders(pod_uid)``: the claim folders of a pod that only its plain init containers
draw on (``init_only_folders`` of its prepared claims): the node agent's pod registry frees
their roster entries once those containers succeeded (``node_agent.pods.PodRegistry``).

``unprepare(uid)`` (after the claim's last pod) removes the claim's CDI spec, rewrites or
removes its pods' allocation files (with their hook folders), removes the claim's accounting
folders and their card roster entries, its shares file, then its state. An unknown claim is
fine.
Errors: ``ClaimError`` / ``ShareConfigError`` (what the kubelet shows), ``OSError``, and the
API client's exceptions from ``ApiReader``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from egpu.contract import CLAIM_SHARE_DIR_PREFIX, claim_request_device
from egpu.dra import allocation
from egpu.dra.allocation import ClaimError, PreparedClaim
from egpu.records import KIND_INIT, Card, ContainerAllocation, PodShares
from node_agent.cdi import CdiPublisher
from node_agent.draplugin.cdienv import request_envs
from node_agent.draplugin.state import ClaimStore
from node_agent.pods import remove_pod_files

log = logging.getLogger(__name__)


class ApiReader(Protocol):
    """Reads from the API server (Kubernetes JSON objects)."""

    def claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim; raises ClaimError when it does not exist."""
        ...

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod; None when it does not exist."""
        ...


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a NodePrepareResources answer."""

    request: str
    pool: str
    device: str
    share_id: str | None
    cdi_device_ids: tuple[str, ...]


def init_only_folders(claims: Iterable[PreparedClaim], pod_uid: str) -> dict[str, frozenset[str]]:
    """The accounting folders of pod ``pod_uid``'s prepared ``claims`` that only its plain init
    containers draw on -> their names: no app container or sidecar of the pod, no container
    of another pod the claim was prepared for, and no folder the claim's shares file offers a
    pod that joins it later (``egpu.dra.allocation.claim_shares``) names it. Such a folder is
    done with once those init containers succeeded (they never run again in the sandbox)."""
    out: dict[str, frozenset[str]] = {}
    for claim in claims:
        users: dict[str, list[tuple[str, ContainerAllocation]]] = {}
        for use in claim.pods:
            for entry in use.containers:
                if entry.share is not None:
                    users.setdefault(entry.share, []).append((use.uid, entry))
        joinable = {c.share for c in allocation.claim_shares(claim).allocation.containers}
        for folder, entries in users.items():
            if folder not in joinable and all(uid == pod_uid and entry.kind == KIND_INIT
                                              for uid, entry in entries):
                out[folder] = frozenset(entry.name for _, entry in entries)
    return out


class DraDriver:
    """The claims of this node (module docstring); thread-safe (one call at a time).
    ``cards()``: the node's cards with health; ``low_priority_floor``: % (node config);
    ``runtime_dir``: where the region folders of the pods' containers are."""

    def __init__(self, node: str, cards: Callable[[], tuple[Card, ...]], reader: ApiReader,
                 store: ClaimStore, cdi: CdiPublisher, runtime_dir: str,
                 low_priority_floor: int = 0) -> None:
        self.node = node
        self.cards = cards
        self.reader = reader
        self.store = store
        self.cdi = cdi
        self.runtime_dir = runtime_dir
        self.low_priority_floor = low_priority_floor
        self._lock = threading.Lock()
        self._pods = store.pod_uids()

    def owns_pod(self, pod_uid: str) -> bool:
        """Whether a prepared claim names the pod (its allocation file is this driver's)."""
        with self._lock:
            return pod_uid in self._pods

    def init_only_folders(self, pod_uid: str) -> dict[str, frozenset[str]]:
        """The folders of the pod's prepared claims that only its plain init containers draw
        on -> their names (module function ``init_only_folders``); {} for a pod of no
        prepared claim, without reading the state."""
        with self._lock:
            if pod_uid not in self._pods:
                return {}
            claims = [c for c in self.store.all() if any(p.uid == pod_uid for p in c.pods)]
        return init_only_folders(claims, pod_uid)

    def shares(self) -> dict[str, PodShares]:
        """pod uid -> PodShares of every pod of a prepared claim (metrics)."""
        with self._lock:
            prepared = self.store.all()
        out = {}
        for uid in {p.uid for c in prepared for p in c.pods}:
            try:
                shares = allocation.pod_shares(uid, prepared, self.low_priority_floor)
            except ClaimError:
                continue
            if shares is not None:
                out[uid] = shares
        return out

    def _read(self, namespace: str, uid: str, name: str) -> PreparedClaim:
        claim = self.reader.claim(namespace, name)
        found = str((claim.get("metadata") or {}).get("uid", ""))
        if found != uid:
            raise ClaimError(f"ResourceClaim {namespace}/{name} has UID {found}, not {uid} "
                             "(deleted and created again?)")
        pods = []
        for ref in (claim.get("status") or {}).get("reservedFor") or []:
            if ref.get("resource") != "pods" or ref.get("apiGroup"):
                continue
            pod = self.reader.pod(namespace, str(ref.get("name")))
            if pod is not None and (pod.get("metadata") or {}).get("uid") == ref.get("uid"):
                pods.append(pod)
        return allocation.prepare(claim, pods, self.node, self.cards())

    def prepare(self, namespace: str, uid: str, name: str) -> list[PreparedDevice]:
        """Prepare one claim (module docstring). Raises ClaimError, ShareConfigError,
        OSError or the API client's exceptions."""
        with self._lock:
            prepared = self.store.load(uid)
            fresh = prepared is None
            if prepared is None:
                prepared = self._read(namespace, uid, name)
            others = [c for c in self.store.all() if c.uid != uid]
            pod_files = []
            for use in prepared.pods:
                shares = allocation.pod_shares(use.uid, [*others, prepared],
                                               self.low_priority_floor)
                if shares is not None:
                    pod_files.append(shares)
            cards = self.cards()
            per_card = {d.uuid: self.cdi.names([d.uuid], cards) for d in prepared.devices}
            if not all(per_card.values()):
                raise ClaimError(f"ResourceClaim {namespace}/{name}: egpu's CDI spec is not in "
                                 f"place ({self.cdi.path}; see the node agent's log)")
            self.store.save(prepared)
            self._pods.update(p.uid for p in prepared.pods)
            for shares in pod_files:
                self.store.write_pod_file(shares)
            self.store.write_claim_shares(allocation.claim_shares(prepared,
                                                                  self.low_priority_floor))
            envs = request_envs(prepared)
            names = {r: claim_request_device(uid, r) for r in envs}
            ids = self.cdi.publish_claim(uid, {names[r]: env for r, env in envs.items()})
        if fresh:
            log.info("prepared ResourceClaim %s/%s (%s): cards %s, pods %s, %s", namespace,
                     name, uid, ", ".join(f"{d.uuid} {d.memory_mib} MiB {d.cores}%"
                                          for d in prepared.devices),
                     ", ".join(f"{p.namespace}/{p.name}" for p in prepared.pods) or "none",
                     prepared.config)
        return [PreparedDevice(d.request, d.pool, d.device, d.share_id,
                               (*per_card[d.uuid], ids[names[allocation.base_request(d.request)]]))
                for d in prepared.devices]

    def _remove_claim_files(self, uid: str) -> None:
        """The claim's own files: its accounting folders (shared by its containers; the
        kubelet unprepares a claim after its last pod) with their card roster entries and
        share files (``remove_pod_files`` on the folders' ``claim-<uid>`` prefix), its shares
        file, then its state. Raises OSError."""
        remove_pod_files(self.store.private_dir, self.runtime_dir,
                         f"{CLAIM_SHARE_DIR_PREFIX}{uid}")
        self.store.remove_claim_shares(uid)
        self.store.remove(uid)

    def unprepare(self, uid: str) -> None:
        """Unprepare one claim (module docstring). Raises OSError."""
        with self._lock:
            prepared = self.store.load(uid)
            self.cdi.remove_claim(uid)
            if prepared is None:
                self._remove_claim_files(uid)
                return
            others = [c for c in self.store.all() if c.uid != uid]
            for use in prepared.pods:
                try:
                    shares = allocation.pod_shares(use.uid, others, self.low_priority_floor)
                except ClaimError:
                    shares = None
                if shares is not None:
                    self.store.write_pod_file(shares)
                else:
                    remove_pod_files(self.store.private_dir, self.runtime_dir, use.uid)
            self._remove_claim_files(uid)
            self._pods = {p.uid for c in others for p in c.pods}
        log.info("unprepared ResourceClaim %s/%s (%s)", prepared.namespace, prepared.name, uid)
