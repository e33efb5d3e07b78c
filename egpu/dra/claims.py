"""Claims from pod specs: what ResourceClaimTemplate a pod's egpu requests become (DRA mode).

``plan_claims(request, card_sizes_mib)`` takes a valid pod's ``egpu.requests.PodRequest`` (the
same reading, and so the same denials, as the extender path) and returns a ``ClaimPlan``: one
ResourceClaimTemplate for the whole pod (resource.k8s.io/v1, driver ``gpu.egpu.io``) and, per
container with a share, the names of the requests of that claim the container uses. Pure: no
API call; the webhook (``webhook.review``) turns the plan into a pod patch and its I/O edge
creates the template.

The template (CONTRACT.md sections 1 and 5)::

    spec:
      devices:
        requests:                       # one per container with a share, named after it
        - name: server
          exactly:
            deviceClassName: share.gpu.egpu.io
            count: 1                    # egpu.io/gpu: the container's cards
            selectors: [{cel: ...}]     # the pod's type and UUID filters
            capacity: {requests: {memory: 24000Mi, cores: "50"}}
        constraints:                    # a container's cards are distinct cards
        - {requests: [trainer], distinctAttribute: gpu.egpu.io/uuid}
        config:
        - opaque: {driver: gpu.egpu.io, parameters: {kind: ShareConfig, ...}}

- Memory in MiB is ``capacity.requests.memory: <n>Mi`` (bytes); cores are ``cores: "<n>"`` (%),
  left out when the share books none (the device's default: 0). A share that names no memory
  books the card's whole memory: no memory request (the device's default is the whole card).
- ``egpu.io/gpu`` alone (whole memory, no cores): class ``whole.gpu.egpu.io``.
- A percentage of the card's memory cannot be a capacity (it depends on the card): the
  request becomes ``firstAvailable`` alternatives, one per card size the fleet publishes
  (``card_sizes_mib``, the devices' ``memoryMiB``), each selecting cards of that size and
  asking that percentage of it in MiB (rounded down, at least 1 MiB, as ``Share.memory_on``).
- App containers and sidecars run together: each has its own request, so their bookings add
  up on a card (FC-11). A plain init container runs before them, alone: where it and an app or
  sidecar container each use one card with memory in MiB, the init container shares that
  container's request and a *headroom* request on the same card (``matchAttribute`` on the
  uuid) of what it needs beyond it, so the card books max(init, app) as on the extender path
  (FC-07); the init container then may use both (its request's owner only its own). Other
  init containers (several cards, a percentage, no partner) get their own request: booked
  beside the app containers for the pod's life (DRA frees nothing between an init container
  and the app containers), never less than the scheduler's rule.
- Type filters become CEL on the ``model`` attribute with the annotations' token rule (a name
  equals the lower-case model or one of its parts split on space, ``-``, ``_``; ASCII case);
  UUID filters compare the ``uuid`` attribute exactly.
- The opaque ``ShareConfig`` (``egpu.dra.shareconfig``, its one encoder) carries the pod's
  priority, compute policy and memory oversubscription, for every request.

The template's name is ``egpu-<10 hex digits of the SHA-256 of its spec>``: pods of one shape
(a Deployment's replicas) share one template, and a template of that name always says the
same. Errors (``ClaimPlanError``) say what cannot be expressed: a percentage with no card
size published, more card sizes or requests than resource.k8s.io/v1 allows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from egpu.contract import (
    DEVICE_CLASS_SHARE,
    DEVICE_CLASS_WHOLE,
    DRA_ATTR_MEMORY_MIB,
    DRA_ATTR_MODEL,
    DRA_ATTR_UUID,
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_CLAIM_FINALIZER,
    DRA_DRIVER,
    DRA_TEMPLATE_MANAGER,
    DRA_TEMPLATE_PREFIX,
    LABEL_CLAIM_SHAPE,
    LABEL_MANAGED_BY,
)
from egpu.dra.shareconfig import ShareConfig
from egpu.dra.slices import (
    MIB,
    bytes_quantity,
    count_quantity,
    normal_quantities,
    project_onto,
)
from egpu.requests import ContainerKind, ContainerRequest, PodRequest, Share

API_VERSION: Final = "resource.k8s.io/v1"
TEMPLATE_KIND: Final = "ResourceClaimTemplate"
CLAIM_KIND: Final = "ResourceClaim"
CLAIM_NAME_BASE_CHARS: Final = 200  # of the pod's name in its claim's (253 at most in all)
CLAIM_KEY_DIGITS: Final = 16  # hex digits of the SHA-256 of the admission request's uid
MAX_REQUESTS: Final = 32  # resource.k8s.io/v1: requests (and constraints) per claim
MAX_SUBREQUESTS: Final = 8  # resource.k8s.io/v1: firstAvailable alternatives per request
HASH_DIGITS: Final = 10
UUID_ATTRIBUTE: Final = f"{DRA_DRIVER}/{DRA_ATTR_UUID}"  # qualified, for constraints
TEMPLATE_LABELS: Final = {LABEL_MANAGED_BY: DRA_TEMPLATE_MANAGER,
                          "app.kubernetes.io/part-of": "egpu"}


class ClaimPlanError(ValueError):
    """The pod's shares cannot be written as a claim; the message says why and what to do."""


@dataclass(frozen=True)
class ContainerClaims:
    """The requests of the pod's claim that one container uses (``resources.claims``)."""

    name: str
    kind: ContainerKind
    requests: tuple[str, ...]


@dataclass(frozen=True)
class ClaimPlan:
    """A pod's claim: its template (no namespace) and each share container's requests."""

    template: dict[str, Any]
    containers: tuple[ContainerClaims, ...]

    @property
    def template_name(self) -> str:
        """``egpu-<hash>``: the name every pod of this shape refers to."""
        return str(self.template["metadata"]["name"])

    def template_in(self, namespace: str) -> dict[str, Any]:
        """The template as created in ``namespace`` (a copy of the metadata)."""
        metadata = {**self.template["metadata"], "namespace": namespace}
        return {**self.template, "metadata": metadata}

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod's own ResourceClaim ``namespace/name`` (the webhook creates it): the
        template's spec and labels, and the allocation finalizer already set, so that the
        kube-scheduler need not write it (``DRA_CLAIM_FINALIZER``)."""
        labels = {**self.template["metadata"]["labels"], LABEL_CLAIM_SHAPE: self.template_name}
        return {"apiVersion": API_VERSION, "kind": CLAIM_KIND,
                "metadata": {"name": name, "namespace": namespace, "labels": labels,
                             "finalizers": [DRA_CLAIM_FINALIZER]},
                "spec": self.template["spec"]["spec"]}

    def requests_of(self, name: str) -> tuple[str, ...]:
        """The request names container ``name`` uses; () when it has no share (a pod's init
        and app containers have distinct names)."""
        return next((c.requests for c in self.containers if c.name == name), ())


def cel_string(text: str) -> str:
    """``text`` as a CEL string literal (double quotes; backslash, quote and control
    characters escaped, the rest as is)."""
    return json.dumps(text, ensure_ascii=False)


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(cel_string(i) for i in items) + "]"


def _attribute(name: str) -> str:
    return f"device.attributes[{cel_string(DRA_DRIVER)}].{name}"


def model_expression(names: Sequence[str]) -> str:
    """CEL that is true when the device's ``model`` matches any of ``names`` by the token rule
    of ``egpu.requests.model_matches`` (whole name or a part split on space, ``-``, ``_``;
    ASCII case-insensitive)."""
    wanted = _cel_list([n.lower() for n in names])
    model = f"{_attribute(DRA_ATTR_MODEL)}.lowerAscii()"
    tokens = f'{model}.replace("-", " ").replace("_", " ").split(" ")'
    return f"({model} in {wanted} || {tokens}.exists(t, t in {wanted}))"


def filter_selectors(request: PodRequest) -> list[dict[str, Any]]:
    """The pod's ``egpu.io/(no)use-gpu-type`` and ``-uuid`` filters as CEL device selectors
    (one per filter given; all must hold)."""
    expressions: list[str] = []
    if request.use_gpu_types:
        expressions.append(model_expression(request.use_gpu_types))
    if request.nouse_gpu_types:
        expressions.append(f"!{model_expression(request.nouse_gpu_types)}")
    if request.use_gpu_uuids:
        expressions.append(f"{_attribute(DRA_ATTR_UUID)} in {_cel_list(request.use_gpu_uuids)}")
    if request.nouse_gpu_uuids:
        expressions.append(
            f"!({_attribute(DRA_ATTR_UUID)} in {_cel_list(request.nouse_gpu_uuids)})")
    return [{"cel": {"expression": e}} for e in expressions]


def _capacity(memory_mib: int | None, cores: int) -> dict[str, Any]:
    """``capacity`` of a request: memory in MiB as bytes, cores in %, each as the API server
    writes it back (``24000Mi``, ``8Gi`` for 8192 MiB; ``"50"``); the ones left out take the
    device's default (whole memory, 0 cores)."""
    requests: dict[str, str] = {}
    if memory_mib is not None:
        requests[DRA_CAPACITY_MEMORY] = bytes_quantity(memory_mib * MIB)
    if cores:
        requests[DRA_CAPACITY_CORES] = count_quantity(cores)
    return {"capacity": {"requests": requests}} if requests else {}


def _is_whole(share: Share) -> bool:
    return share.memory_mib is None and share.memory_percentage == 100 and not share.cores


def _device_request(name: str, share: Share, selectors: list[dict[str, Any]],
                    card_sizes_mib: Sequence[int], container: str) -> dict[str, Any]:
    """The claim request of one container's share (``exactly`` or ``firstAvailable``)."""
    if _is_whole(share):
        exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_WHOLE, "count": share.gpus}
        if selectors:
            exactly["selectors"] = selectors
        return {"name": name, "exactly": exactly}
    if share.memory_mib is not None or share.memory_percentage == 100:
        exactly = {"deviceClassName": DEVICE_CLASS_SHARE, "count": share.gpus}
        if selectors:
            exactly["selectors"] = selectors
        exactly.update(_capacity(share.memory_mib, share.cores))
        return {"name": name, "exactly": exactly}
    sizes = sorted(set(card_sizes_mib), reverse=True)
    if not sizes:
        raise ClaimPlanError(
            f"container {container!r}: a memory percentage "
            f"({share.memory_percentage}%) needs the card sizes of the fleet, and no "
            f"{DRA_DRIVER} device publishes its {DRA_ATTR_MEMORY_MIB} yet; allowed: "
            "egpu.io/gpu-memory in MiB, or retry once the DRA nodes publish their cards")
    if len(sizes) > MAX_SUBREQUESTS:
        raise ClaimPlanError(
            f"container {container!r}: a memory percentage "
            f"({share.memory_percentage}%) becomes one alternative per card size, and the "
            f"fleet has {len(sizes)} sizes ({', '.join(f'{s} MiB' for s in sizes)}), more "
            f"than the {MAX_SUBREQUESTS} a claim request allows; allowed: egpu.io/gpu-memory "
            "in MiB, or egpu.io/use-gpu-type to narrow the cards")
    alternatives = []
    for size in sizes:
        by_size = {"cel": {"expression": f"{_attribute(DRA_ATTR_MEMORY_MIB)} == {size}"}}
        alternatives.append({
            "name": f"mib-{size}", "deviceClassName": DEVICE_CLASS_SHARE, "count": share.gpus,
            "selectors": [by_size, *selectors],
            **_capacity(share.memory_on(size), share.cores)})
    return {"name": name, "firstAvailable": alternatives}


def _pairs_with(container: ContainerRequest) -> bool:
    """Whether a single-card share in MiB (the kind an init container can share a card with)."""
    share = container.share
    return share.gpus == 1 and share.memory_mib is not None


def _partner(request: PodRequest) -> ContainerRequest | None:
    """The app container whose card the paired init containers use: the biggest single-card
    share in MiB (memory, then cores), the first of equals. Never a sidecar: one declared
    before an init container runs beside it, so the init container cannot reuse its booking
    (the claim booked the sidecar's memory once for both, short of what ran)."""
    steady = [c for c in request.containers
              if c.kind is ContainerKind.APP and _pairs_with(c)]
    if not steady:
        return None
    return max(steady, key=lambda c: (c.share.memory_mib or 0, c.share.cores))


def needs_card_sizes(request: PodRequest) -> bool:
    """Whether ``plan_claims`` reads the fleet's card sizes for this pod (a memory percentage
    below 100 in some container)."""
    return any(c.share.memory_mib is None and c.share.memory_percentage != 100
               for c in request.containers)


def plan_claims(request: PodRequest, card_sizes_mib: Sequence[int] = ()) -> ClaimPlan:
    """The claim of a valid egpu pod (see the module docstring).

    ``card_sizes_mib``: the physical memory (MiB) of the fleet's cards (the devices'
    ``memoryMiB``); read only for a memory percentage below 100. Raises ClaimPlanError.
    """
    selectors = filter_selectors(request)
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    uses: list[ContainerClaims] = []
    partner = _partner(request)
    paired = [c for c in request.containers
              if c.kind is ContainerKind.INIT and partner is not None and _pairs_with(c)]
    for container in request.containers:
        if container in paired:
            continue
        requests.append(_device_request(container.name, container.share, selectors,
                                        card_sizes_mib, container.name))
        if container.share.gpus > 1:
            constraints.append({"requests": [container.name], "distinctAttribute": UUID_ATTRIBUTE})
        uses.append(ContainerClaims(container.name, container.kind, (container.name,)))
    if paired:
        assert partner is not None and partner.share.memory_mib is not None
        memory = max(c.share.memory_mib or 0 for c in paired) - partner.share.memory_mib
        cores = max(c.share.cores for c in paired) - partner.share.cores
        names: tuple[str, ...] = (partner.name,)
        if memory > 0 or cores > 0:
            headroom = paired[0].name
            # memory 0 would take the device's default (the whole card): 1 MiB, its minimum
            requests.append({"name": headroom, "exactly": {
                "deviceClassName": DEVICE_CLASS_SHARE, "count": 1,
                **({"selectors": selectors} if selectors else {}),
                **_capacity(max(memory, 1), max(cores, 0))}})
            constraints.append({"requests": [partner.name, headroom],
                                "matchAttribute": UUID_ATTRIBUTE})
            names = (partner.name, headroom)
        uses += [ContainerClaims(c.name, c.kind, names) for c in paired]
    if len(requests) > MAX_REQUESTS or len(constraints) > MAX_REQUESTS:
        raise ClaimPlanError(
            f"the pod has {len(requests)} containers with a share; allowed: at most "
            f"{MAX_REQUESTS} (the requests of one resource.k8s.io/v1 claim)")
    config = ShareConfig(priority=request.priority, compute_policy=request.compute_policy,
                         memory_oversubscription=request.memory_oversubscription)
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    devices["config"] = [{"opaque": config.opaque()}]
    spec = {"metadata": {"labels": dict(TEMPLATE_LABELS)}, "spec": {"devices": devices}}
    order = {c.name: i for i, c in enumerate(request.containers)}
    return ClaimPlan(
        template={"apiVersion": API_VERSION, "kind": TEMPLATE_KIND,
                  "metadata": {"name": template_name(spec), "labels": dict(TEMPLATE_LABELS)},
                  "spec": spec},
        containers=tuple(sorted(uses, key=lambda c: order[c.name])),
    )


def claim_name(pod_name: str, generate_name: str, request_uid: str) -> str:
    """The name of the claim the webhook makes for one pod: ``<pod name>-egpu-<key>``, the key
    the first CLAIM_KEY_DIGITS hex digits of the SHA-256 of the admission request's uid (the
    API server's unique id of that request: a retried review names the same claim). The
    pod's ``name`` (else its ``generateName``, else ``pod``) is cut to CLAIM_NAME_BASE_CHARS,
    lower-case letters, digits and ``-`` (any other character becomes ``-``), so the result
    is always a DNS subdomain (RFC 1123)."""
    base = (pod_name or generate_name or "").lower()[:CLAIM_NAME_BASE_CHARS]
    base = "".join(ch if ch.isascii() and ch.isalnum() else "-" for ch in base)
    base = base.strip("-") or "pod"
    key = hashlib.sha256(request_uid.encode()).hexdigest()[:CLAIM_KEY_DIGITS]
    return f"{base}-egpu-{key}"


def template_name(spec: dict[str, Any]) -> str:
    """``egpu-<hash>``: the first HASH_DIGITS hex digits of the SHA-256 of ``spec`` as
    canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return DRA_TEMPLATE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:HASH_DIGITS]


def same_template_spec(read: Any, written: dict[str, Any]) -> bool:
    """Whether a template's or claim's ``spec`` read from the API server says what ``written`` says
    (fields the server added ignored, Quantities compared by value)."""
    return bool(normal_quantities(project_onto(read, written)) == normal_quantities(written))
