"""The shape of the pod fields egpu reads: one typed check at the parser's entry.

Kubernetes types every field of a Pod, and the API server refuses a pod whose JSON does not
fit before any webhook sees it. egpu's readers also run on other input (``egpu webhook FILE``,
``egpu explain``, the egpu scheduler, anything that POSTs to the webhook), so they read a
pod only through ``check_pod(pod)``, which walks the fields egpu reads (``POD`` below, nothing
else) and returns a ``CheckedPod``:

- ``view``: those fields, each of its Kubernetes JSON type (``PodView``); a malformed field is
  left out; ``null`` reads as the API server decodes it: absent for an object's field, ""
  for a label or annotation value, kept (for the quantity check) in limits and requests;
- ``errors``: one ``ShapeError`` per malformed field, naming its JSON path from the pod
  (``spec.containers[0].resources.limits``), the value as written (at most ``SHOWN_CHARS``
  characters) with its JSON type, and what is allowed.

Fields egpu does not read (ports, probes, affinity, ...) are neither walked nor copied: their
size and depth cost nothing, and they are left to the API server's own validation.
``check_pod`` never raises, whatever ``pod`` is (any Python value, YAML's included).

JSON decoders in egpu pass ``parse_int=decode_int``: an integer literal of more than
``MAX_INTEGER_DIGITS`` digits becomes a ``LongNumber`` (its digits) instead of an error
(Python refuses to convert more than 4300 digits, and converting is quadratic).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict, cast

SHOWN_CHARS: Final = 60  # a value in a message: at most this many characters, then "..."
MAX_INTEGER_DIGITS: Final = 1000  # longer integer literals decode as LongNumber
MAX_SCANNED_VALUES: Final = 100_000  # mentions(): values looked at before failing closed


class LongNumber(str):
    """An integer literal too long to convert (``decode_int``), kept as the digits written."""

    __slots__ = ()


def decode_int(text: str) -> int | LongNumber:
    """``json.loads(..., parse_int=decode_int)``: ``int(text)``, or a ``LongNumber`` for a
    literal of more than MAX_INTEGER_DIGITS characters. Never raises."""
    return int(text) if len(text) <= MAX_INTEGER_DIGITS else LongNumber(text)


# --- The view: the fields egpu reads, typed ------------------------------------------------


class ResourcesView(TypedDict, total=False):
    """``container.resources``: resource name -> quantity (str, int, float; or bool/None,
    which the quantity parser refuses)."""

    limits: dict[str, Any]
    requests: dict[str, Any]


class CapabilitiesView(TypedDict, total=False):
    """``securityContext.capabilities``."""

    add: list[str]


class SecurityContextView(TypedDict, total=False):
    """``container.securityContext``."""

    privileged: bool
    capabilities: CapabilitiesView


class EnvVarView(TypedDict, total=False):
    """One ``container.env`` entry (``valueFrom`` is not read)."""

    name: str
    value: str


class VolumeMountView(TypedDict, total=False):
    """One ``container.volumeMounts`` entry."""

    name: str
    mountPath: str


class ContainerView(TypedDict, total=False):
    """A container or init container."""

    name: str
    restartPolicy: str
    resources: ResourcesView
    env: list[EnvVarView]
    securityContext: SecurityContextView
    volumeMounts: list[VolumeMountView]


class HostPathView(TypedDict, total=False):
    """``volume.hostPath``."""

    path: str


class VolumeView(TypedDict, total=False):
    """One ``spec.volumes`` entry."""

    name: str
    hostPath: HostPathView


class SpecView(TypedDict, total=False):
    """``pod.spec``."""

    containers: list[ContainerView]
    initContainers: list[ContainerView]
    volumes: list[VolumeView]
    schedulerName: str
    priorityClassName: str
    nodeName: str
    hostPID: bool
    hostIPC: bool


class MetadataView(TypedDict, total=False):
    """``pod.metadata``."""

    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]


class PodView(TypedDict, total=False):
    """The fields of a Pod (or pod template) that egpu reads."""

    metadata: MetadataView
    spec: SpecView


# --- Errors ----------------------------------------------------------------------------------


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with "..." when cut."""
    return text if len(text) <= limit else text[:limit] + "..."


def shown(value: Any) -> str:
    """``value`` as a message shows it: JSON-like, strings quoted and cut to SHOWN_CHARS
    characters, lists and objects as ``[...]`` / ``{...}``. Never raises (no recursion, no
    conversion of a huge integer)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, LongNumber):
        return f"<a number of {len(value)} characters>"
    if isinstance(value, str):
        text = json.dumps(value[:SHOWN_CHARS])  # escapes control and lone surrogate characters
        return text + "..." if len(value) > SHOWN_CHARS else text
    if isinstance(value, int):
        if value.bit_length() > 200:
            return f"<a number of about {int(value.bit_length() * 0.30103) + 1} digits>"
        return clip(str(value))
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[...]" if value else "[]"
    if isinstance(value, Mapping):
        return "{...}" if value else "{}"
    return f"<{type(value).__name__}>"


def json_type(value: Any) -> str:
    """The JSON type of ``value`` in words: ``a number``, ``a list of 2 items``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, LongNumber | int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, Mapping):
        return f"an object with {len(value)} key{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}, not JSON"


@dataclass(frozen=True)
class ShapeError:
    """A field of the wrong JSON type: its path from the pod, the value as shown in a message,
    the value's JSON type, what is allowed. ``key``: the map key itself is wrong (not its
    value). ``raw``: the value, kept only on the way to a container's resources (for
    ``CheckedPod.mentions``)."""

    path: str
    value: str
    kind: str
    allowed: str
    key: bool = False
    raw: Any = field(default=None, compare=False, repr=False)

    @property
    def message(self) -> str:
        """A sentence a pod author can act on."""
        subject = f"{self.path}: key {self.value}" if self.key else f"{self.path}={self.value}"
        return f"{subject} is not allowed ({self.kind}); allowed: {self.allowed}"


# --- The schema ------------------------------------------------------------------------------

_BAD: Final = object()  # a read that failed (the error is recorded)


def _fail(allowed: str, value: Any, path: str, errors: list[ShapeError], raw: Any = None) -> Any:
    errors.append(ShapeError(path or "pod", shown(value), json_type(value), allowed, raw=raw))
    return _BAD


@dataclass(frozen=True)
class _Scalar:
    """A JSON scalar of one of ``types`` (and none of ``refused``)."""

    types: tuple[type, ...]
    allowed: str
    refused: tuple[type, ...] = ()

    def accepts(self, value: Any) -> bool:
        return isinstance(value, self.types) and not isinstance(value, self.refused)

    def read(self, value: Any, path: str, errors: list[ShapeError]) -> Any:
        return value if self.accepts(value) else _fail(self.allowed, value, path, errors)


def _wrong_type(kind: _Map | _List | _Object, value: Any, path: str,
                errors: list[ShapeError]) -> Any:
    """Record that ``value`` at ``path`` is not the JSON type ``kind`` reads (the raw value kept
    where it carries resources, so that a GPU pod still fails closed)."""
    return _fail(kind.allowed, value, path, errors, value if kind.carries_resources else None)


# The pod fields that are maps of free keys (labels, annotations, limits, requests): a path
# pattern (``path_pattern``) writes their keys as "*".
MAP_FIELDS: Final = frozenset({"labels", "annotations", "limits", "requests"})


def path_pattern(path: tuple[str | int, ...]) -> tuple[str, ...]:
    """A field path as a pattern: list indexes as "#", keys of MAP_FIELDS maps as "*"
    (``("spec", "containers", 0, "resources", "limits", "x")`` ->
    ``("spec", "containers", "#", "resources", "limits", "*")``)."""
    out: list[str] = []
    for index, part in enumerate(path):
        if isinstance(part, int):
            out.append("#")
        elif index and path[index - 1] in MAP_FIELDS:
            out.append("*")
        else:
            out.append(str(part))
    return tuple(out)


@dataclass(frozen=True)
class _Map:
    """An object of arbitrary string keys to ``value`` scalars (labels, limits, ...); a null
    value reads as ``null_as``. ``carries_resources``: errors keep the raw value (and key)."""

    value: _Scalar
    allowed: str
    null_as: Any
    carries_resources: bool = False

    def read(self, value: Any, path: str, errors: list[ShapeError]) -> Any:
        if not isinstance(value, Mapping):
            return _wrong_type(self, value, path, errors)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):  # JSON keys are strings; YAML's need not be
                errors.append(ShapeError(path, shown(key), json_type(key), "a string", key=True))
            elif item is None:
                out[key] = self.null_as
            elif self.value.accepts(item):
                out[key] = item
            else:
                _fail(self.value.allowed, item, f"{path}[{json.dumps(clip(key))}]", errors,
                      {key: item} if self.carries_resources else None)
        return out


@dataclass(frozen=True)
class _List:
    """A JSON list of ``item``; malformed items are left out of the view."""

    item: _Scalar | _Map | _List | _Object
    allowed: str
    carries_resources: bool = False

    def read(self, value: Any, path: str, errors: list[ShapeError]) -> Any:
        if not isinstance(value, list):
            return _wrong_type(self, value, path, errors)
        out = []
        for index, item in enumerate(value):
            got = self.item.read(item, f"{path}[{index}]", errors)
            if got is not _BAD:
                out.append(got)
        return out


@dataclass(frozen=True)
class _Object:
    """A JSON object; only ``fields`` are read (a null field is absent)."""

    fields: Mapping[str, _Scalar | _Map | _List | _Object]
    allowed: str
    carries_resources: bool = False

    def read(self, value: Any, path: str, errors: list[ShapeError]) -> Any:
        if not isinstance(value, Mapping):
            return _wrong_type(self, value, path, errors)
        out: dict[str, Any] = {}
        for name, kind in self.fields.items():
            item = value.get(name)
            if item is not None:
                got = kind.read(item, f"{path}.{name}" if path else name, errors)
                if got is not _BAD:
                    out[name] = got
        return out


_STRING: Final = _Scalar((str,), "a string", refused=(LongNumber,))
_BOOLEAN: Final = _Scalar((bool,), "true or false")
_QUANTITY: Final = _Scalar((str, int, float, bool),
                           'a quantity: a string such as "3000", or a number')
_RESOURCE_MAP: Final = _Map(_QUANTITY, "an object of resource name to quantity", None,
                            carries_resources=True)
_STRING_MAP: Final = _Map(_STRING, "an object of string to string", "")
_CONTAINER: Final = _Object({
    "name": _STRING,
    "restartPolicy": _STRING,
    "resources": _Object({"limits": _RESOURCE_MAP, "requests": _RESOURCE_MAP},
                         "an object with limits and requests", carries_resources=True),
    "env": _List(_Object({"name": _STRING, "value": _STRING},
                         "an object with name and value (or valueFrom)"),
                 "a list of objects with name and value"),
    "securityContext": _Object({
        "privileged": _BOOLEAN,
        "capabilities": _Object({"add": _List(_STRING, "a list of strings")},
                                "an object with add and drop lists"),
    }, "an object (a security context)"),
    "volumeMounts": _List(_Object({"name": _STRING, "mountPath": _STRING},
                                  "an object with name and mountPath"),
                          "a list of objects (volume mounts)"),
}, "an object (a container)", carries_resources=True)
_CONTAINERS: Final = _List(_CONTAINER, "a list of objects (containers)", carries_resources=True)
POD: Final = _Object({
    "metadata": _Object({
        "name": _STRING,
        "namespace": _STRING,
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    }, "an object (the pod's metadata)"),
    "spec": _Object({
        "containers": _CONTAINERS,
        "initContainers": _CONTAINERS,
        "volumes": _List(_Object({"name": _STRING, "hostPath": _Object(
            {"path": _STRING}, "an object with a path")}, "an object (a volume)"),
            "a list of objects (volumes)"),
        "schedulerName": _STRING,
        "priorityClassName": _STRING,
        "nodeName": _STRING,
        "hostPID": _BOOLEAN,
        "hostIPC": _BOOLEAN,
    }, "an object (the pod spec)", carries_resources=True),
}, "an object (a Pod)", carries_resources=True)
"""The fields egpu reads, with their types: what ``check_pod`` checks and copies."""


# --- The check -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedPod:
    """A pod as ``check_pod`` read it: the typed ``view`` and the ``errors`` (module doc)."""

    view: PodView
    errors: tuple[ShapeError, ...] = ()

    def mentions(self, names: Collection[str]) -> bool:
        """True when a malformed field on the way to a container's resources (the spec, a
        container list, a container, its resources, limits or requests) holds a string that
        contains any of ``names``, as a key or a value: a pod that meant to ask for a share.
        Looks at MAX_SCANNED_VALUES values at most, then answers True (fail closed)."""
        raws = [e.raw for e in self.errors if e.raw is not None]
        return bool(raws) and _mentions(raws, tuple(names))

    @property
    def metadata(self) -> MetadataView:
        """``view["metadata"]``, empty when absent."""
        return self.view.get("metadata", {})

    @property
    def spec(self) -> SpecView:
        """``view["spec"]``, empty when absent."""
        return self.view.get("spec", {})


def _mentions(value: Any, names: tuple[str, ...]) -> bool:
    stack = [value]
    scanned = 0
    while stack:
        item = stack.pop()
        scanned += 1
        if scanned > MAX_SCANNED_VALUES:
            return True
        if isinstance(item, str):
            if any(name in item for name in names):
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def check_pod(pod: Any) -> CheckedPod:
    """Check the fields egpu reads of ``pod`` (any value) against ``POD``; never raises."""
    errors: list[ShapeError] = []
    view = POD.read(pod, "", errors)
    return CheckedPod(cast(PodView, {} if view is _BAD else view), tuple(errors))
