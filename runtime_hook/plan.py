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
   Named and given egpu's CDI card devices (``EGPU_CDI_CARD_<i>``) that are not its share's
   cards (or with no share) -> Refuse: egpu's card device always comes with a share.
5. Not named but given devices -> Refuse (ambiguous: never guess a share).
6. Not named, no devices, ``EGPU_MEMORY_LIMIT_MIB`` / ``EGPU_MEMORY_PERCENTAGE`` /
   ``EGPU_CORES`` in the env -> a raw-node share (containerd without Kubernetes): its terms
   are those variables (and ``EGPU_PRIORITY``, ``EGPU_COMPUTE_POLICY``,
   ``EGPU_MEMORY_OVERSUBSCRIPTION``; a bad value -> Refuse); its cards are those egpu's CDI
   devices name (``EGPU_CDI_CARD_<i>``) and the UUIDs ``NVIDIA_VISIBLE_DEVICES`` names (both
   there: the same set, else Refuse; none, or an entry that is no UUID -> Refuse). Like a pod's
   share, the hook writes its config file (``raw_config``), region folder ``<oci-id>_raw``:
   each raw container is its own share, whatever its uid.
6b. Not named, given egpu's CDI card devices, no share variables -> Refuse naming them (fail
   closed: egpu's card device never comes without a cap).
7. Anything else -> Skip: the container is left untouched.

``card_shares(plan)`` gives the roster entry of an applied share on each of its
cards (egpu.card_roster; docs/security.md, "Node-side state").
"""

from __future__ import annotations

from egpu.contract import (
    CARDS_SUBDIR,
    ENV_ALLOCATION_ERROR,
    ENV_CDI_CARD_PREFIX,
    ENV_CLAIM_SHARE_PREFIX,
    ENV_COMPUTE_POLICY,
    ENV_CONTAINER,
    ENV_CORES,
    ENV_DEVICES,
    ENV_MEMORY_LIMIT_MIB,
    ENV_MEMORY_OVERSUBSCRIPTION,
    ENV_MEMORY_PERCENTAGE,
    ENV_POD_UID,
    ENV_PRIORITY,
    INTERPOSER_PATH_IN_CONTAINER,
    MAX_SHARE_MIB,
    NVIDIA_VISIBLE_DEVICES,
    OCI_ANN_CONTAINER_NAME,
    OCI_ANN_CONTAINER_TYPE,
    OCI_ANN_POD_NAME,
    OCI_ANN_POD_NAMESPACE,
    OCI_ANN_POD_UID,
    RUNTIME_DIR,
    claim_mark_path,
    container_dir_name,
    container_region_path,
    is_file_name,
)

TYPE_CHECKING = False  # plain classes, no dataclasses/typing: the hook's startup time
if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from egpu.card_roster import RosterEntry
    from egpu.records import ContainerAllocation, ContainerConfig, PodShares

RAW_CONTAINER: str = "raw"  # container part of a raw share's folder name: <oci-id>_raw
RAW_SHARE_VARIABLES = (ENV_MEMORY_LIMIT_MIB, ENV_MEMORY_PERCENTAGE, ENV_CORES)


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
    (a raw share's too: ``raw_config``)."""

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
        container_region=container_region_path(region),
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
    cdi_cards = cdi_card_uuids(env)
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
            if cdi_cards:
                return Refuse(f"egpu: {where} was given egpu's CDI card devices "
                              f"({','.join(cdi_cards)}) but has no share in a pod's allocation: "
                              "egpu's card device comes only with a share")
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
        if not set(cdi_cards) <= set(wanted):  # e.g. a pod's own cdi.k8s.io annotation
            return Refuse(f"egpu: {where} was given egpu's CDI card devices "
                          f"{','.join(cdi_cards)}, beyond its allocation {','.join(wanted)}")
        if (pod_name and pod_name != config.pod) or (pod_ns and pod_ns != config.namespace):
            return Refuse(f"egpu: {where}: pod name/namespace differ from its allocation file")
        return Apply(container_dir_name(pod_uid, container), config, region)
    if given_devices:
        return Refuse(
            "egpu: this container was given egpu devices but neither the runtime's OCI "
            "annotations (io.kubernetes.cri.sandbox-uid/container-name) nor the device "
            "plugin named its pod: the share is ambiguous, refusing to guess"
        )
    if any(env.get(k) for k in RAW_SHARE_VARIABLES):
        return raw_share(inputs.container_id, env, cdi_cards)
    if cdi_cards:
        return Refuse(
            f"egpu: container {inputs.container_id} was given egpu's CDI card devices "
            f"({','.join(cdi_cards)}) but no share: set {ENV_MEMORY_LIMIT_MIB} (MiB per card) "
            f"or {ENV_MEMORY_PERCENTAGE} (% of each card), and optionally {ENV_CORES}, "
            f"{ENV_PRIORITY}, {ENV_COMPUTE_POLICY}, {ENV_MEMORY_OVERSUBSCRIPTION} in its "
            "environment (docs/containerd.md); egpu never gives a card without a cap")
    return Skip("no egpu share")


_NOT_A_CARD = ("all", "none", "void")


def cdi_card_uuids(env: Mapping[str, str]) -> tuple[str, ...]:
    """The cards egpu's CDI devices gave the container (``EGPU_CDI_CARD_<index>=<uuid>``,
    node_agent.cdi), by index."""
    found = sorted((int(name[len(ENV_CDI_CARD_PREFIX):]), value.strip())
                   for name, value in env.items()
                   if name.startswith(ENV_CDI_CARD_PREFIX)
                   and name[len(ENV_CDI_CARD_PREFIX):].isascii()
                   and name[len(ENV_CDI_CARD_PREFIX):].isdigit() and value.strip())
    return tuple(dict.fromkeys(uuid for _, uuid in found))


def raw_card_uuids(env: Mapping[str, str], cdi_cards: tuple[str, ...]) -> tuple[str, ...] | str:
    """The cards of a raw share (rule 6), or why there are none the hook can name: the CDI
    cards and ``NVIDIA_VISIBLE_DEVICES``'s UUIDs (``none``/``void``/unset: no entry), the
    same set when both are given; ``all``, an index or anything not a file name is refused
    (the hook cannot tell which card it is, and a card without a booking is uncapped)."""
    variable = NVIDIA_VISIBLE_DEVICES
    visible = tuple(v for v in visible_uuids(env.get(variable, "")) if v not in ("none", "void"))
    unnamed = [v for v in (*visible, *cdi_cards) if v in _NOT_A_CARD
               or v.replace(":", "").isdigit() or not is_file_name(v)]
    if unnamed:
        return (f"{variable}={env.get(variable, '')}: {unnamed[0]!r} names no card by UUID; "
                "a raw container's cards are named by UUID (or through egpu's CDI devices)")
    if cdi_cards and visible and set(cdi_cards) != set(visible):
        return (f"egpu's CDI devices gave cards {','.join(cdi_cards)} but {variable} names "
                f"{','.join(visible)}; set {variable} to the same cards or leave it out")
    cards = cdi_cards or tuple(dict.fromkeys(visible))
    if not cards:
        return (f"it names no card: give it egpu's CDI device egpu.io/gpu=<index or uuid>, or "
                f"set {variable} to its cards' UUIDs")
    return cards


def _env_number(env: Mapping[str, str], name: str, low: int, high: int) -> int | str | None:
    """``name`` as the interposer reads it (strtoll: blanks, a sign, decimal digits): the
    number, None when unset, or why it is refused."""
    raw = env.get(name, "")
    if not raw:
        return None
    text = raw.lstrip(" \t\n\v\f\r")
    digits = text[1:] if text[:1] in ("+", "-") else text
    if digits.isascii() and digits.isdigit() and low <= int(text) <= high:
        return int(text)
    return f"{name}={raw}: must be an integer in {low}..{high}"


def _env_choice(env: Mapping[str, str], name: str, choices: tuple[str, str]) -> str:
    """``name``'s value (the first of ``choices`` when unset), or ``""`` when not a choice."""
    value = env.get(name, "") or choices[0]
    return value if value in choices else ""


def raw_share(container_id: str, env: Mapping[str, str],
              cdi_cards: tuple[str, ...]) -> Apply | Refuse:
    """Rule 6: a raw container's share, with its config file (``raw_config``)."""
    where = f"egpu: raw container {container_id}"
    cards = raw_card_uuids(env, cdi_cards)
    if isinstance(cards, str):
        return Refuse(f"{where}: {cards}")
    mib = _env_number(env, ENV_MEMORY_LIMIT_MIB, 1, MAX_SHARE_MIB)
    percentage = _env_number(env, ENV_MEMORY_PERCENTAGE, 1, 100)
    cores = _env_number(env, ENV_CORES, 0, 100)
    for value in (mib, percentage, cores):
        if isinstance(value, str):
            return Refuse(f"{where}: {value}")
    assert not isinstance(mib, str) and not isinstance(percentage, str)  # narrowed for mypy
    assert not isinstance(cores, str)  # narrowed for mypy
    if (mib is None) == (percentage is None):
        return Refuse(f"{where}: set one of {ENV_MEMORY_LIMIT_MIB} (MiB per card) and "
                      f"{ENV_MEMORY_PERCENTAGE} (% of each card)"
                      + (", not both" if mib is not None else ""))
    choices = {ENV_PRIORITY: ("high", "low"), ENV_COMPUTE_POLICY: ("strict", "elastic"),
               ENV_MEMORY_OVERSUBSCRIPTION: ("false", "true")}
    terms = {name: _env_choice(env, name, allowed) for name, allowed in choices.items()}
    for name, value in terms.items():
        if not value:
            return Refuse(f"{where}: {name}={env[name]}: must be "
                          f"{' or '.join(choices[name])}")
    if not is_file_name(container_id):
        return Refuse(f"{where}: the container id is no file name")
    dir_name = container_dir_name(container_id, RAW_CONTAINER)
    config = raw_config(container_id, dir_name, cards, mib or 0, percentage or 0, cores or 0,
                        terms[ENV_PRIORITY], terms[ENV_COMPUTE_POLICY],
                        terms[ENV_MEMORY_OVERSUBSCRIPTION] == "true")
    return Apply(dir_name, config)


def raw_config(container_id: str, dir_name: str, cards: tuple[str, ...], mib: int,
               percentage: int, cores: int, priority: str, compute_policy: str,
               oversubscription: bool) -> ContainerConfig:
    """A raw container's interposer config: the same file as a pod's (``container_config``),
    so that its interposer uses the folder the hook mounted (``<oci-id>_raw``) and the node's
    terms, never the environment the container could change; each card ``mib`` MiB, or
    ``percentage`` % of the card (the hook does not know its size), and ``cores`` %."""
    from egpu.records import ConfigCard, ContainerConfig  # only a container with a share

    return ContainerConfig(
        namespace="", pod="", pod_uid=container_id, container=RAW_CONTAINER,
        priority=priority, compute_policy=compute_policy,
        memory_oversubscription=oversubscription,
        container_region=container_region_path(dir_name),
        cards=tuple(ConfigCard(uuid=uuid, memory_mib=mib, cores=cores,
                               card_region=f"{RUNTIME_DIR}/{CARDS_SUBDIR}/{uuid}",
                               memory_percentage=percentage)
                    for uuid in cards),
    )


def card_shares(plan: Apply) -> list[tuple[str, RosterEntry]]:
    """(card UUID, its roster entry) for each card of the share, in order: what the node
    says of the share (docs/security.md, "Node-side state"). Owner: the share's key as its
    interposer computes it (its config's ``container_region``: a raw container's is its own,
    ``<oci-id>_raw``); name: ``plan.region_name``. Terms: the config's priority, compute
    policy, card cores and low-priority floor."""
    from egpu.card_roster import POLICY_CODES, PRIORITY_CODES, RosterEntry, region_owner

    config = plan.config
    if config is None:
        return []
    owner = region_owner(config.container_region)
    priority = PRIORITY_CODES[config.priority]
    policy = POLICY_CODES[config.compute_policy]
    return [(c.uuid, RosterEntry(owner, priority, policy, c.cores,
                                 config.low_priority_floor, 0, plan.region_name))
            for c in config.cards]


def preload_text(existing: bytes | None) -> bytes:
    """The container's /etc/ld.so.preload: the image's own entries (whitespace-separated,
    as ld.so reads them), ours dropped, then the interposer last."""
    entries = [e for e in (existing or b"").decode(errors="replace").split()
               if e != INTERPOSER_PATH_IN_CONTAINER]
    return ("\n".join([*entries, INTERPOSER_PATH_IN_CONTAINER]) + "\n").encode()
