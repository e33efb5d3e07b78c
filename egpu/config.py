"""egpu's configuration: one YAML document (the ConfigMap ``egpu-config`` in a cluster).

Read by the webhook, the egpu scheduler and the node agent. Every key is optional; absent
keys take the defaults below. Unknown keys and bad values raise ``ConfigError`` naming the key
(dotted path), the value and what is allowed.

Keys (YAML, camelCase as Kubernetes configs are)::

    schedulerName: egpu-scheduler          # what the webhook writes into spec.schedulerName
    resourceAliases:                       # alias -> egpu.io name (default: Volcano vGPU names)
      volcano.sh/vgpu-number: egpu.io/gpu
    defaults:
      priority: high                       # high | low
      computePolicy: strict                # strict | elastic
      gpuPolicy: binpack                   # binpack | spread  (card on the chosen node)
      nodePolicy: binpack                  # binpack | spread  (which node)
    priorityClasses: {}                    # PriorityClass name -> high | low
    sharesPerCard: 10                      # device-plugin slots per card (allocatable egpu.io/gpu)
    memoryOversubscriptionRatio: 1.5       # >= 1; opt-in pods may book capacity x ratio MiB
    coresOversubscriptionRatio: 1.0        # >= 1; booked cores may reach 100 x ratio per card
    ignoredNamespaces: [kube-system, egpu-system]
    allowPrivileged: false                 # deny privileged containers with a share unless true
    heartbeatTimeoutSeconds: 120           # 1..86400; a node's inventory older than this takes
                                           # no shares
    lowPriorityFloorPercent: 0             # 0..100: what a low-priority share keeps of a card
                                           # beside busy high-priority work (0: it yields fully)
    allocationMode: extender               # extender | dra: what the webhook makes of a share
                                           # (dra: ResourceClaims, docs/dra.md)
    namespaceAllocationModes: {}           # namespace -> extender | dra (a migration, by team)

A pod's annotation ``egpu.io/allocation-mode`` comes first, then its namespace's entry in
``namespaceAllocationModes``, then ``allocationMode`` (``Config.allocation_mode_for``).

The policies are read into the ``StrEnum``s of ``egpu.policies`` (``Priority``,
``ComputePolicy``, ``PlacementPolicy``, ``AllocationMode``): each member equals its YAML
string, so the file's format and the messages are those of the strings.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

import yaml

from egpu.card_roster import NSLOTS
from egpu.contract import (
    DEFAULT_SCHEDULER_NAME,
    EGPU_RESOURCES,
    NAMESPACE,
    NATIVE_NVIDIA_GPU,
    VOLCANO_ALIASES,
)
from egpu.policies import AllocationMode, ComputePolicy, PlacementPolicy, Priority

_Policy = TypeVar("_Policy", bound=StrEnum)


MAX_HEARTBEAT_TIMEOUT_S = 86400  # heartbeatTimeoutSeconds' bound: a day


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key, the value and what is allowed."""


@dataclass(frozen=True)
class Defaults:
    """Defaults for pods that do not say: priority, compute policy, card and node policy."""

    priority: Priority = Priority.HIGH
    compute_policy: ComputePolicy = ComputePolicy.STRICT
    gpu_policy: PlacementPolicy = PlacementPolicy.BINPACK
    node_policy: PlacementPolicy = PlacementPolicy.BINPACK


@dataclass(frozen=True)
class Config:
    """The parsed configuration; see the module docstring for the keys and their meaning."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    resource_aliases: dict[str, str] = field(default_factory=lambda: dict(VOLCANO_ALIASES))
    defaults: Defaults = field(default_factory=Defaults)
    priority_classes: dict[str, Priority] = field(default_factory=dict)
    shares_per_card: int = 10
    memory_oversubscription_ratio: float = 1.5
    cores_oversubscription_ratio: float = 1.0
    ignored_namespaces: tuple[str, ...] = ("kube-system", NAMESPACE)
    allow_privileged: bool = False
    heartbeat_timeout_seconds: int = 120
    low_priority_floor_percent: int = 0
    allocation_mode: AllocationMode = AllocationMode.EXTENDER
    namespace_allocation_modes: dict[str, AllocationMode] = field(default_factory=dict)

    def allocation_mode_for(self, namespace: str,
                            annotation: AllocationMode | str | None = None) -> AllocationMode:
        """The allocation mode of a pod in ``namespace`` (``extender`` or ``dra``): the pod's
        ``egpu.io/allocation-mode`` annotation (``annotation``, None or "" when absent),
        else the namespace's entry in ``namespace_allocation_modes``, else
        ``allocation_mode``."""
        if annotation:
            return AllocationMode(annotation)
        return AllocationMode(self.namespace_allocation_modes.get(namespace,
                                                                  self.allocation_mode))

    @property
    def makes_dra_pods(self) -> bool:
        """Whether any namespace's pods go the DRA way by default (a pod's own annotation
        may choose it in any config)."""
        return AllocationMode.DRA in (self.allocation_mode,
                                      *self.namespace_allocation_modes.values())


def _choice(value: Any, key: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not allowed; allowed: {', '.join(allowed)}")
    return str(value)


def _policy(value: Any, key: str, kind: type[_Policy]) -> _Policy:
    """``value`` as a member of the policy enum ``kind``; ConfigError naming the key and the
    allowed strings otherwise."""
    return kind(_choice(value, key, tuple(kind)))


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    return value


def _numeric_text(value: Any, parse: Any) -> Any:
    """A number written as text (``"2.0"``, ``" 10 "``: what ``helm --set`` leaves of a float,
    or a quoted YAML value) read as one; any other value as it is."""
    if isinstance(value, str):
        try:
            return parse(value.strip())
        except ValueError:
            return value
    return value


def _int(value: Any, key: str, low: int, high: int) -> int:
    value = _numeric_text(value, int)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: {value!r} is not an integer")
    if not low <= value <= high:
        raise ConfigError(f"{key}: {value} is out of range; allowed: {low}..{high}")
    return value


def _ratio(value: Any, key: str) -> float:
    value = _numeric_text(value, float)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: {value!r} is not a number")
    if not 1.0 <= value <= 100.0:  # compared as it is: float() of a huge int overflows
        raise ConfigError(f"{key}: {value} is out of range; allowed: 1.0..100.0")
    return float(value)


def _check_unknown(data: dict[str, Any], known: set[str], prefix: str) -> None:
    for key in data:
        if key not in known:
            path = f"{prefix}{key}"
            raise ConfigError(f"{path}: unknown key; allowed: {', '.join(sorted(known))}")


def _defaults(data: Any) -> Defaults:
    data = _mapping(data, "defaults")
    _check_unknown(data, {"priority", "computePolicy", "gpuPolicy", "nodePolicy"}, "defaults.")
    absent = Defaults()

    def read(key: str, kind: type[_Policy], default: _Policy) -> _Policy:
        return _policy(data[key], f"defaults.{key}", kind) if key in data else default

    return Defaults(priority=read("priority", Priority, absent.priority),
                    compute_policy=read("computePolicy", ComputePolicy, absent.compute_policy),
                    gpu_policy=read("gpuPolicy", PlacementPolicy, absent.gpu_policy),
                    node_policy=read("nodePolicy", PlacementPolicy, absent.node_policy))


def _aliases(data: Any) -> dict[str, str]:
    data = _mapping(data, "resourceAliases")
    for alias, target in data.items():
        if not isinstance(alias, str) or "/" not in alias:
            raise ConfigError(
                f"resourceAliases: key {alias!r} is not a resource name (domain/name)")
        if alias in EGPU_RESOURCES:
            raise ConfigError(f"resourceAliases.{alias}: an egpu.io name cannot be an alias")
        if alias == NATIVE_NVIDIA_GPU:  # whole cards, the NVIDIA device plugin's (CONTRACT.md)
            raise ConfigError(
                f"resourceAliases.{alias}: {alias} cannot be an alias (whole cards are left to "
                "NVIDIA's device plugin); allowed: another resource name (domain/name)")
        _choice(target, f"resourceAliases.{alias}", EGPU_RESOURCES)
    return {str(k): str(v) for k, v in data.items()}


def parse_config(data: Any) -> Config:
    """Build a Config from parsed YAML (a mapping, or None for all defaults).

    Raises ConfigError for unknown keys and bad values, naming the key.
    """
    if data is None:
        return Config()
    data = _mapping(data, "config")
    parsers: dict[str, tuple[str, Any]] = {
        "schedulerName": ("scheduler_name", lambda v, k: _name(v, k)),
        "resourceAliases": ("resource_aliases", lambda v, k: _aliases(v)),
        "defaults": ("defaults", lambda v, k: _defaults(v)),
        "priorityClasses": ("priority_classes", lambda v, k: _priority_classes(v)),
        # at most one share per entry of a card's roster (the runtime hook registers each
        # container's share there; egpu.card_roster.NSLOTS)
        "sharesPerCard": ("shares_per_card", lambda v, k: _int(v, k, 1, NSLOTS)),
        "memoryOversubscriptionRatio": ("memory_oversubscription_ratio", _ratio),
        "coresOversubscriptionRatio": ("cores_oversubscription_ratio", _ratio),
        "ignoredNamespaces": ("ignored_namespaces", lambda v, k: _names(v, k)),
        "allowPrivileged": ("allow_privileged", lambda v, k: _bool(v, k)),
        # a node silent for longer than a day is no node to place on
        "heartbeatTimeoutSeconds": ("heartbeat_timeout_seconds",
                                    lambda v, k: _int(v, k, 1, MAX_HEARTBEAT_TIMEOUT_S)),
        "lowPriorityFloorPercent": ("low_priority_floor_percent", lambda v, k: _int(v, k, 0, 100)),
        "allocationMode": ("allocation_mode", lambda v, k: _policy(v, k, AllocationMode)),
        "namespaceAllocationModes": ("namespace_allocation_modes",
                                     lambda v, k: _namespace_modes(v)),
    }
    _check_unknown(data, set(parsers), "")
    values = {attr: parse(data[key], key) for key, (attr, parse) in parsers.items() if key in data}
    return replace(Config(), **values)


def _name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: {value!r} must be a non-empty string")
    return value


def _names(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: {value!r} must be a list of non-empty strings")
    return tuple(value)


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: {value!r} is not allowed; allowed: true, false")
    return value


def _priority_classes(value: Any) -> dict[str, Priority]:
    data = _mapping(value, "priorityClasses")
    for name in data:
        if not isinstance(name, str) or not name:  # YAML reads `1:` and `null:` as non-text
            raise ConfigError(f"priorityClasses: key {name!r} is not allowed; allowed: a "
                              "PriorityClass name (text)")
    return {k: _policy(v, f"priorityClasses.{k}", Priority) for k, v in data.items()}


def _namespace_modes(value: Any) -> dict[str, AllocationMode]:
    data = _mapping(value, "namespaceAllocationModes")
    modes: dict[str, AllocationMode] = {}
    for namespace, mode in data.items():
        if not isinstance(namespace, str) or not namespace:
            raise ConfigError(
                f"namespaceAllocationModes: key {namespace!r} is not a namespace name")
        modes[namespace] = _policy(mode, f"namespaceAllocationModes.{namespace}",
                                   AllocationMode)
    return modes


def load_config(text: str | None) -> Config:
    """Parse YAML text (None or empty: defaults). Raises ConfigError, also for bad YAML."""
    if not text:
        return Config()
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    # PyYAML's constructors raise these too, for a tagged or implicit scalar they cannot read
    # (`!!int abc`, `2026-13-01`, `0x_`): a bad file, not an internal error
    except (yaml.YAMLError, ValueError, TypeError, KeyError, OverflowError,
            RecursionError) as exc:
        raise ConfigError(f"config: not valid YAML ({exc})") from None
    return parse_config(data)


_YAML_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last
    one without a word, so ``allowPrivileged: false`` above ``allowPrivileged: true`` would
    read true."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _YAML_MERGE_TAG:  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config_file(path: str | None) -> Config:
    """Read and parse the YAML file at ``path`` (None: defaults). Raises ConfigError, OSError."""
    if path is None:
        return Config()
    with open(path, encoding="utf-8") as handle:
        return load_config(handle.read())


# --- the last good config (an I/O edge: a part that restarts on a bad config keeps running) ---
LAST_GOOD_FILE = "config.last-good.yaml"


@dataclass(frozen=True)
class LoadedConfig:
    """The config a part runs: ``source`` "file" (the config file as it is, or defaults when
    the part has none), or "last-good" (the file is bad: ``error`` says why, and the config
    is the last one this part loaded well); ``generation``: the first 12 hex digits of the
    SHA-256 of the text it came from ("defaults" without one)."""

    config: Config
    source: str
    generation: str
    error: str = ""


def config_generation(text: str) -> str:
    """A config text's generation: the first 12 hex digits of its SHA-256 (what each part
    reports in egpu_config_info and the node agent in the node annotation egpu.io/config)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_config_keeping(path: str | None, keep_dir: str | None) -> LoadedConfig:
    """Load the config file at ``path`` (None: defaults). A good one is also written to
    ``<keep_dir>/config.last-good.yaml`` (atomically; ``keep_dir`` None: nothing kept). A bad
    or unreadable one falls back to that kept copy with ``error`` set, so that a hand-edited
    ConfigMap never takes down a restarting part. Raises ConfigError (naming the key) or
    OSError when there is no kept copy to fall back to: a part that never had a good config
    does not guess one."""
    if path is None:
        return LoadedConfig(Config(), "file", "defaults")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        config = load_config(text)
    except (ConfigError, OSError) as exc:
        kept = os.path.join(keep_dir, LAST_GOOD_FILE) if keep_dir else None
        if kept is None or not os.path.isfile(kept):
            raise
        with open(kept, encoding="utf-8") as handle:
            text = handle.read()
        return LoadedConfig(load_config(text), "last-good", config_generation(text),
                            f"{path}: {exc}")
    if keep_dir:
        try:
            os.makedirs(keep_dir, exist_ok=True)
            tmp = os.path.join(keep_dir, f".{LAST_GOOD_FILE}.{os.getpid()}")
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, os.path.join(keep_dir, LAST_GOOD_FILE))
        except OSError:
            pass  # nothing kept this time: the part runs on the good file all the same
    return LoadedConfig(config, "file", config_generation(text))
