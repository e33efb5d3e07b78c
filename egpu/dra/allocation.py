"""What an allocated ResourceClaim of the DRA driver ``gpu.egpu.io`` books, and for whom (pure).

The one decoder of a claim's allocation into egpu's share records, used by the node agent's
kubelet plugin (``node_agent.draplugin``: it prepares the claim) and by the cluster-wide view
(``egpu.cluster_view``: ``kubectl egpu`` / ``egpu top``). Inputs are Kubernetes JSON objects
(dicts as the API server writes them; the kubernetes client's models would drop
``consumedCapacity`` and ``shareID``):

- ``claim_devices(claim, node, cards)``: the allocation results of driver ``gpu.egpu.io``
  (``status.allocation.devices.results``): the device name is the card's
  (``egpu.dra.slices.device_name``), the pool the node's; ``consumedCapacity`` ``memory``
  (bytes, a Quantity, a whole number of MiB) and ``cores`` (% of the card, 0..100) are the
  share of that card (none recorded: the whole card's memory, no cores); ``shareID`` is
  passed back to the kubelet. ``claim_pool(claim)`` names the node whose pool holds them.
  A result with ``adminAccess`` is refused (kube-scheduler books nothing for it).
- ``share_config(claim, devices)``: the opaque config of the driver
  (``status.allocation.devices.config``, the class's and the claim's as the scheduler copied
  them; the last that applies wins), each decoded by
  ``egpu.dra.shareconfig.ShareConfig.decode``: a bad one raises ``ShareConfigError`` with its
  message (the claim is never prepared without its limits).
- ``pod_use(pod, claim_name, devices)``: the containers of a pod that name the claim
  (``spec.resourceClaims`` + ``status.resourceClaimStatuses``, or the scheduler's
  ``status.extendedResourceClaimStatus`` for ``egpu.io/gpu`` through the DeviceClass
  ``whole.gpu.egpu.io``), each given the cards of the requests it names, summed per card
  (``container_cards``; all of the claim's when it names none). ``pod_claim_names(pod)``: the
  ResourceClaims a pod uses.
- ``prepare(claim, pods, node, cards)``: all of the above for one node (``PreparedClaim``,
  also the kubelet plugin's state file: ``encode`` / ``decode``).
- ``claim_shares(claim, floor)``: the claim's shares file, for the containers of pods that
  join the claim after it was prepared (the runtime hook reads it).
- ``pod_shares(pod_uid, claims, floor)``: a pod's allocation file (``egpu.records.PodShares``,
  what the runtime hook reads to write each container's ``ContainerConfig``), composed from
  every prepared claim of the pod.

Errors: ``ClaimError`` (and ``ShareConfigError``), with a message naming the claim, the pod or
container and what is wrong; the kubelet shows it in the pod's events, ``kubectl egpu`` among
a node's problems.
Units: memory in MiB (bytes in the API), cores in % of one card.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from egpu.contract import (
    ANN_ALLOCATION,
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DRIVER,
    claim_share_dir_name,
    claim_share_dir_requests,
)
from egpu.dra.shareconfig import ShareConfig
from egpu.dra.slices import SliceError, device_name, parse_quantity
from egpu.records import (
    KIND_APP,
    KIND_INIT,
    KIND_SIDECAR,
    Allocation,
    Card,
    CardShare,
    ContainerAllocation,
    PodShares,
    sum_card_shares,
)

MIB = 1 << 20
STATE_VERSION = 1


class ClaimError(ValueError):
    """A claim's allocation cannot be read as egpu shares (nor prepared on a node); the
    message names the claim (pod, container) and says why."""


@dataclass(frozen=True)
class ClaimDevice:
    """One allocation result: ``request`` (the claim's request name), ``pool`` and ``device``
    (the DRA names), the card (``uuid``, ``index``), its share (``memory_mib``, MiB;
    ``cores``, %) and the scheduler's ``share_id`` (None when it recorded none)."""

    request: str
    pool: str
    device: str
    uuid: str
    index: int
    memory_mib: int
    cores: int
    share_id: str | None = None


@dataclass(frozen=True)
class PodUse:
    """A pod the claim is reserved for, with its containers that name the claim."""

    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerAllocation, ...]


@dataclass(frozen=True)
class PreparedClaim:
    """A claim as prepared on this node (the plugin's state file, keyed by ``uid``)."""

    uid: str
    namespace: str
    name: str
    config: ShareConfig
    devices: tuple[ClaimDevice, ...]
    pods: tuple[PodUse, ...]

    @property
    def uuids(self) -> tuple[str, ...]:
        """The claim's cards in allocation order."""
        return tuple(d.uuid for d in self.devices)

    def encode(self) -> str:
        """JSON text of the state file."""
        return json.dumps({
            "version": STATE_VERSION, "uid": self.uid, "namespace": self.namespace,
            "name": self.name, "config": self.config.parameters(),
            "devices": [asdict(d) for d in self.devices],
            "pods": [{"uid": p.uid, "namespace": p.namespace, "name": p.name,
                      "allocation": json.loads(Allocation(p.containers).encode())}
                     for p in self.pods]}, indent=1)

    @classmethod
    def decode(cls, text: str | bytes) -> PreparedClaim:
        """Parse a state file. Raises ClaimError (or ShareConfigError) when malformed."""
        try:
            data = json.loads(text)
            if data.get("version") != STATE_VERSION:
                raise ClaimError(f"claim state: version {data.get('version')!r} unsupported")
            return cls(
                uid=str(data["uid"]), namespace=str(data["namespace"]), name=str(data["name"]),
                config=ShareConfig.decode(data["config"]),
                devices=tuple(ClaimDevice(**d) for d in data["devices"]),
                pods=tuple(PodUse(str(p["uid"]), str(p["namespace"]), str(p["name"]),
                                  Allocation.decode(json.dumps(p["allocation"])).containers)
                           for p in data["pods"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, ClaimError):
                raise
            raise ClaimError(f"claim state unreadable: {exc}") from None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def claim_ref(claim: Mapping[str, Any]) -> str:
    """``namespace/name`` of a claim (messages)."""
    return f"{_meta(claim).get('namespace', '')}/{_meta(claim).get('name', '')}"


def _quantity(value: Any, what: str) -> Decimal:
    parsed = parse_quantity(value) if isinstance(value, str) else (
        Decimal(value) if isinstance(value, int) and not isinstance(value, bool) else None)
    if parsed is None:
        raise ClaimError(f"{what}: {value!r} is not a quantity")
    return parsed


def allocation_results(claim: Mapping[str, Any]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(index in ``status.allocation.devices.results``, result) of each result of driver
    ``gpu.egpu.io``; none when the claim is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for i, result in enumerate((allocation.get("devices") or {}).get("results") or []):
        if result.get("driver") == DRA_DRIVER:
            yield i, result


def claim_pool(claim: Mapping[str, Any]) -> str | None:
    """The pool (the node's name, ``egpu.dra.slices``) of the claim's first result of driver
    ``gpu.egpu.io``; None when it is not allocated or has none."""
    for _, result in allocation_results(claim):
        return str(result.get("pool", ""))
    return None


# A result with adminAccess is not counted as allocated by kube-scheduler (its
# GatherAllocatedState / foreachAllocatedDevice skip such results): its memory and cores would
# stay free for every later claim, so a share prepared from it would overbook the card.
ADMIN_ACCESS_REFUSED = (
    "{where}: adminAccess: {value!r}: admin access is not supported by the " + DRA_DRIVER
    + " driver (kube-scheduler books no memory or cores for an admin-access result, so the "
    "card would be overbooked); to watch a card's use, read the node agent's exporter "
    "metrics or run kubectl egpu; to use the card, request a share without adminAccess")


def claim_devices(claim: Mapping[str, Any], node: str, cards: Sequence[Card],
                  healthy_only: bool = True) -> tuple[ClaimDevice, ...]:
    """The claim's devices of driver gpu.egpu.io on ``node`` (module docstring), in
    allocation order; ``cards``: the node's inventory. Raises ClaimError: not allocated, a
    result with ``adminAccess`` (``ADMIN_ACCESS_REFUSED``), a result on another node's pool,
    an unknown card (or, with ``healthy_only``, an unhealthy one: the kubelet plugin prepares
    none; the cluster view shows what it books), a capacity that is no whole MiB count >= 1
    or outside 0..100 cores, no device of the driver."""
    ref = claim_ref(claim)
    if not (claim.get("status") or {}).get("allocation"):
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    by_name: dict[str, Card] = {}
    for card in cards:
        try:
            by_name[device_name(card)] = card
        except SliceError:
            continue  # never published, so never allocated
    out = []
    for i, result in allocation_results(claim):
        where = f"ResourceClaim {ref} result {i} (device {result.get('device')!r})"
        admin = result.get("adminAccess")
        if admin is not None and admin is not False:
            raise ClaimError(ADMIN_ACCESS_REFUSED.format(where=where, value=admin))
        if result.get("pool") != node:
            raise ClaimError(f"{where}: pool {result.get('pool')!r} is not this node's ({node})")
        found = by_name.get(str(result.get("device")))
        if found is None:
            raise ClaimError(f"{where}: no such card on node {node}")
        card = found
        if healthy_only and not card.healthy:
            raise ClaimError(f"{where}: card {card.uuid} is unhealthy")
        consumed = result.get("consumedCapacity") or {}
        memory_mib = card.memory_mib
        if DRA_CAPACITY_MEMORY in consumed:
            memory = _quantity(consumed[DRA_CAPACITY_MEMORY], f"{where}: consumed memory")
            if memory % MIB or memory < MIB:
                raise ClaimError(f"{where}: consumed memory {consumed[DRA_CAPACITY_MEMORY]} is "
                                 "not a whole number of MiB >= 1Mi")
            memory_mib = int(memory // MIB)
        cores = 0
        if DRA_CAPACITY_CORES in consumed:
            value = _quantity(consumed[DRA_CAPACITY_CORES], f"{where}: consumed cores")
            if value != value.to_integral_value() or not 0 <= value <= 100:
                raise ClaimError(f"{where}: consumed cores {consumed[DRA_CAPACITY_CORES]}; "
                                 "allowed: a whole number 0..100")
            cores = int(value)
        share_id = result.get("shareID")
        out.append(ClaimDevice(str(result.get("request", "")), node, str(result["device"]),
                               card.uuid, card.index, memory_mib, cores,
                               str(share_id) if share_id else None))
    if not out:
        raise ClaimError(f"ResourceClaim {ref} has no device of driver {DRA_DRIVER}")
    # one card may hold several results (a request each: the webhook's containers of one pod,
    # an init container's headroom): container_cards sums what each container names
    return tuple(out)


def _applies(entry: Mapping[str, Any], requests: Iterable[str]) -> bool:
    """Whether a config entry (``requests``: empty = every request) applies to any of
    ``requests`` (a subrequest ``r/s`` counts as ``r``)."""
    named = entry.get("requests") or []
    return not named or any(r in named or r.split("/", 1)[0] in named for r in requests)


def share_config(claim: Mapping[str, Any], devices: Sequence[ClaimDevice]) -> ShareConfig:
    """The claim's ShareConfig (module docstring); the defaults when it has none. Raises
    ShareConfigError (a bad config, whether or not it applies: never run without it)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    entries = (allocation.get("devices") or {}).get("config")
    if entries is None:  # not copied by the scheduler: the claim's own
        entries = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
    chosen = ShareConfig()
    requests = {d.request for d in devices}
    for entry in entries:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != DRA_DRIVER:
            continue
        config = ShareConfig.decode(opaque.get("parameters"))
        if _applies(entry, requests):
            chosen = config
    return chosen


def _claim_name_in_pod(pod: Mapping[str, Any], pod_claim: Mapping[str, Any]) -> str | None:
    """The ResourceClaim name behind one ``spec.resourceClaims`` entry of the pod."""
    if pod_claim.get("resourceClaimName"):
        return str(pod_claim["resourceClaimName"])
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == pod_claim.get("name"):
            name = status.get("resourceClaimName")
            return str(name) if name else None
    return None


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the ResourceClaims (in the pod's namespace) the pod uses: its
    ``spec.resourceClaims`` (a claim's own name, or the one ``status.resourceClaimStatuses``
    gives a template's), then the scheduler's ``status.extendedResourceClaimStatus``; a
    template's claim not yet created is left out."""
    names = [_claim_name_in_pod(pod, c) for c in (pod.get("spec") or {}).get("resourceClaims")
             or []]
    extended = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
        "resourceClaimName")
    return tuple(dict.fromkeys(str(n) for n in (*names, extended) if n))


def _runs_beside_others(container: Mapping[str, Any], init: bool) -> bool:
    """Whether the container runs at the same time as the app containers (an app container
    or a sidecar, i.e. an init container with restartPolicy Always)."""
    return not init or container.get("restartPolicy") == "Always"


def base_request(request: str) -> str:
    """A result's request without its subrequest (``firstAvailable``: ``share/mib-24576``)."""
    return request.split("/", 1)[0]


def container_cards(devices: Sequence[ClaimDevice], requests: set[str] | None
                    ) -> tuple[CardShare, ...]:
    """A container's share of each card: the results of the requests it names (all of them
    when ``requests`` is None: it named the claim without a request), summed per card (an
    init container may name its app container's request and a headroom request pinned to the
    same card: the webhook's FC-07 plan, egpu.dra.claims), in allocation order."""
    return sum_card_shares(
        [CardShare(d.uuid, d.index, d.memory_mib, d.cores)] for d in devices
        if requests is None or base_request(d.request) in requests)


def _kind(container: Mapping[str, Any], init: bool) -> str:
    if not init:
        return KIND_APP
    return KIND_SIDECAR if container.get("restartPolicy") == "Always" else KIND_INIT


def check_running_sets(claim: str, users: Iterable[tuple[str, frozenset[str]]]) -> None:
    """Refuse request sets of one claim that overlap without being equal among containers
    that run at the same time (``users``: (who, the base requests it names)): every container
    naming the same requests draws on one budget, and one naming part of another's would
    hold that part twice. Raises ClaimError naming both containers and the claim."""
    seen: list[tuple[str, frozenset[str]]] = []
    for who, requests in users:
        for other, held in seen:
            if held != requests and held & requests:
                raise ClaimError(
                    f"{other} and {who} run at the same time and name overlapping but "
                    f"different requests of ResourceClaim {claim} ({', '.join(sorted(held))} "
                    f"and {', '.join(sorted(requests))}); containers that share a claim name "
                    "the same requests (one budget for them all) or requests of their own")
        seen.append((who, requests))


def pod_use(pod: Mapping[str, Any], claim_name: str, devices: Sequence[ClaimDevice],
            claim_uid: str = "") -> PodUse | None:
    """The pod's containers that name ``claim_name``, each with the cards of the requests it
    names (all of the claim's when it names no request; ``container_cards``), its kind and,
    given ``claim_uid``, its ``share``: the accounting folder of the claim's requests it names
    (``egpu.contract.claim_share_dir_name``), one budget for every container naming them; None
    when no container names the claim. Raises ClaimError: the pod also has an
    ``egpu.io/allocation`` (the extender path), a container names a request the claim's
    allocation does not hold, or two containers that run at the same time name overlapping
    but different requests (``check_running_sets``)."""
    meta, spec = _meta(pod), pod.get("spec") or {}
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    if (meta.get("annotations") or {}).get(ANN_ALLOCATION):
        raise ClaimError(f"{where} has both an {ANN_ALLOCATION} (the egpu scheduler's "
                         "share) and an egpu ResourceClaim; use one or the other")
    pod_claims = {c.get("name"): c for c in spec.get("resourceClaims") or []
                  if _claim_name_in_pod(pod, c) == claim_name}
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    extended_containers = ({m.get("containerName") for m in extended.get("requestMappings") or []}
                           if extended.get("resourceClaimName") == claim_name else set())
    allocated = {base_request(d.request) for d in devices}
    containers: list[ContainerAllocation] = []
    running: list[tuple[str, frozenset[str]]] = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for container in spec.get(key) or []:
            name = str(container.get("name"))
            named = [c for c in (container.get("resources") or {}).get("claims") or []
                     if c.get("name") in pod_claims]
            if not named and name not in extended_containers:
                continue
            wanted = {str(c.get("request")) for c in named if c.get("request")}
            whole = not named or any(not c.get("request") for c in named)
            missing = sorted(wanted - allocated)
            if missing:
                raise ClaimError(
                    f"{where} container {name!r} names request {missing[0]!r} of "
                    f"ResourceClaim {meta.get('namespace')}/{claim_name}, which holds no "
                    f"egpu device of it (allocated: {', '.join(sorted(allocated)) or 'none'})")
            uses = frozenset(allocated if whole else wanted)
            if _runs_beside_others(container, init):
                running.append((f"{where} container {name!r}", uses))
            containers.append(ContainerAllocation(
                name, init, container_cards(devices, None if whole else wanted),
                kind=_kind(container, init),
                share=claim_share_dir_name(claim_uid, uses) if claim_uid else None))
    check_running_sets(f"{meta.get('namespace')}/{claim_name}", running)
    if not containers:
        return None
    return PodUse(str(meta.get("uid", "")), str(meta.get("namespace", "")),
                  str(meta.get("name", "")), tuple(containers))


def prepare(claim: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], node: str,
            cards: Sequence[Card]) -> PreparedClaim:
    """The PreparedClaim of ``claim`` on ``node`` for ``pods`` (those it is reserved for;
    pods bound to another node are left out). Raises ClaimError (also for containers of
    different pods that overlap: ``check_running_sets``) or ShareConfigError."""
    devices = claim_devices(claim, node, cards)
    config = share_config(claim, devices)
    meta = _meta(claim)
    uid = str(meta.get("uid", ""))
    uses = []
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") != node:
            continue
        use = pod_use(pod, str(meta.get("name", "")), devices, uid)
        if use is not None:
            uses.append(use)
    check_running_sets(claim_ref(claim), _running(uses, uid))
    return PreparedClaim(uid, str(meta.get("namespace", "")), str(meta.get("name", "")),
                         config, devices, tuple(uses))


def _requests_of(entry: ContainerAllocation, claim_uid: str) -> frozenset[str]:
    return (claim_share_dir_requests(entry.share, claim_uid) if entry.share else None
            ) or frozenset()


def _running(uses: Iterable[PodUse], claim_uid: str) -> list[tuple[str, frozenset[str]]]:
    """(who, requests) of the containers of ``uses`` that run beside others."""
    return [(f"pod {u.namespace}/{u.name} container {c.name!r}", _requests_of(c, claim_uid))
            for u in uses for c in u.containers if c.kind != KIND_INIT]


def claim_shares(claim: PreparedClaim, low_priority_floor: int = 0) -> PodShares:
    """The claim's shares file (``<NODE_PRIVATE_DIR>/claim-shares/<claim-uid>.json``): what a
    container of a pod that joins the claim after it was prepared may draw on (the kubelet
    prepares a claim once, for its first pods; the runtime hook reads this file for a later
    pod's containers). A ``PodShares`` with the claim's namespace, name (``pod``) and UID
    (``pod_uid``), its ShareConfig and the node's floor, and one entry per request set a
    container may name: each set named by a running container of the prepared pods (they are
    equal or disjoint: ``check_running_sets``), and each request no prepared container names,
    alone. An entry's name is its requests joined by '.', its ``share`` the set's folder."""
    sets = list(dict.fromkeys(r for _, r in _running(claim.pods, claim.uid)))
    named = {r for use in claim.pods for c in use.containers
             for r in _requests_of(c, claim.uid)}
    for request in dict.fromkeys(base_request(d.request) for d in claim.devices):
        if request not in named:
            sets.append(frozenset([request]))
    entries = tuple(ContainerAllocation(".".join(sorted(s)), False,
                                        container_cards(claim.devices, set(s)), kind=KIND_APP,
                                        share=claim_share_dir_name(claim.uid, s))
                    for s in sets)
    config = claim.config
    return PodShares(namespace=claim.namespace, pod=claim.name, pod_uid=claim.uid,
                     priority=config.priority, compute_policy=config.compute_policy,
                     memory_oversubscription=config.memory_oversubscription,
                     allocation=Allocation(entries), low_priority_floor=low_priority_floor)


def pod_shares(pod_uid: str, claims: Iterable[PreparedClaim],
               low_priority_floor: int = 0) -> PodShares | None:
    """The allocation file of pod ``pod_uid`` from every prepared claim that names it (None
    when none does). Raises ClaimError: the claims' ShareConfigs differ (one priority and
    policy per pod), or a container names two egpu claims (its CDI devices would show only
    one claim's cards)."""
    uses = [(c, p) for c in claims for p in c.pods if p.uid == pod_uid]
    if not uses:
        return None
    first_claim, first_use = uses[0]
    configs = {c.config for c, _ in uses}
    if len(configs) > 1:
        raise ClaimError(f"pod {first_use.namespace}/{first_use.name}: its egpu ResourceClaims "
                         f"({', '.join(sorted(c.name for c, _ in uses))}) have different "
                         "ShareConfigs; a pod has one priority and compute policy")
    containers: dict[str, ContainerAllocation] = {}
    for claim, use in uses:
        for entry in use.containers:
            if entry.name in containers:
                raise ClaimError(f"pod {use.namespace}/{use.name} container {entry.name!r} "
                                 f"names two egpu ResourceClaims (one is {claim.name}); "
                                 "a container takes one egpu claim")
            containers[entry.name] = entry
    config = first_claim.config
    return PodShares(namespace=first_use.namespace, pod=first_use.name, pod_uid=pod_uid,
                     priority=config.priority, compute_policy=config.compute_policy,
                     memory_oversubscription=config.memory_oversubscription,
                     allocation=Allocation(tuple(containers.values())),
                     low_priority_floor=low_priority_floor)
