"""Read a pod's egpu requests: which containers get a share, of what, under which policies.

``read_pod(pod, config)`` takes a pod (or pod template) as the Kubernetes JSON object (a dict
with ``metadata`` and ``spec``) and returns a ``PodReading``: either a normalized
``PodRequest`` or a list of errors, each naming the container (or the pod), the resource or
annotation, the value given and what is allowed. A pod without any egpu resource is not an
egpu pod (``reading.request is None`` and no errors): egpu never blocks such pods, whatever
annotations they carry.

The pod is read through ``egpu.podshape.check_pod`` (``read_checked`` takes its result): a
field egpu reads that has the wrong JSON type (``spec.containers: 5``, labels as a list, ...)
is a ``ShapeError`` naming its JSON path. In an egpu pod every such error is reported (the
pod is invalid); a pod is an egpu pod when a well-formed container asks for an egpu resource
or alias, or a malformed field on the way to the resources mentions one
(``CheckedPod.mentions``: fail closed). Other malformed pods are not egpu pods (the API
server refuses them itself).

Rules (../shared/CONTRACT.md section 1):
- resources go in ``limits``; ``requests``, if given, must equal ``limits``;
- gpu-memory, gpu-memory-percentage or gpu-cores without ``egpu.io/gpu`` means 1 card;
- no memory given: 100% of the card; no cores given: 0 (nothing booked, idle compute only);
- aliases (config) mean the same as the egpu.io names; one container cannot mix name sets;
- init containers and sidecars (init containers with restartPolicy Always) count, with
  Kubernetes' effective-request rule applied card by card at placement (see ``ContainerKind``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, TypeVar

from egpu.config import Config
from egpu.contract import (
    ANN_ALLOCATION_MODE,
    ANN_COMPUTE_POLICY,
    ANN_GPU_POLICY,
    ANN_MEMORY_OVERSUBSCRIPTION,
    ANN_NODE_POLICY,
    ANN_NOUSE_GPU_TYPE,
    ANN_NOUSE_GPU_UUID,
    ANN_PRIORITY,
    ANN_USE_GPU_TYPE,
    ANN_USE_GPU_UUID,
    BOOLEANS,
    EGPU_RESOURCES,
    MAX_GPUS_PER_CONTAINER,
    NATIVE_NVIDIA_GPU,
    RES_CORES,
    RES_GPU,
    RES_MEMORY,
    RES_MEMORY_PERCENTAGE,
)
from egpu.podshape import (
    CheckedPod,
    ContainerView,
    ShapeError,
    SpecView,
    check_pod,
    clip,
    shown,
)
from egpu.policies import AllocationMode, ComputePolicy, PlacementPolicy, Priority

_Policy = TypeVar("_Policy", bound=StrEnum)
_ALLOWED: dict[type[StrEnum], tuple[str, ...]] = {
    kind: tuple(kind) for kind in (Priority, ComputePolicy, PlacementPolicy, AllocationMode)}


class ContainerKind(StrEnum):
    """Where a container sits in the pod; decides how its share adds up with the others.

    APP and SIDECAR shares run together and are summed per card; each INIT share runs alone
    (with the sidecars declared before it), so a card books max(init, sum of app + sidecars).
    """

    APP = "container"
    INIT = "init"
    SIDECAR = "sidecar"


@dataclass(frozen=True)
class RequestError:
    """One mistake in a pod's egpu requests. ``container`` is "" for pod-level annotations."""

    container: str
    field: str
    value: str
    allowed: str
    reason: str = ""

    @property
    def message(self) -> str:
        """A sentence a pod author can act on (the name and the value cut to 60 characters)."""
        where = (f"container {clip(self.container)!r}: " if self.container
                 else "pod annotation ")
        reason = f" ({self.reason})" if self.reason else ""
        return (f"{where}{self.field}={clip(self.value)!r} is not allowed{reason}; "
                f"allowed: {self.allowed}")


Problem = RequestError | ShapeError  # one mistake in a pod; both have ``message``


@dataclass(frozen=True)
class Share:
    """What one container asks of each of its cards.

    gpus: cards (1..16). memory_mib: MiB per card, or None when given as a percentage.
    memory_percentage: % of each card's memory (100 when no memory was given), or None when
    given in MiB. cores: % of each card's compute, 0 = nothing booked.
    """

    gpus: int
    memory_mib: int | None
    memory_percentage: int | None
    cores: int

    def memory_on(self, card_memory_mib: int) -> int:
        """MiB this share books on a card of ``card_memory_mib`` MiB (percentages round down)."""
        if self.memory_mib is not None:
            return self.memory_mib
        assert self.memory_percentage is not None
        return max(1, card_memory_mib * self.memory_percentage // 100)

    def describe(self) -> str:
        """Short human text, e.g. ``1 card x (24000 MiB, 50% cores)``."""
        memory = (f"{self.memory_mib} MiB" if self.memory_mib is not None
                  else f"{self.memory_percentage}% memory")
        cores = f"{self.cores}% cores" if self.cores else "no cores booked"
        cards = "card" if self.gpus == 1 else "cards"
        return f"{self.gpus} {cards} x ({memory}, {cores})"


@dataclass(frozen=True)
class ContainerRequest:
    """A container with a share: its name, kind, share, and whether it is privileged."""

    name: str
    kind: ContainerKind
    share: Share
    privileged: bool = False
    uses_aliases: bool = False


@dataclass(frozen=True)
class PodRequest:
    """A valid egpu pod: its shares and its resolved policies and card filters (the
    policies as ``egpu.policies`` enums, each equal to its annotation string)."""

    containers: tuple[ContainerRequest, ...]
    priority: Priority
    compute_policy: ComputePolicy
    memory_oversubscription: bool
    gpu_policy: PlacementPolicy
    node_policy: PlacementPolicy
    use_gpu_types: tuple[str, ...] = ()
    nouse_gpu_types: tuple[str, ...] = ()
    use_gpu_uuids: tuple[str, ...] = ()
    nouse_gpu_uuids: tuple[str, ...] = ()
    # egpu.io/allocation-mode: extender | dra; None: the namespace's or the config's
    allocation_mode: AllocationMode | None = None

    def container(self, name: str) -> ContainerRequest | None:
        """The request of container ``name``, or None when it has no share."""
        return next((c for c in self.containers if c.name == name), None)


@dataclass(frozen=True)
class PodReading:
    """What egpu makes of a pod: ``request`` (None: not an egpu pod, or invalid) and errors."""

    request: PodRequest | None
    errors: tuple[Problem, ...] = field(default_factory=tuple)

    @property
    def is_egpu_pod(self) -> bool:
        """True when any container asks for an egpu resource (valid or not)."""
        return self.request is not None or bool(self.errors)


_RANGES: dict[str, tuple[int, int | None]] = {
    RES_GPU: (1, MAX_GPUS_PER_CONTAINER),
    RES_MEMORY: (1, None),
    RES_MEMORY_PERCENTAGE: (1, 100),
    RES_CORES: (1, 100),
}
# A Kubernetes quantity without a binary suffix: the API server stores "3000" as "3k" (its
# canonical form), so decimal SI suffixes and exponents must read as the whole numbers they
# are. Binary suffixes (Ki, Mi, Gi, ...) stay refused: "24Gi" MiB is never what was meant.
_DECIMAL_QUANTITY = re.compile(r"^\+?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                               r"(?:(?P<suffix>[kMGTPE])|[eE](?P<exp>[+-]?[0-9]{1,2}))?$")
MAX_QUANTITY_CHARS = 40  # longer quantities are refused ("not a whole number")
_QUANTITY_BOUND = 10**MAX_QUANTITY_CHARS
_SI_EXPONENTS = {"k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def _allowed_text(resource: str) -> str:
    low, high = _RANGES[resource]
    units = {RES_MEMORY: " (MiB)", RES_MEMORY_PERCENTAGE: " (%)", RES_CORES: " (%)"}
    unit = units.get(resource, "")
    return f"an integer {low}..{high}{unit}" if high is not None else f"an integer >= {low}{unit}"


def _parse_quantity(raw: Any) -> int | None:
    """A whole-number quantity, or None for anything else.

    Accepts ints, integral floats and strings in Kubernetes quantity syntax with a decimal
    SI suffix or exponent ("24000", "24k", "3e3", "+5"), as long as the value is a whole
    number; refuses fractions ("1.5", "500m"), binary suffixes ("24Gi"), anything longer than
    MAX_QUANTITY_CHARS characters (or a number of as many digits) and anything else.
    """
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if -_QUANTITY_BOUND < raw < _QUANTITY_BOUND else None
    if isinstance(raw, float) and raw.is_integer():
        return int(raw) if abs(raw) < _QUANTITY_BOUND else None
    if not isinstance(raw, str) or len(raw) > MAX_QUANTITY_CHARS:
        return None  # a 5000-digit string would make an int too long to print
    match = _DECIMAL_QUANTITY.match(raw.strip())
    if match is None:
        return None
    exponent = _SI_EXPONENTS.get(match["suffix"] or "", 0) + int(match["exp"] or 0)
    value = Decimal(match["number"]).scaleb(exponent)
    return int(value) if value == value.to_integral_value() else None


def _written(raw: Any) -> str:
    """``raw`` as text for a message, at most MAX_QUANTITY_CHARS characters (then "...");
    never fails (an int too long for ``str`` is described by its size, a list or an object
    by ``shown``)."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw.bit_length() > 4 * 40:
        return f"<an integer of about {int(raw.bit_length() * 0.30103) + 1} digits>"
    if not isinstance(raw, str | int | float | None):
        return shown(raw)
    return clip(str(raw), MAX_QUANTITY_CHARS)


def _shown(raw: Any) -> str:
    """The value as the author wrote it: the API server stores 4000 as "4k", so show 4000."""
    value = _parse_quantity(raw)
    return str(value) if value is not None else _written(raw)


EGPU_RESOURCE_PREFIX = "egpu.io/"  # every resource name under it is egpu's


def _container_resources(
    container: ContainerView, aliases: Mapping[str, str]
) -> tuple[dict[str, tuple[str, Any]], list[RequestError]]:
    """Map egpu resource -> (name as written, value) from limits; check requests and name sets."""
    name = container.get("name", "")
    resources = container.get("resources", {})
    limits = resources.get("limits", {})
    requests = resources.get("requests", {})
    errors: list[RequestError] = []
    found: dict[str, tuple[str, Any]] = {}
    name_sets: set[str] = set()
    for written in sorted(set(limits) | set(requests)):
        canonical = written if written in EGPU_RESOURCES else aliases.get(written)
        if canonical is None:
            if written.startswith(EGPU_RESOURCE_PREFIX):  # a misspelled share: never Pending
                errors.append(RequestError(  # silently for a resource no node offers
                    name, written, _written(limits.get(written, requests.get(written))),
                    f"one of {', '.join(EGPU_RESOURCES)}", "not an egpu resource"))
            continue
        name_sets.add("egpu" if written in EGPU_RESOURCES else "alias")
        if written not in limits:
            errors.append(RequestError(
                name, written, _written(requests[written]), "the same value in resources.limits",
                "extended resources are set in limits; requests alone are not enough"))
            continue
        if written in requests and not _same(requests[written], limits[written]):
            errors.append(RequestError(
                name, f"{written} (requests)", _written(requests[written]),
                f"the limits value {_written(limits[written])}", "requests must equal limits"))
            continue
        if canonical in found:
            errors.append(RequestError(
                name, written, _written(limits[written]),
                f"one of {found[canonical][0]} or {written}", "two names for one resource"))
            continue
        found[canonical] = (written, limits[written])
    if len(name_sets) > 1:
        written_names = ", ".join(sorted(w for w, _ in found.values()))
        errors.append(RequestError(
            name, "resources", written_names, "one name set: all egpu.io/ or all aliases",
            "the container mixes egpu.io names with alias names"))
    if found and (NATIVE_NVIDIA_GPU in limits or NATIVE_NVIDIA_GPU in requests):
        errors.append(RequestError(
            name, NATIVE_NVIDIA_GPU,
            _written(limits.get(NATIVE_NVIDIA_GPU, requests.get(NATIVE_NVIDIA_GPU))),
            "either nvidia.com/gpu (whole cards) or egpu.io resources (shares), not both"))
    return found, errors


def _same(a: Any, b: Any) -> bool:
    """Whether two quantities are equal: by value where both parse (the API server keeps each
    quantity's notation, so ``2e3`` and ``2k`` reach the webhook as written, and Kubernetes
    holds them equal), else by text (``3000`` and ``"3000"`` are)."""
    left, right = _parse_quantity(a), _parse_quantity(b)
    if left is not None and right is not None:
        return left == right
    return _text(a) == _text(b)


def _text(value: Any) -> str:
    """``str(value)``; hex for an int too long for ``str`` (over 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 10_000:
        return hex(value)
    return str(value)


def _share(name: str, found: dict[str, tuple[str, Any]]) -> tuple[Share | None, list[RequestError]]:
    errors: list[RequestError] = []
    values: dict[str, int] = {}
    for resource, (written, raw) in found.items():
        value = _parse_quantity(raw)
        low, high = _RANGES[resource]
        if value is None:
            hint = " (a plain number of MiB: 24Gi is 24576)" if resource == RES_MEMORY else ""
            if len(_written(raw)) > MAX_QUANTITY_CHARS or _written(raw).startswith("<"):
                hint = f" (longer than {MAX_QUANTITY_CHARS} characters)"
            errors.append(RequestError(name, written, _written(raw), _allowed_text(resource),
                                       f"not a whole number{hint}"))
        elif value < low or (high is not None and value > high):
            errors.append(RequestError(name, written, _shown(raw), _allowed_text(resource),
                                       "out of range"))
        else:
            values[resource] = value
    if RES_MEMORY in found and RES_MEMORY_PERCENTAGE in found:
        memory_name, memory_raw = found[RES_MEMORY]
        pct_name, pct_raw = found[RES_MEMORY_PERCENTAGE]
        errors.append(RequestError(
            name, pct_name, _shown(pct_raw),
            f"{memory_name} alone (MiB) or {pct_name} alone (% of the card), not both",
            f"{memory_name}={_shown(memory_raw)} is given too"))
    if errors:
        return None, errors
    memory_mib = values.get(RES_MEMORY)
    percentage = values.get(RES_MEMORY_PERCENTAGE)
    if memory_mib is None and percentage is None:
        percentage = 100
    return Share(
        gpus=values.get(RES_GPU, 1),
        memory_mib=memory_mib,
        memory_percentage=percentage,
        cores=values.get(RES_CORES, 0),
    ), []


def _containers(spec: SpecView) -> list[tuple[ContainerView, ContainerKind]]:
    """Init containers (sidecars: restartPolicy Always), then app containers, in pod order."""
    out: list[tuple[ContainerView, ContainerKind]] = []
    for c in spec.get("initContainers", []):
        sidecar = c.get("restartPolicy") == "Always"
        out.append((c, ContainerKind.SIDECAR if sidecar else ContainerKind.INIT))
    out.extend((c, ContainerKind.APP) for c in spec.get("containers", []))
    return out


def _annotation_choice(
    annotations: Mapping[str, str], key: str, allowed: tuple[str, ...], default: str,
    errors: list[Problem],
) -> str:
    if key not in annotations:
        return default
    value = annotations[key]
    if value not in allowed:
        errors.append(RequestError("", key, value, ", ".join(allowed)))
        return default
    return value


def _annotation_policy(
    annotations: Mapping[str, str], key: str, kind: type[_Policy], default: _Policy,
    errors: list[Problem],
) -> _Policy:
    """The annotation ``key`` as a member of the policy enum ``kind`` (``default`` when absent
    or not allowed: then an error names the allowed strings)."""
    if key not in annotations:
        return default
    return kind(_annotation_choice(annotations, key, _ALLOWED[kind], default, errors))


def _annotation_list(
    annotations: Mapping[str, str], key: str, errors: list[Problem]
) -> tuple[str, ...]:
    if key not in annotations:
        return ()
    raw = annotations[key]
    items = tuple(part.strip() for part in raw.split(","))
    if not all(items):
        errors.append(RequestError("", key, raw, "a comma-separated list of non-empty names",
                                   "an empty entry"))
        return ()
    return items


def resource_names(config: Config) -> tuple[str, ...]:
    """Every resource name that asks for a share: the egpu.io names and the aliases."""
    return (*EGPU_RESOURCES, *config.resource_aliases)


def read_pod(pod: Any, config: Config | None = None) -> PodReading:
    """Read the egpu requests of ``pod`` (a Pod or pod template as a JSON-like dict; any
    value is accepted). Returns PodReading(request=None) for pods without egpu resources;
    never raises on malformed input (see the module docstring)."""
    return read_checked(check_pod(pod), config)


def read_checked(checked: CheckedPod, config: Config | None = None) -> PodReading:
    """``read_pod`` for a pod already checked by ``egpu.podshape.check_pod``."""
    config = config or Config()
    spec = checked.spec
    annotations = checked.metadata.get("annotations", {})
    errors: list[Problem] = []
    containers: list[ContainerRequest] = []
    seen_any = False
    for container, kind in _containers(spec):
        name = container.get("name", "")
        found, resource_errors = _container_resources(container, config.resource_aliases)
        if not found and not resource_errors:
            continue
        seen_any = True
        errors.extend(resource_errors)
        if resource_errors:
            continue
        share, share_errors = _share(name, found)
        errors.extend(share_errors)
        if share is not None:
            uses_aliases = any(w not in EGPU_RESOURCES for w, _ in found.values())
            privileged = container.get("securityContext", {}).get("privileged", False)
            containers.append(ContainerRequest(name, kind, share, privileged, uses_aliases))
    if not seen_any and not checked.mentions(resource_names(config)):
        return PodReading(None)  # not an egpu pod, however malformed
    errors[:0] = checked.errors

    default_priority = config.priority_classes.get(
        spec.get("priorityClassName", ""), config.defaults.priority)
    priority = _annotation_policy(annotations, ANN_PRIORITY, Priority, default_priority, errors)
    policy = _annotation_policy(annotations, ANN_COMPUTE_POLICY, ComputePolicy,
                                config.defaults.compute_policy, errors)
    oversub = _annotation_choice(annotations, ANN_MEMORY_OVERSUBSCRIPTION, BOOLEANS, "false",
                                 errors)
    gpu_policy = _annotation_policy(annotations, ANN_GPU_POLICY, PlacementPolicy,
                                    config.defaults.gpu_policy, errors)
    node_policy = _annotation_policy(annotations, ANN_NODE_POLICY, PlacementPolicy,
                                     config.defaults.node_policy, errors)
    allocation_mode = (_annotation_policy(annotations, ANN_ALLOCATION_MODE, AllocationMode,
                                          AllocationMode.EXTENDER, errors)
                       if ANN_ALLOCATION_MODE in annotations else None)
    filters = {key: _annotation_list(annotations, key, errors) for key in (
        ANN_USE_GPU_TYPE, ANN_NOUSE_GPU_TYPE, ANN_USE_GPU_UUID, ANN_NOUSE_GPU_UUID)}
    if errors or not containers:
        return PodReading(None, tuple(errors))
    return PodReading(PodRequest(
        containers=tuple(containers),
        priority=priority,
        compute_policy=policy,
        memory_oversubscription=oversub == "true",
        gpu_policy=gpu_policy,
        node_policy=node_policy,
        use_gpu_types=filters[ANN_USE_GPU_TYPE],
        nouse_gpu_types=filters[ANN_NOUSE_GPU_TYPE],
        use_gpu_uuids=filters[ANN_USE_GPU_UUID],
        nouse_gpu_uuids=filters[ANN_NOUSE_GPU_UUID],
        allocation_mode=allocation_mode,
    ))


def model_tokens(model: str) -> set[str]:
    """Lower-case tokens of a card model: the whole name and its parts split on ' ', '-', '_'."""
    lowered = model.lower()
    return {lowered, *(t for t in re.split(r"[ \-_]+", lowered) if t)}


def model_matches(model: str, names: tuple[str, ...]) -> bool:
    """True when any of ``names`` equals the model or one of its tokens, case-insensitive.

    ``A10`` matches ``NVIDIA A10`` and never ``NVIDIA A100-SXM4-80GB``.
    """
    tokens = model_tokens(model)
    return any(name.lower() in tokens for name in names)
