"""What the hook does to one container: a pure decision over the spec and the pod's shares.

``decide(inputs) -> Skip | Refuse | Apply``. The rules (docs/node.md, "Runtime hook"):

1. A sandbox (pause) container is skipped.
2. ``EGPU_ALLOCATION_ERROR`` in the container's env (set by the device plugin when it could
   not match the kubelet's devices to a share) -> Refuse with that message.
3. The container is named by the OCI annotations (containerd CRI, then CRI-O), else by the
   device plugin's ``EGPU_POD_UID`` / ``EGPU_CONTAINER`` env.
4. Named and the pod's allocation file lists it -> its share; ``NVIDIA_VISIBLE_DEVICES`` must
   name exactly its cards (as a set), else Refuse. Its accounting folder is the entry's
   ``share`` (a ResourceClaim's requests, shared by every container naming them) or its own
   ``<pod-uid>_<container>``.
4b. Named, not listed, and given the devices of a ResourceClaim's requests
   (``EGPU_CLAIM_SHARE_*``: a pod that joined the claim after the kubelet prepared it for
   another pod) -> the entry of the claim's shares file for exactly those requests; the claim
   must be one, prepared on this node (its file), of the pod's namespace, and shared as
   those requests (else Refuse); then as 4.
   Named, not listed, and the device plugin gave it devices (``EGPU_DEVICES``) -> Refuse.
   Named, not listed, no devices -> Skip.
5. Not named but given devices -> Refuse (ambiguous: never guess a share).
6. Not named, no devices, ``EGPU_MEMORY_LIMIT_MIB`` / ``EGPU_MEMORY_PERCENTAGE`` /
   ``EGPU_CORES`` in the env -> a raw-node share (``egpu run``): the interposer reads the env;
   no config file is written; its cards are the UUIDs ``NVIDIA_VISIBLE_DEVICES`` names.
7. Anything else -> Skip: the container is left untouched.

``card_shares(plan, env, uid)`` gives the roster entry of an applied share on each of its
cards (egpu.card_roster; docs/security.md, "Node-side state").
"""

from __future__ import annotations

from egpu.contract import (
    CARDS_SUBDIR,
    CONTAINER_REGION_FILE,
    CONTAINERS_SUBDIR,
    ENV_ALLOCATION_ERROR,
    ENV_CLAIM_SHARE_PREFIX,
    ENV_COMPUTE_POLICY,
    ENV_CONTAINER,
    ENV_CONTAINER_REGION,
    ENV_CORES,
    ENV_DEVICES,
    ENV_MEMORY_LIMIT_MIB,
    ENV_MEMORY_PERCENTAGE,
    ENV_POD_UID,
    ENV_PRIORITY,
    ENV_RUNTIME_DIR,
    INTERPOSER_PATH_IN_CONTAINER,
    NVIDIA_VISIBLE_DEVICES,
    OCI_ANN_CONTAINER_NAME,
    OCI_ANN_CONTAINER_TYPE,
    OCI_ANN_POD_NAME,
    OCI_ANN_POD_NAMESPACE,
    OCI_ANN_POD_UID,
    RUNTIME_DIR,
    claim_mark_path,
    container_dir_name,
    is_file_name,
)

TYPE_CHECKING = False  # plain classes, no dataclasses/typing: the hook's startup time
if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from egpu.card_roster import RosterEntry
    from egpu.records import ContainerAllocation, ContainerConfig, PodShares

RAW_CONTAINER: str = "raw"  # container part of a raw share's folder name: <oci-id>_raw


class _Value:
    """Equality and repr over ``__slots__`` (what the frozen dataclasses gave)."""

    __slots__: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, k) for k in self.__slots__))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"{type(self).__name__}({fields})"


class Inputs(_Value):
    """Everything the decision reads. shares: the pod's allocation file (egpu.records.PodShares;
    None: no file); shares_error: why the file could not be read (None: fine or absent).
    claim: the shares file of the one claim ``claim_requests(env)`` names (None: none, or
    absent); claim_error: why it could not be read. ``claim_requests``: ``claim_requests(env)``,
    read once. devices: the container's device node paths (``oci.Spec.devices``)."""

    __slots__ = ("annotations", "claim", "claim_error", "claim_requests", "container_id",
                 "devices", "env", "shares", "shares_error")

    def __init__(self, container_id: str, env: Mapping[str, str],
                 annotations: Mapping[str, str],
                 shares: PodShares | None = None,
                 shares_error: str | None = None,
                 claim: PodShares | None = None,
                 claim_error: str | None = None,
                 devices: Collection[str] = ()) -> None:
        self.container_id, self.env, self.annotations = container_id, env, annotations
        self.shares, self.shares_error = shares, shares_error
        self.claim, self.claim_error = claim, claim_error
        self.claim_requests = claim_requests(env)
        self.devices = frozenset(devices)


class Skip(_Value):
    """Leave the container untouched."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Refuse(_Value):
    """Fail the container's creation; ``message`` is what the user sees."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class Apply(_Value):
    """Give the container its share. dir_name: ``<pod-uid>_<container>`` (the hook's private
    folder). region_name: the accounting region's folder (the container's own ``dir_name``,
    or a claim's, shared: ``claim-<uid>_<requests>``). config: the interposer's config file
    (None for a raw share: the interposer reads the environment)."""

    __slots__ = ("config", "dir_name", "region_name")

    def __init__(self, dir_name: str, config: ContainerConfig | None,
                 region_name: str | None = None) -> None:
        self.dir_name, self.config = dir_name, config
        self.region_name = region_name or dir_name


Decision = Skip | Refuse | Apply


def first_annotation(annotations: Mapping[str, str], keys: tuple[str, ...]) -> str:
    """The value of the first of ``keys`` present and non-empty, else ``""``."""
    return next((annotations[k] for k in keys if annotations.get(k)), "")


def identify(env: Mapping[str, str], annotations: Mapping[str, str]) -> tuple[str, str]:
    """(pod uid, container name) from the OCI annotations, else the device plugin's env;
    ``("", "")`` when neither names the container."""
    uid = first_annotation(annotations, OCI_ANN_POD_UID)
    name = first_annotation(annotations, OCI_ANN_CONTAINER_NAME)
    if uid and name:
        return uid, name
    return env.get(ENV_POD_UID, ""), env.get(ENV_CONTAINER, "")


def visible_uuids(value: str) -> tuple[str, ...]:
    """``NVIDIA_VISIBLE_DEVICES`` as a tuple of entries (comma-separated, blanks dropped)."""
    return tuple(v.strip() for v in value.split(",") if v.strip())


def claim_requests(env: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """claim UID -> the requests whose CDI devices the container was given, from the
    ``EGPU_CLAIM_SHARE_<uid>_<request>=<uid>/<request>`` variables (egpu.contract
    .claim_share_env); a variable whose value does not match its name is left out."""
    out: dict[str, set[str]] = {}
    for name, value in env.items():
        if not name.startswith(ENV_CLAIM_SHARE_PREFIX):
            continue
        uid, _, request = value.partition("/")
        if name != f"{ENV_CLAIM_SHARE_PREFIX}{uid}_{request}" or not _dns_label(request):
            continue
        out.setdefault(uid, set()).add(request)
    return {uid: frozenset(r) for uid, r in out.items()}


def _dns_label(text: str) -> bool:
    return 0 < len(text) <= 63 and all(c.isascii() and (c.islower() or c.isdigit() or c == "-")
                                       for c in text)


def container_config(shares: PodShares, entry: ContainerAllocation, pod_uid: str,
                     container: str, region: str, namespace: str | None = None,
                     pod: str | None = None) -> ContainerConfig:
    """The interposer's config of ``container`` of the pod: ``entry``'s cards, the policies
    and floor of ``shares`` (the pod's allocation file, or a claim's shares file for a pod
    that joined the claim: then ``namespace`` and ``pod`` are the pod's), its accounting
    region in folder ``region``. Paths are the in-container paths under ``RUNTIME_DIR``."""
    from egpu.records import ConfigCard, ContainerConfig  # only a pod with a share

    return ContainerConfig(
        namespace=shares.namespace if namespace is None else namespace,
        pod=shares.pod if pod is None else pod,
        pod_uid=pod_uid,
        container=container,
        priority=shares.priority,
        compute_policy=shares.compute_policy,
        memory_oversubscription=shares.memory_oversubscription,
        container_region=f"{RUNTIME_DIR}/{CONTAINERS_SUBDIR}/{region}/{CONTAINER_REGION_FILE}",
        cards=tuple(
            ConfigCard(
                uuid=c.uuid,
                memory_mib=c.memory_mib,
                cores=c.cores,
                card_region=f"{RUNTIME_DIR}/{CARDS_SUBDIR}/{c.uuid}",
            )
            for c in entry.cards
        ),
        low_priority_floor=shares.low_priority_floor,
    )


def joined_claim_entry(inputs: Inputs, named: Mapping[str, frozenset[str]], pod_uid: str,
                       container: str) -> ContainerAllocation | Refuse:
    """Rule 4b: the entry of the claim's shares file (``inputs.claim``) for exactly the
    requests ``named`` gave the container (``claim_requests``), for a pod that joined the
    claim after it was prepared."""
    where = f"egpu: pod {pod_uid} container {container!r}"
    if len(named) != 1:
        return Refuse(f"{where} was given the devices of {len(named)} egpu ResourceClaims "
                      f"({', '.join(sorted(named))}); a container takes one egpu claim")
    ((uid, requests),) = named.items()
    unmarked = sorted(r for r in requests if claim_mark_path(uid, r) not in inputs.devices)
    if unmarked:  # the variables alone: a pod can set them, the kubelet did not give the claim
        return Refuse(
            f"{where} names requests {', '.join(unmarked)} of ResourceClaim {uid} in its "
            f"environment ({ENV_CLAIM_SHARE_PREFIX}*) but was not given their CDI devices "
            f"(no device node {claim_mark_path(uid, unmarked[0])}); the kubelet gives them "
            "only to the containers of pods that reference the claim: refusing to join "
            "another pod's share")
    if inputs.claim_error:
        return Refuse(f"{where}: the shares file of ResourceClaim {uid} is unreadable: "
                      f"{inputs.claim_error}")
    claim = inputs.claim
    if claim is None or claim.pod_uid != uid:
        return Refuse(f"{where}: ResourceClaim {uid} is not prepared on this node (no shares "
                      "file; is egpu-node-agent's DRA plugin running?)")
    namespace = first_annotation(inputs.annotations, OCI_ANN_POD_NAMESPACE)
    if namespace != claim.namespace:
        return Refuse(f"{where}: ResourceClaim {claim.namespace}/{claim.pod} is not of the "
                      f"pod's namespace ({namespace or 'unknown'})")
    key = ".".join(sorted(requests))
    entry = claim.allocation.for_container(key)
    if entry is None:
        shared = [c.name.replace(".", ", ") for c in claim.allocation.containers]
        return Refuse(f"{where}: ResourceClaim {claim.namespace}/{claim.pod} is shared as "
                      f"requests {' | '.join(shared) or '(none)'}; a pod that joins it names "
                      f"one of these exactly, not {key.replace('.', ', ')}")
    return entry


def decide(inputs: Inputs) -> Decision:
    """Apply the rules of the module docstring."""
    env, annotations = inputs.env, inputs.annotations
    if annotations.get(OCI_ANN_CONTAINER_TYPE) == "sandbox":
        return Skip("sandbox container")
    if env.get(ENV_ALLOCATION_ERROR):
        return Refuse(f"egpu: no share for this container: {env[ENV_ALLOCATION_ERROR]}")
    given_devices = bool(env.get(ENV_DEVICES))
    pod_uid, container = identify(env, annotations)
    if pod_uid and container:
        where = f"pod {pod_uid} container {container!r}"
        if inputs.shares_error:
            return Refuse(f"egpu: {where}: allocation file unreadable: {inputs.shares_error}")
        pod_name = first_annotation(annotations, OCI_ANN_POD_NAME)
        pod_ns = first_annotation(annotations, OCI_ANN_POD_NAMESPACE)
        source = inputs.shares
        entry = source.allocation.for_container(container) if source else None
        joined = entry is None and bool(inputs.claim_requests)
        if joined:
            found = joined_claim_entry(inputs, inputs.claim_requests, pod_uid, container)
            if isinstance(found, Refuse):
                return found
            source, entry = inputs.claim, found
        if source is None or entry is None:
            if inputs.shares is None and given_devices:
                return Refuse(
                    f"egpu: {where} was given egpu devices but this node has no allocation "
                    "file for the pod (is egpu-node-agent running on this node?)"
                )
            if given_devices:
                return Refuse(
                    f"egpu: {where} was given egpu devices but the pod's allocation has no "
                    "entry for it"
                )
            return Skip(f"{where}: no share in the pod's allocation" if inputs.shares
                        else f"{where}: no egpu allocation")
        region = entry.share or container_dir_name(pod_uid, container)
        config = (container_config(source, entry, pod_uid, container, region, pod_ns, pod_name)
                  if joined else container_config(source, entry, pod_uid, container, region))
        wanted = tuple(c.uuid for c in config.cards)
        visible = visible_uuids(env.get(NVIDIA_VISIBLE_DEVICES, ""))
        if sorted(visible) != sorted(wanted):
            return Refuse(
                f"egpu: {where}: NVIDIA_VISIBLE_DEVICES={','.join(visible) or '(unset)'} does "
                f"not match its allocation {','.join(wanted)}; the kubelet's device choice "
                "did not match the scheduler's (see docs/node.md, FC-12); refusing rather than "
                "running with another pod's share"
            )
        if (pod_name and pod_name != config.pod) or (pod_ns and pod_ns != config.namespace):
            return Refuse(f"egpu: {where}: pod name/namespace differ from its allocation file")
        return Apply(container_dir_name(pod_uid, container), config, region)
    if given_devices:
        return Refuse(
            "egpu: this container was given egpu devices but neither the runtime's OCI "
            "annotations (io.kubernetes.cri.sandbox-uid/container-name) nor the device "
            "plugin named its pod: the share is ambiguous, refusing to guess"
        )
    if any(env.get(k) for k in (ENV_MEMORY_LIMIT_MIB, ENV_MEMORY_PERCENTAGE, ENV_CORES)):
        return Apply(container_dir_name(inputs.container_id, RAW_CONTAINER), None)
    return Skip("no egpu share")


def raw_card_uuids(env: Mapping[str, str]) -> tuple[str, ...]:
    """The cards of a raw share (``Apply`` without a config): the card UUIDs that
    ``NVIDIA_VISIBLE_DEVICES`` names; ``all``, ``none``, ``void``, indexes and entries that
    are no file name are left out (the hook cannot tell which card they are)."""
    return tuple(v for v in visible_uuids(env.get(NVIDIA_VISIBLE_DEVICES, ""))
                 if v not in ("all", "none", "void") and not v.replace(":", "").isdigit()
                 and is_file_name(v))


def raw_container_region(env: Mapping[str, str], uid: int) -> str:
    """The accounting region path the interposer of a raw share computes (config.c,
    load_env): ``EGPU_CONTAINER_REGION``, else ``<EGPU_RUNTIME_DIR or RUNTIME_DIR>/containers/
    local-uid<uid>/region`` with the uid its processes run as (the spec's process.user.uid)."""
    region = env.get(ENV_CONTAINER_REGION, "")
    if region:
        return region
    runtime = env.get(ENV_RUNTIME_DIR, "") or RUNTIME_DIR
    return (f"{runtime}/{CONTAINERS_SUBDIR}/local-uid{uid & 0xFFFFFFFF}/"
            f"{CONTAINER_REGION_FILE}")


def _env_choice(env: Mapping[str, str], name: str, codes: dict[str, int]) -> int:
    return codes.get(env.get(name, ""), 0)


def _env_cores(env: Mapping[str, str]) -> int:
    """``EGPU_CORES`` as the interposer reads it (strtoll: blanks, a sign, decimal digits),
    0 when unset or invalid (the interposer then keeps CUDA off anyway)."""
    text = env.get(ENV_CORES, "").lstrip(" \t\n\v\f\r")
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits.isascii() or not digits.isdigit():
        return 0
    cores = int(text)
    return cores if 0 <= cores <= 100 else 0


def card_shares(plan: Apply, env: Mapping[str, str], uid: int) -> list[tuple[str, RosterEntry]]:
    """(card UUID, its roster entry) for each card of the share, in order: what the node
    says of the share (docs/security.md, "Node-side state"). Owner: the share's key as its
    interposer computes it (its config's ``container_region``; raw: ``raw_container_region``);
    name: ``plan.region_name``. Terms: the config's priority, compute policy, card cores and
    low-priority floor; a raw share's from its environment (``EGPU_PRIORITY``,
    ``EGPU_COMPUTE_POLICY``, ``EGPU_CORES``: what its interposer reads; high, strict and 0
    when unset or invalid), floor 0, on the cards ``raw_card_uuids`` names."""
    from egpu.card_roster import POLICY_CODES, PRIORITY_CODES, RosterEntry, region_owner

    config = plan.config
    if config is not None:
        owner = region_owner(config.container_region)
        priority = PRIORITY_CODES[config.priority]
        policy = POLICY_CODES[config.compute_policy]
        return [(c.uuid, RosterEntry(owner, priority, policy, c.cores,
                                     config.low_priority_floor, 0, plan.region_name))
                for c in config.cards]
    entry = RosterEntry(region_owner(raw_container_region(env, uid)),
                        _env_choice(env, ENV_PRIORITY, PRIORITY_CODES),
                        _env_choice(env, ENV_COMPUTE_POLICY, POLICY_CODES), _env_cores(env),
                        0, 0, plan.dir_name)
    return [(uuid, entry) for uuid in raw_card_uuids(env)]


def preload_text(existing: bytes | None) -> bytes:
    """The container's /etc/ld.so.preload: the image's own entries (whitespace-separated,
    as ld.so reads them), ours dropped, then the interposer last."""
    entries = [e for e in (existing or b"").decode(errors="replace").split()
               if e != INTERPOSER_PATH_IN_CONTAINER]
    return ("\n".join([*entries, INTERPOSER_PATH_IN_CONTAINER]) + "\n").encode()
