"""Answer an AdmissionReview for a pod: the webhook's pure core (no HTTP, no API calls).

``review(admission_review, config) -> AdmissionReview`` takes the JSON object the API server
POSTs (admission.k8s.io/v1 ``AdmissionReview``; shapes in ``webhook.reviews``) and returns the
answer. ``InvalidReview`` is raised when the input is not an AdmissionReview this webhook can
answer (the HTTP edge turns it into a 400).

What it decides, for ``CREATE`` of a ``Pod`` outside ``config.ignored_namespaces``
(../shared/CONTRACT.md sections 1 and 2):

- any pod that arrives with an ``egpu.io/allocation`` annotation: denied, code 403 (only the
  egpu scheduler writes it, through the Binding; a hand-written one would book cards);
- not an egpu pod (no ``egpu.io/*`` or alias resource in any container): allowed, no patch,
  whatever its other annotations say;
- an egpu pod with mistakes (every error of ``egpu.requests.read_pod``, wrongly typed fields
  included: ``spec.containers[0].resources.limits=[...] is not allowed (a list of 1 item);
  allowed: ...``): denied, code 400, reason ``BadRequest``, the errors' messages joined with
  ``"; "`` (at most ``MAX_PROBLEMS_SHOWN``, then how many more);
- an egpu pod that sets ``spec.nodeName`` (it would bypass card placement) or has a
  privileged container with a share (or one adding SYS_ADMIN, SYS_PTRACE, SYS_MODULE or ALL,
  or hostPID / hostIPC, or a hostPath reaching egpu's node folders) while
  ``config.allow_privileged`` is false: denied,
  code 403, reason ``Forbidden`` (together with any request errors: then code 400);
- otherwise allowed with a JSON Patch that brings the pod to the contract's shape
  (``mutate_pod``). A second pass over the patched pod yields no patch (idempotent), which is
  what ``reinvocationPolicy: IfNeeded`` relies on.

The pod's allocation mode (``Config.allocation_mode_for``: its ``egpu.io/allocation-mode``
annotation, its namespace's entry in ``namespaceAllocationModes``, else ``allocationMode``)
picks the patch. ``extender``: as above. ``dra`` (docs/dra.md "Claims from pod specs"): the
same reading and denials, then ``mutate_pod_dra``: the pod's own ResourceClaim, of the
plan that ``egpu.dra.claims.plan_claims`` makes of its shares (named by
``egpu.dra.claims.claim_name`` from the request's uid, referred to by
``resourceClaimName``), each share container pointed at its requests, the egpu resources
taken out of its limits (DRA nodes do not offer them), no schedulerName (the kube-scheduler
places claims). The decision carries the claim (``Decision.claims``); the HTTP edge creates
it before answering (except for a dry run) and denies the pod when it cannot; the claim
sweeper (``webhook.claimsweep``) deletes it once no pod can use it. A share the claim cannot express
(``ClaimPlanError``), or a pod claim already named ``egpu``, is denied, code 400.

Every other operation or resource is allowed untouched. ``dryRun`` requests are answered the
same way (this module has no side effects; the edge creates no claim for them).

The pod is read once through ``egpu.podshape.check_pod``: the policy checks read its typed
view, and ``mutate_pod`` runs only on a pod whose read fields all have their types. Nothing
walks the fields egpu does not read, so no pod, however large or deeply nested, makes the
review fail.
"""

from __future__ import annotations

import base64
import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import jsonpatch

from egpu.config import Config
from egpu.contract import (
    ALLOCATION_MODE_DRA,
    ANN_ALLOCATION,
    ANN_GPU_POLICY,
    ANN_NODE_POLICY,
    CONTAINER_CONFIG_PATH,
    DRA_POD_CLAIM,
    EGPU_RESOURCES,
    ENV_COMPUTE_POLICY,
    ENV_MEMORY_OVERSUBSCRIPTION,
    ENV_PRIORITY,
    HOST_INSTALL_DIR,
    INTERPOSER_PATH_IN_CONTAINER,
    KUBE_DEFAULT_SCHEDULER,
    LABEL_PRIORITY,
    LD_SO_PRELOAD,
    NODE_PRIVATE_DIR,
    RES_CORES,
    RES_GPU,
    RES_MEMORY,
    RES_MEMORY_PERCENTAGE,
    RUNTIME_DIR,
)
from egpu.dra.claims import (
    ClaimPlan,
    ClaimPlanError,
    claim_name,
    needs_card_sizes,
    plan_claims,
)
from egpu.kube import KubePod
from egpu.podshape import ContainerView, PodView, SpecView, check_pod, clip
from egpu.requests import PodRequest, read_checked
from webhook.reviews import (
    API_VERSION_V1,
    API_VERSIONS,
    KIND,
    PATCH_TYPE_JSON,
    AdmissionResponse,
    AdmissionReview,
    Status,
)

# Host folders that no pod with a share may mount: egpu's state (the runtime hook mounts each
# container's own region folder and card region files itself), with /var/run a link to /run
# on most nodes, both spellings; egpu's install folder (the hook runs from it as root, the
# interposer is copied from it); /proc, whose <pid>/root reaches every host folder.
EGPU_HOST_DIRS: Final = tuple(sorted({
    *(d for base in (RUNTIME_DIR, NODE_PRIVATE_DIR)
      for d in (base, base.replace("/var/run/", "/run/", 1))),
    HOST_INSTALL_DIR, "/proc"}))

# Paths in a container with a share that the runtime hook mounts (the interposer, the
# preload list, the share's config, its region and card folders): a volume of the pod at or
# under one would be covered by the hook's mount, so it is refused at admission, by name.
EGPU_CONTAINER_PATHS: Final = tuple(sorted({
    LD_SO_PRELOAD, posixpath.dirname(INTERPOSER_PATH_IN_CONTAINER),
    posixpath.dirname(CONTAINER_CONFIG_PATH), RUNTIME_DIR,
    RUNTIME_DIR.replace("/var/run/", "/run/", 1)}))

# Result labels (also the values of the metrics' ``result`` label).
RESULT_ALLOWED: Final = "allowed"  # allowed, nothing to change
RESULT_PATCHED: Final = "patched"  # allowed with a patch
RESULT_DENIED: Final = "denied"  # allowed: false

# Denial kinds (values of the denial metric's ``reason`` label).
DENY_INVALID_REQUEST: Final = "invalid-request"
DENY_NODE_NAME: Final = "node-name"
DENY_PRIVILEGED: Final = "privileged"
DENY_HOST_PATH: Final = "host-path"
DENY_RESERVED_PATH: Final = "reserved-path"  # a volumeMount where the runtime hook mounts
DENY_ALLOCATION: Final = "allocation"
DENY_CLAIM: Final = "claim"  # DRA mode: the share cannot become a claim

# DRA mode: the fleet's card sizes (MiB), read only for a memory percentage; raises
# ClaimPlanError when they cannot be read. The default knows none.
CardSizes = Callable[[], Sequence[int]]


def no_card_sizes() -> Sequence[int]:
    """A CardSizes that knows no card (a percentage in DRA mode is then denied)."""
    return ()

# Capabilities a container with a share may not add: SYS_ADMIN unmounts the interposer, the
# read-only config or ld.so.preload; SYS_PTRACE reads and writes other processes (their
# accounting); SYS_MODULE loads kernel code; SYS_RAWIO reaches device memory and I/O ports;
# DAC_READ_SEARCH opens any file of a mounted host file system by handle (open_by_handle_at:
# the node's /run through the share's own mounts); BPF and PERFMON read kernel and other
# processes' memory; MAC_ADMIN and MAC_OVERRIDE lift the LSM confinement; ALL includes them.
# The same list is in the ValidatingAdmissionPolicy egpu-pod-fields (ephemeral containers).
FORBIDDEN_CAPABILITIES: Final = ("SYS_ADMIN", "SYS_PTRACE", "SYS_MODULE", "SYS_RAWIO",
                                 "DAC_READ_SEARCH", "BPF", "PERFMON", "MAC_ADMIN",
                                 "MAC_OVERRIDE", "ALL")

MAX_PROBLEMS_SHOWN: Final = 50  # a denial lists at most this many problems, then a count


class InvalidReview(ValueError):
    """The body is not an AdmissionReview egpu can answer; the message says what is wrong."""


@dataclass(frozen=True)
class Decision:
    """What the webhook says about one object.

    allowed: admit or not. patch: JSON Patch operations (RFC 6902), empty for none.
    warnings: shown to the client. code/reason/message: the denial's ``Status`` (allowed
    false only). denials: the kinds of denial (``DENY_*``), for metrics. claims: DRA mode,
    the ResourceClaims (with namespace) the patched pod refers to, for the HTTP edge to
    create before it answers.
    """

    allowed: bool
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    code: int = 200
    reason: str = ""
    message: str = ""
    denials: tuple[str, ...] = ()
    claims: tuple[dict[str, Any], ...] = ()

    @property
    def result(self) -> str:
        """``allowed``, ``patched`` or ``denied`` (the metrics' ``result`` label)."""
        if not self.allowed:
            return RESULT_DENIED
        return RESULT_PATCHED if self.patch else RESULT_ALLOWED


ALLOW: Final = Decision(allowed=True)


# --- Reading the pod ---------------------------------------------------------------------


def _mapping(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _resource_names(container: Mapping[str, Any]) -> set[str]:
    resources = _mapping(container.get("resources")) or {}
    names: set[str] = set()
    for key in ("limits", "requests"):
        values = _mapping(resources.get(key))
        if values:
            names.update(str(k) for k in values)
    return names


def has_share(container: Mapping[str, Any], config: Config) -> bool:
    """True when the container asks for an egpu resource (an ``egpu.io/`` name or an alias).

    For a pod that ``read_pod`` found valid, these are exactly the containers with a share.
    """
    return any(n in EGPU_RESOURCES or n in config.resource_aliases
               for n in _resource_names(container))


def absolute_path(raw: str) -> str:
    """An absolute path as the runtime resolves it: ``.`` and repeated slashes gone, and the
    leading ``//`` that ``posixpath.normpath`` keeps (POSIX leaves its meaning open; Linux,
    containerd's symlink resolution and runc read it as ``/``) made one slash."""
    return posixpath.normpath("/" + raw.lstrip("/"))


def _covers(path: str, folder: str) -> bool:
    """Whether host path ``path`` is ``folder``, lies under it, or contains it."""
    return (path == folder or path.startswith(folder + "/") or folder.startswith(path + "/")
            or path == "/")


def _host_path_problems(spec: SpecView) -> list[tuple[str, str]]:
    """hostPath volumes that reach egpu's host folders (``EGPU_HOST_DIRS``): a pod that can
    write there can rewrite other shares' regions or plant links for the runtime hook."""
    problems: list[tuple[str, str]] = []
    for volume in spec.get("volumes", []):
        raw = volume.get("hostPath", {}).get("path", "")
        if not raw.startswith("/"):
            continue
        path = absolute_path(raw)
        if any(_covers(path, folder) for folder in EGPU_HOST_DIRS):
            problems.append((DENY_HOST_PATH, (
                f"volume {clip(volume.get('name', ''))!r}: hostPath.path={clip(raw)!r} is not "
                "allowed in a pod with an egpu share (it reaches egpu's node folders "
                f"{', '.join(EGPU_HOST_DIRS)}; the runtime hook mounts each container's own "
                "accounting folder and card regions itself); allowed: a hostPath outside "
                "them (or allowPrivileged: true in the egpu config)")))
    return problems


def policy_problems(pod: PodView, config: Config) -> list[tuple[str, str]]:
    """Reasons to refuse an egpu pod beyond its requests: ``[(DENY_*, message), ...]``.

    ``pod`` is ``check_pod(...).view`` (the typed fields egpu reads).

    - ``spec.nodeName`` set: the pod skips the scheduler, so no card is chosen or booked;
    - a privileged container with a share (unless ``config.allow_privileged``): it sees
      every card of the node, and no limit would hold; likewise a container with a share that
      adds SYS_ADMIN, SYS_PTRACE, SYS_MODULE or ALL, and a pod with a share and hostPID or
      hostIPC (they can unmount the preload or reach other processes' regions);
    - a hostPath volume at, under or above egpu's node folders (unless
      ``config.allow_privileged``): the pod could rewrite other shares' regions;
    - a volumeMount of a container with a share at or under a path the runtime hook mounts
      (``EGPU_CONTAINER_PATHS``), whatever the config: the hook's mount would cover it.
    """
    spec = pod.get("spec", {})
    problems: list[tuple[str, str]] = []
    node_name = spec.get("nodeName")
    if node_name:
        problems.append((DENY_NODE_NAME, (
            f"spec.nodeName={clip(node_name)!r} is not allowed for a pod with an egpu share "
            "(it bypasses card placement); allowed: no nodeName (use a nodeSelector or node "
            "affinity)")))
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        if has_share(container, config):
            problems += _mount_problems(container)
    if config.allow_privileged:
        return problems
    problems += _host_path_problems(spec)
    for field_name in ("hostPID", "hostIPC"):
        if spec.get(field_name) is True:
            problems.append((DENY_PRIVILEGED, (
                f"spec.{field_name}=true is not allowed for a pod with an egpu share (it "
                "reaches other pods' processes and shared memory, their accounting and "
                "their CUDA contexts); allowed: false (or allowPrivileged: true in the "
                "egpu config)")))
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        if has_share(container, config):
            problems += _container_problems(container)
    return problems


def _mount_problems(container: ContainerView) -> list[tuple[str, str]]:
    """volumeMounts of a container with a share at or under a path the runtime hook mounts."""
    problems: list[tuple[str, str]] = []
    for mount in container.get("volumeMounts", []):
        raw = mount.get("mountPath", "")
        path = absolute_path(raw) if raw.startswith("/") else raw
        reserved = [p for p in EGPU_CONTAINER_PATHS if path == p or path.startswith(p + "/")]
        if reserved:
            problems.append((DENY_RESERVED_PATH, (
                f"container {clip(container.get('name', ''))!r}: volumeMounts "
                f"{clip(mount.get('name', ''))!r} mountPath={clip(raw)!r} is not allowed with "
                f"an egpu share (egpu's runtime hook mounts {reserved[0]} there: the "
                "interposer, its preload list, the share's config and accounting); allowed: "
                f"a mountPath outside {', '.join(EGPU_CONTAINER_PATHS)}")))
    return problems


def _container_problems(container: ContainerView) -> list[tuple[str, str]]:
    """A container with a share that is privileged or adds a dangerous capability."""
    problems: list[tuple[str, str]] = []
    name = clip(container.get("name", ""))
    context = container.get("securityContext", {})
    if context.get("privileged") is True:
        problems.append((DENY_PRIVILEGED, (
            f"container {name!r}: "
            "securityContext.privileged=true is not allowed with an egpu share "
            "(a privileged container sees every card and escapes its limits); "
            "allowed: false (or allowPrivileged: true in the egpu config)")))
    for capability in _forbidden_capabilities(context.get("capabilities", {}).get("add", [])):
        problems.append((DENY_PRIVILEGED, (
            f"container {name!r}: securityContext.capabilities.add={clip(capability)!r} is "
            "not allowed with an egpu share (it can unmount the interposer or its "
            "read-only config, or reach other processes' memory or host files); allowed: any "
            f"capability but {', '.join(FORBIDDEN_CAPABILITIES)} (or allowPrivileged: "
            "true in the egpu config)")))
    return problems


def _forbidden_capabilities(added: list[str]) -> list[str]:
    """The entries of ``securityContext.capabilities.add`` that lift a share's limits, as
    written (``SYS_ADMIN``, ``CAP_SYS_ADMIN`` and ``sys_admin`` alike; ``ALL``)."""
    return [entry for entry in added
            if entry.strip().upper().removeprefix("CAP_") in FORBIDDEN_CAPABILITIES]


# --- Mutation ------------------------------------------------------------------------------


def _copied(parent: dict[str, Any], key: str, kind: type) -> Any:
    """A shallow copy of ``parent[key]`` put in its place (an empty ``kind`` when absent or
    of another type): what ``mutate_pod`` changes is always a copy, never the input."""
    value = parent.get(key)
    value = kind(value) if isinstance(value, kind) else kind()
    parent[key] = value
    return value


def _set_env(container: dict[str, Any], values: Mapping[str, str]) -> None:
    """Every ``env`` entry named like a key of ``values`` gets exactly that value; missing
    names are appended. A ``valueFrom`` is replaced by the literal value. Entries are
    replaced, never changed in place."""
    env = _copied(container, "env", list)
    for name, value in values.items():
        wanted = {"name": name, "value": value}
        found = False
        for index, entry in enumerate(env):
            if isinstance(entry, dict) and entry.get("name") == name:
                found = True
                if entry != wanted:
                    env[index] = dict(wanted)
        if not found:
            env.append(dict(wanted))


def _rename_aliases(container: dict[str, Any], aliases: Mapping[str, str]) -> None:
    """Rewrite alias resource names to their ``egpu.io/`` names in limits and requests
    (in copies of ``resources`` and of the maps it changes)."""
    if not isinstance(container.get("resources"), dict):
        return
    resources = _copied(container, "resources", dict)
    for key in ("limits", "requests"):
        values = resources.get(key)
        if not isinstance(values, dict) or not any(k in aliases for k in values):
            continue
        values = _copied(resources, key, dict)
        for written in [k for k in values if k in aliases]:
            values.setdefault(aliases[written], values[written])
            del values[written]


def _imply_card_count(container: dict[str, Any]) -> None:
    """Write ``egpu.io/gpu: 1`` where a share names memory or cores without a card count
    (CONTRACT.md: it means one card): the kubelet calls the device plugin's Allocate only for
    the extended resource egpu.io/gpu, and without Allocate the container gets no card and no
    share. In limits, and in requests where the API server's defaulting copied the limits."""
    if not isinstance(container.get("resources"), dict):
        return
    resources = _copied(container, "resources", dict)
    for key in ("limits", "requests"):
        values = resources.get(key)
        if isinstance(values, dict) and RES_GPU not in values \
                and any(n in values for n in (RES_MEMORY, RES_MEMORY_PERCENTAGE, RES_CORES)):
            _copied(resources, key, dict)[RES_GPU] = "1"


def informational_env(request: PodRequest) -> dict[str, str]:
    """The env the webhook writes on each container with a share: ``EGPU_PRIORITY``,
    ``EGPU_COMPUTE_POLICY``, ``EGPU_MEMORY_OVERSUBSCRIPTION``, the pod's resolved policies
    as the pod's processes may read them.

    Informational only (CONTRACT.md section 2: "for reading; the authoritative copy is the
    config file"): no part of egpu reads them back. The share is enforced from the record
    carried from placement (``egpu.io/allocation`` -> the allocation file ->
    ``/run/egpu/config.json``); the interposer reads these variables only where no config
    file exists (a raw node, ``egpu run``), so a container that changes them changes nothing
    (tests/runtime_hook/test_env_policies.py)."""
    return {
        ENV_PRIORITY: str(request.priority),
        ENV_COMPUTE_POLICY: str(request.compute_policy),
        ENV_MEMORY_OVERSUBSCRIPTION: "true" if request.memory_oversubscription else "false",
    }


def scheduler_warning(current: str, config: Config) -> str:
    """The warning for a pod that names another scheduler (kept as written)."""
    return (f"spec.schedulerName {clip(current)!r} kept: egpu shares are placed only by "
            f"{config.scheduler_name!r}; this pod's cards will not be booked by egpu")


def mutate_pod(
    pod: Mapping[str, Any], request: PodRequest, config: Config
) -> tuple[dict[str, Any], list[str]]:
    """The pod as egpu wants it, and warnings. ``pod`` is not changed: the objects on the way
    to a change are copied (copy on write), everything else is shared with ``pod``, so the
    cost does not grow with the fields egpu leaves alone (and no depth is walked).

    ``request`` is ``read_pod(pod, config).request`` (a valid egpu pod). Changes
    (CONTRACT.md section 2): ``spec.schedulerName`` (absent, empty or ``default-scheduler``
    becomes ``config.scheduler_name``; another name is kept with a warning); label
    ``egpu.io/priority``; env ``EGPU_PRIORITY``, ``EGPU_COMPUTE_POLICY``,
    ``EGPU_MEMORY_OVERSUBSCRIPTION`` on every container with a share (init containers and
    sidecars included; informational: ``informational_env``); alias resource names
    rewritten to ``egpu.io/`` names; ``egpu.io/gpu: 1`` written where memory or cores are
    asked without a card count. No volume: the runtime hook mounts each container's own
    accounting folder and card region files.
    """
    new = dict(pod)
    warnings: list[str] = []
    spec = _copied(new, "spec", dict)
    metadata = _copied(new, "metadata", dict)

    current = spec.get("schedulerName")
    if not current or current == KUBE_DEFAULT_SCHEDULER:
        spec["schedulerName"] = config.scheduler_name
    elif current != config.scheduler_name:
        warnings.append(scheduler_warning(str(current), config))

    labels = _copied(metadata, "labels", dict)
    labels[LABEL_PRIORITY] = str(request.priority)

    env = informational_env(request)
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if isinstance(items, list):
            spec[key] = [_mutated_container(c, env, config)
                         if isinstance(c, dict) and has_share(c, config) else c for c in items]
    return new, warnings


def _mutated_container(container: dict[str, Any], env: Mapping[str, str],
                       config: Config) -> dict[str, Any]:
    """A copy of a container with a share: alias names rewritten, the implied card count
    written, egpu's env set."""
    new = dict(container)
    _rename_aliases(new, config.resource_aliases)
    _imply_card_count(new)
    _set_env(new, env)
    return new


def mutate_pod_dra(
    pod: Mapping[str, Any], request: PodRequest, plan: ClaimPlan, config: Config,
    claim: str,
) -> tuple[dict[str, Any], list[str]]:
    """The pod as egpu wants it in DRA mode, and warnings; copy on write as ``mutate_pod``.

    ``plan`` is ``plan_claims(request, ...)``, ``claim`` the name of the pod's claim of it.
    Changes: ``spec.resourceClaims`` gets ``{name: egpu, resourceClaimName: <claim>}``; each
    container with a share gets ``resources.claims`` entries ``{name: egpu, request: <r>}``
    for its requests, loses its egpu.io and alias resources from limits and requests (an
    empty map goes), and gets egpu's env; label ``egpu.io/priority``.
    ``spec.schedulerName`` stays (the kube-scheduler allocates claims). Warnings:
    ``egpu.io/gpu-policy`` and ``egpu.io/node-policy`` are not applied (the kube-scheduler
    scores nodes itself).
    """
    new = dict(pod)
    spec = _copied(new, "spec", dict)
    metadata = _copied(new, "metadata", dict)
    labels = _copied(metadata, "labels", dict)
    labels[LABEL_PRIORITY] = str(request.priority)
    claims = _copied(spec, "resourceClaims", list)
    claims.append({"name": DRA_POD_CLAIM, "resourceClaimName": claim})
    env = informational_env(request)
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if isinstance(items, list):
            spec[key] = [_claiming_container(c, env, config, plan)
                         if isinstance(c, dict) and has_share(c, config) else c for c in items]
    annotations = KubePod(pod).annotations
    warnings = [f"pod annotation {key} is not applied in DRA mode (the kube-scheduler chooses "
                "the node and the card)" for key in (ANN_GPU_POLICY, ANN_NODE_POLICY)
                if key in annotations]
    return new, warnings


def _claiming_container(container: dict[str, Any], env: Mapping[str, str], config: Config,
                        plan: ClaimPlan) -> dict[str, Any]:
    """A copy of a container with a share, pointed at its requests of the pod's claim."""
    new = dict(container)
    resources = _copied(new, "resources", dict)
    ours = {*EGPU_RESOURCES, *config.resource_aliases}
    for key in ("limits", "requests"):
        values = resources.get(key)
        if isinstance(values, dict) and any(k in ours for k in values):
            kept = {k: v for k, v in values.items() if k not in ours}
            if kept:
                resources[key] = kept
            else:
                del resources[key]
    claims = _copied(resources, "claims", list)
    for name in plan.requests_of(str(container.get("name", ""))):
        entry = {"name": DRA_POD_CLAIM, "request": name}
        if entry not in claims:
            claims.append(entry)
    _set_env(new, env)
    return new


def make_patch(old: Any, new: Any) -> list[dict[str, Any]]:
    """JSON Patch operations (RFC 6902) that turn ``old`` into ``new`` (``jsonpatch``), with
    keys escaped as JSON Pointers (``egpu.io/priority`` -> ``egpu.io~1priority``)."""
    ops: list[dict[str, Any]] = jsonpatch.make_patch(old, new).patch
    return ops


# What mutate_pod may change, relative to a parent object: (parent path, member names).
_POD_SCOPES: Final = ((("metadata",), ("labels",)),
                      (("spec",), ("schedulerName", "resourceClaims")))
_CONTAINER_MEMBERS: Final = ("env", "resources")


def _pointer(parts: tuple[str | int, ...]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _diff_member(old: Any, new: Any, path: str) -> list[dict[str, Any]]:
    """Ops turning member value ``old`` (``_ABSENT``: no such member) into ``new`` at ``path``.

    Plain cases are written directly: a new member (one ``add``), a scalar (``replace``),
    items appended to a list (one ``add`` each). Anything else (maps, lists changed in place,
    renamed keys) goes through ``jsonpatch.make_patch``, which escapes keys as JSON Pointers.
    """
    if old is _ABSENT:
        return [{"op": "add", "path": path, "value": new}]
    if not isinstance(old, dict | list) and not isinstance(new, dict | list):
        return [{"op": "replace", "path": path, "value": new}]
    if isinstance(old, list) and isinstance(new, list) and new[:len(old)] == old:
        return [{"op": "add", "path": f"{path}/{index}", "value": new[index]}
                for index in range(len(old), len(new))]
    ops = make_patch(old, new)
    for op in ops:
        op["path"] = path + op["path"]
        if "from" in op:
            op["from"] = path + op["from"]
    return ops


_ABSENT: Final = object()


def _diff_members(old: Any, new: Any, parent: tuple[str | int, ...],
                  members: tuple[str, ...]) -> list[dict[str, Any]]:
    """The ops for the named members of two parent objects, as ops on the pod."""
    prefix = _pointer(parent)
    if not isinstance(old, dict):  # the parent itself is new (or was not an object)
        return [] if old == new else [{"op": "add", "path": prefix, "value": new}]
    ops: list[dict[str, Any]] = []
    for member in members:
        before, after = old.get(member, _ABSENT), new.get(member, _ABSENT)
        if after is _ABSENT or before == after:
            continue  # mutate_pod never removes a member
        ops += _diff_member(before, after, prefix + _pointer((member,)))
    return ops


def pod_patch(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch from ``old`` to ``new = mutate_pod(old, ...)[0]``.

    The same as ``make_patch(old, new)`` in effect, but diffs only what ``mutate_pod`` may
    change (``metadata.labels``; ``spec.schedulerName``, ``spec.resourceClaims``; each
    container's ``env``,
    ``resources``), each member on its own: a whole-pod diff costs
    ~10x more time, and never replaces a container wholesale this way either.
    """
    ops: list[dict[str, Any]] = []
    for parent, members in _POD_SCOPES:
        ops += _diff_members(old.get(parent[0]), new[parent[0]], parent, members)
    old_spec, new_spec = old.get("spec"), new["spec"]
    if not isinstance(old_spec, dict):
        return ops
    for kind in ("initContainers", "containers"):
        old_list, new_list = old_spec.get(kind), new_spec.get(kind)
        if not isinstance(old_list, list) or not isinstance(new_list, list):
            continue
        for index, (before, after) in enumerate(zip(old_list, new_list, strict=True)):
            if isinstance(before, dict) and before != after:
                ops += _diff_members(before, after, ("spec", kind, index), _CONTAINER_MEMBERS)
    return ops


# --- Decisions -----------------------------------------------------------------------------


def decide_pod(pod: Mapping[str, Any], config: Config, namespace: str = "",
               card_sizes: CardSizes = no_card_sizes, request_uid: str = "") -> Decision:
    """The decision for creating ``pod`` (a Pod as JSON) in ``namespace``; see the module
    docstring. ``card_sizes`` is read only in DRA mode, for a memory percentage;
    ``request_uid`` (the AdmissionReview's ``request.uid``) names the pod's claim there."""
    checked = check_pod(pod)
    reading = read_checked(checked, config)
    preset = ANN_ALLOCATION in checked.metadata.get("annotations", {})
    if not reading.is_egpu_pod and not preset:
        return ALLOW
    messages = [error.message for error in reading.errors]
    denials = [DENY_INVALID_REQUEST] if reading.errors else []
    problems = policy_problems(checked.view, config) if reading.is_egpu_pod else []
    if preset:
        problems.insert(0, (DENY_ALLOCATION, (
            f"pod annotation {ANN_ALLOCATION} is not allowed at creation: it is set by the "
            "egpu scheduler at bind time; remove it")))
    for kind, message in problems:
        denials.append(kind)
        messages.append(message)
    if messages:
        return _denied(messages, denials, invalid=bool(reading.errors))
    assert reading.request is not None
    request = reading.request
    if config.allocation_mode_for(namespace, request.allocation_mode) == ALLOCATION_MODE_DRA:
        return _decide_dra(pod, request, config, namespace, card_sizes, request_uid)
    new, warnings = mutate_pod(pod, request, config)
    return Decision(allowed=True, patch=pod_patch(dict(pod), new),
                    warnings=tuple(warnings))


def _denied(messages: list[str], denials: list[str], invalid: bool) -> Decision:
    return Decision(
        allowed=False,
        code=400 if invalid else 403,
        reason="BadRequest" if invalid else "Forbidden",
        message=_joined(messages),
        denials=tuple(dict.fromkeys(denials)),
    )


def _decide_dra(pod: Mapping[str, Any], request: PodRequest, config: Config, namespace: str,
                card_sizes: CardSizes, request_uid: str) -> Decision:
    """DRA mode: the claim plan, the patch and the claim to create (or a denial)."""
    taken = [entry for entry in KubePod(pod).resource_claims
             if entry.get("name") == DRA_POD_CLAIM]
    if taken:
        return _denied([
            f"spec.resourceClaims[].name={DRA_POD_CLAIM!r} is not allowed in a pod with an egpu "
            f"share in DRA mode (egpu names the share's claim {DRA_POD_CLAIM!r}); allowed: "
            "another name for your own claim"], [DENY_CLAIM], invalid=True)
    try:
        sizes = card_sizes() if needs_card_sizes(request) else ()
        plan = plan_claims(request, sizes)
    except ClaimPlanError as exc:
        return _denied([str(exc)], [DENY_CLAIM], invalid=True)
    metadata = KubePod(pod).metadata
    name = claim_name(str(metadata.get("name") or ""), str(metadata.get("generateName") or ""),
                      request_uid)
    new, warnings = mutate_pod_dra(pod, request, plan, config, name)
    return Decision(allowed=True, patch=pod_patch(dict(pod), new), warnings=tuple(warnings),
                    claims=(plan.claim(namespace, name),))


def _joined(messages: list[str]) -> str:
    """The messages joined with "; ": at most MAX_PROBLEMS_SHOWN, then how many more."""
    shown = messages[:MAX_PROBLEMS_SHOWN]
    if len(messages) > MAX_PROBLEMS_SHOWN:
        shown.append(f"and {len(messages) - MAX_PROBLEMS_SHOWN} more problems")
    return "; ".join(shown)


_KIND_NAMES: dict[type, str] = {dict: "an object", str: "a string"}


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind):
        expected = _KIND_NAMES.get(kind, kind.__name__)
        raise InvalidReview(f"{where}{key}: expected {expected}, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = "missing" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def decide(admission_review: Any, config: Config,
           card_sizes: CardSizes = no_card_sizes) -> tuple[str, str, Decision]:
    """Check the AdmissionReview's shape and decide: ``(apiVersion, uid, Decision)``.
    ``card_sizes``: the fleet's card sizes, for DRA mode (see ``decide_pod``).

    Raises InvalidReview naming the first field that is wrong (or an object nested deeper
    than Python's recursion limit).
    """
    if not isinstance(admission_review, dict):
        raise InvalidReview("body: expected an AdmissionReview object, "
                            f"got {_short(admission_review)}")
    api_version = admission_review.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise InvalidReview(f"apiVersion: {_short(api_version)} is not supported; "
                            f"allowed: {', '.join(API_VERSIONS)}")
    if admission_review.get("kind") != KIND:
        raise InvalidReview(f"kind: {_short(admission_review.get('kind'))} is not {KIND}")
    request = _field(admission_review, "request", dict, "")
    uid = _field(request, "uid", str, "request.")
    if not uid:
        raise InvalidReview("request.uid: empty")
    operation = _field(request, "operation", str, "request.")
    kind = _field(request, "kind", dict, "request.")
    sub_resource = request.get("subResource") or ""
    if kind.get("group") or kind.get("kind") != "Pod" or sub_resource:
        return api_version, uid, ALLOW  # not a pod: not ours to judge
    if operation != "CREATE":
        return api_version, uid, ALLOW
    pod = _field(request, "object", dict, "request.")
    namespace = _namespace(request, pod)
    if namespace in config.ignored_namespaces:
        return api_version, uid, ALLOW
    try:
        return api_version, uid, decide_pod(pod, config, namespace, card_sizes, uid)
    except RecursionError:  # no Pod nests this deep; Python's stack cannot walk it
        raise InvalidReview("request.object: nested too deeply") from None


def _namespace(request: Mapping[str, Any], pod: Mapping[str, Any]) -> str:
    """The pod's namespace: ``request.namespace``, else ``metadata.namespace``, else ""."""
    namespace = request.get("namespace")
    if isinstance(namespace, str) and namespace:
        return namespace
    return KubePod(pod).namespace


def response_for(api_version: str, uid: str, decision: Decision) -> AdmissionReview:
    """The AdmissionReview answer: ``uid`` echoed; ``patch`` (base64 of the JSON Patch text)
    and ``patchType`` only with a patch; ``warnings`` only when there are some."""
    response: AdmissionResponse = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        status: Status = {"code": decision.code, "message": decision.message}
        if decision.reason:
            status["reason"] = decision.reason
        response["status"] = status
    if decision.patch:
        text = json.dumps(decision.patch, separators=(",", ":"))
        response["patch"] = base64.b64encode(text.encode("utf-8")).decode("ascii")
        response["patchType"] = PATCH_TYPE_JSON
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": api_version or API_VERSION_V1, "kind": KIND, "response": response}


def review(admission_review: Any, config: Config,
           card_sizes: CardSizes = no_card_sizes) -> AdmissionReview:
    """Answer one AdmissionReview (parsed JSON). Raises InvalidReview for malformed input.
    Creates nothing: in DRA mode the answer refers to a template the caller creates
    (``decide`` returns it)."""
    api_version, uid, decision = decide(admission_review, config, card_sizes)
    return response_for(api_version, uid, decision)
