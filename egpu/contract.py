"""The names every part of egpu shares (../shared/CONTRACT.md, as implemented).

Every part (webhook, egpu scheduler, node agent, device plugin, runtime hook, CLI) and the
C interposer read and write exactly these names. Change a name here and in docs/design.md
together; the C side mirrors the file paths and config keys in libinterpose/include/egpu_config.h.

Terms: a *card* is one physical GPU, known by its NVML UUID. A *share* is what one container
gets of one card: MiB of device memory and % of compute.
"""

from __future__ import annotations

# No import at run time: the runtime hook (runtime_hook, run for every container a node
# creates) imports this module on its hot path, and ``typing`` alone costs it milliseconds.
# ``Final`` is for readers and type checkers only (annotations are never evaluated here).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Final

DOMAIN: Final = "egpu.io"
RECORD_VERSION: Final = 1  # the "version" of every JSON record egpu writes (egpu.records)

# --- Extended resources a pod author writes (container limits; requests == limits) ---------
RES_GPU: Final = "egpu.io/gpu"  # cards, integer 1..16
RES_MEMORY: Final = "egpu.io/gpu-memory"  # MiB per card, integer >= 1
RES_MEMORY_PERCENTAGE: Final = "egpu.io/gpu-memory-percentage"  # % of card memory, 1..100
RES_CORES: Final = "egpu.io/gpu-cores"  # % of card compute, 1..100

EGPU_RESOURCES: Final = (RES_GPU, RES_MEMORY, RES_MEMORY_PERCENTAGE, RES_CORES)

# Default alias set (Volcano vGPU names); configurable through Config.aliases.
VOLCANO_ALIASES: Final = {
    "volcano.sh/vgpu-number": RES_GPU,
    "volcano.sh/vgpu-memory": RES_MEMORY,
    "volcano.sh/vgpu-memory-percentage": RES_MEMORY_PERCENTAGE,
    "volcano.sh/vgpu-cores": RES_CORES,
}

NATIVE_NVIDIA_GPU: Final = "nvidia.com/gpu"  # not ours: left to the native device plugin

MAX_GPUS_PER_CONTAINER: Final = 16

# --- Pod annotations a pod author writes ---------------------------------------------------
ANN_PRIORITY: Final = "egpu.io/priority"  # high | low
ANN_COMPUTE_POLICY: Final = "egpu.io/compute-policy"  # strict | elastic
ANN_MEMORY_OVERSUBSCRIPTION: Final = "egpu.io/memory-oversubscription"  # true | false
ANN_USE_GPU_TYPE: Final = "egpu.io/use-gpu-type"
ANN_NOUSE_GPU_TYPE: Final = "egpu.io/nouse-gpu-type"
ANN_USE_GPU_UUID: Final = "egpu.io/use-gpu-uuid"
ANN_NOUSE_GPU_UUID: Final = "egpu.io/nouse-gpu-uuid"
ANN_GPU_POLICY: Final = "egpu.io/gpu-policy"  # binpack | spread (card on the chosen node)
ANN_NODE_POLICY: Final = "egpu.io/node-policy"  # binpack | spread (which node)

PRIORITIES: Final = ("high", "low")
COMPUTE_POLICIES: Final = ("strict", "elastic")
PLACEMENT_POLICIES: Final = ("binpack", "spread")
BOOLEANS: Final = ("true", "false")

# --- What egpu writes ------------------------------------------------------------------
LABEL_PRIORITY: Final = "egpu.io/priority"  # resolved priority, set by the webhook
ANN_ALLOCATION: Final = "egpu.io/allocation"  # written by egpu's scheduler, in the Binding
ANN_INVENTORY: Final = "egpu.io/inventory"  # node: JSON list of cards (node agent)
ANN_INVENTORY_HEARTBEAT: Final = "egpu.io/inventory-heartbeat"  # node: RFC 3339
ANN_USAGE: Final = "egpu.io/usage"  # node: measured use per card and share (records.NodeUsage)
DEFAULT_SCHEDULER_NAME: Final = "egpu-scheduler"
KUBE_DEFAULT_SCHEDULER: Final = "default-scheduler"

# Informational copies of the resolved policies, written by the webhook on each container
# with a share for the pod's processes to read; no part of egpu reads them back in a pod (the
# record is authoritative: /run/egpu/config.json). The interposer reads them only where no
# config file exists (raw node, `egpu run`), as the variables below.
ENV_PRIORITY: Final = "EGPU_PRIORITY"
ENV_COMPUTE_POLICY: Final = "EGPU_COMPUTE_POLICY"
ENV_MEMORY_OVERSUBSCRIPTION: Final = "EGPU_MEMORY_OVERSUBSCRIPTION"
# Raw-node / `egpu run` only (read by the interposer where no config file exists):
ENV_MEMORY_LIMIT_MIB: Final = "EGPU_MEMORY_LIMIT_MIB"  # MiB per visible card
ENV_MEMORY_PERCENTAGE: Final = "EGPU_MEMORY_PERCENTAGE"  # % of each visible card
ENV_CORES: Final = "EGPU_CORES"  # % per visible card
ENV_CONTAINER_REGION: Final = "EGPU_CONTAINER_REGION"  # accounting region file path
ENV_RUNTIME_DIR: Final = "EGPU_RUNTIME_DIR"  # overrides RUNTIME_DIR (tests, egpu run)
ENV_CONFIG_PATH: Final = "EGPU_CONFIG_PATH"  # tests only: where the interposer looks for config

NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
# Set by egpu's CDI device egpu.io/gpu=<i> (node_agent.cdi): EGPU_CDI_CARD_<i>=<uuid>
ENV_CDI_CARD_PREFIX: Final = "EGPU_CDI_CARD_"

# --- Files -------------------------------------------------------------------------------
# On the node. Never mounted whole into a pod: the runtime hook bind-mounts, at the same
# paths, only the container's own accounting folder (rw), its own cards' folders (ro) and its
# own share file in each (rw) (the webhook refuses share pods whose hostPath volumes reach
# this folder or NODE_PRIVATE_DIR).
RUNTIME_DIR: Final = "/var/run/egpu"
CONTAINERS_SUBDIR: Final = "containers"  # <RUNTIME_DIR>/containers/<pod-uid>_<container>/
# <RUNTIME_DIR>/cards/<uuid>/: the card's roster and one share-<owner> file per share
# (egpu.card_roster)
CARDS_SUBDIR: Final = "cards"
CONTAINER_REGION_FILE: Final = "region"  # the accounting region inside the container folder
CONTAINER_CONFIG_PATH: Final = "/run/egpu/config.json"  # in the container, read-only
LD_SO_PRELOAD: Final = "/etc/ld.so.preload"
INTERPOSER_LIBRARY: Final = "libegpu_interpose.so"
INTERPOSER_PATH_IN_CONTAINER: Final = "/usr/lib/egpu/libegpu_interpose.so"

# --- Node side: device plugin -> runtime hook, node agent -> runtime hook -----------------
# Set by the device plugin's Allocate in the container's environment (see docs/node.md).
ENV_POD_UID: Final = "EGPU_POD_UID"  # the pod the device plugin matched (unique match only)
ENV_CONTAINER: Final = "EGPU_CONTAINER"  # the container the device plugin matched
ENV_DEVICES: Final = "EGPU_DEVICES"  # always: the device-plugin slot ids the kubelet gave
ENV_ALLOCATION_ERROR: Final = "EGPU_ALLOCATION_ERROR"  # why no share could be matched: the
# runtime hook refuses to create such a container and prints this message.
# Root-only folder on the node, NOT mounted into containers (a container's own accounting
# folder under RUNTIME_DIR is, writable): the node agent's per-pod allocation files and the
# runtime hook's per-container files (config.json and ld.so.preload, bind-mounted read-only).
NODE_PRIVATE_DIR: Final = "/var/run/egpu-node"
ENV_NODE_PRIVATE_DIR: Final = "EGPU_NODE_PRIVATE_DIR"  # overrides NODE_PRIVATE_DIR (tests)
ALLOCATIONS_SUBDIR: Final = "allocations"  # <NODE_PRIVATE_DIR>/allocations/<pod-uid>.json
HOOK_SUBDIR: Final = "hook"  # <NODE_PRIVATE_DIR>/hook/<pod-uid>_<container>/
# <NODE_PRIVATE_DIR>/claim-shares/<claim-uid>.json: a prepared ResourceClaim's shares, one
# entry per request (egpu.records.PodShares with the claim's name and UID; the DRA kubelet
# plugin writes it, the runtime hook reads it for every container given the claim's devices,
# of any pod: the kubelet prepares a claim once, for its first pod).
CLAIM_SHARES_SUBDIR: Final = "claim-shares"
# <NODE_PRIVATE_DIR>/driver-memory-limits.json: the cards whose driver takes a per-container
# memory limit (egpu.driver_limits; the node agent writes it at start, the runtime hook sets
# the limit to the share on those cards).
DRIVER_LIMITS_FILE: Final = "driver-memory-limits.json"
# Set by a prepared claim's CDI device of one request, in the container's environment:
# EGPU_CLAIM_SHARE_<claim-uid>_<request>=<claim-uid>/<request> (the name holds both so that the
# devices of several requests, or of two claims, never overwrite each other's).
ENV_CLAIM_SHARE_PREFIX: Final = "EGPU_CLAIM_SHARE_"
# A prepared claim request's CDI device also gives each container a device node at
# CLAIM_MARK_PREFIX + claim_request_device(uid, request), a copy of the host's /dev/null: the
# runtime hook's proof that the kubelet gave the container that claim (a pod can set any
# environment variable, EGPU_CLAIM_SHARE_* included, but no device node).
CLAIM_MARK_PREFIX: Final = "/dev/egpu-"
CLAIM_MARK_HOST_DEVICE: Final = "/dev/null"
# A claim's accounting folder: <RUNTIME_DIR>/containers/claim-<claim-uid>_<r1>.<r2>... (the
# requests a container names, sorted): every container of every pod naming the same requests
# of one claim draws on the one budget and compute cap there.
CLAIM_SHARE_DIR_PREFIX: Final = "claim-"
# OCI annotations that name the Kubernetes container (containerd CRI, then CRI-O).
OCI_ANN_POD_UID: Final = ("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid")
OCI_ANN_CONTAINER_NAME: Final = ("io.kubernetes.cri.container-name", "io.kubernetes.container.name")
OCI_ANN_POD_NAME: Final = ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name")
OCI_ANN_POD_NAMESPACE: Final = (
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.pod.namespace",
)
OCI_ANN_CONTAINER_TYPE: Final = "io.kubernetes.cri.container-type"  # "sandbox" | "container"
# Where the node DaemonSet installs the hook and the interposer on the host.
HOST_INSTALL_DIR: Final = "/usr/local/egpu"
MAX_SHARE_MIB: Final = 1 << 40  # the interposer's bound on a share's MiB (libinterpose config.c)
HOST_HOOK_PATH: Final = "/usr/local/egpu/bin/egpu-hook"
HOST_INTERPOSER_PATH: Final = "/usr/local/egpu/lib/libegpu_interpose.so"
CDI_KIND: Final = "egpu.io/gpu"  # CDI device kind of the cards (egpu cdi generate)

# --- DRA (Dynamic Resource Allocation, resource.k8s.io/v1; CONTRACT.md section 5) ---------
# For clusters that run egpu as a DRA driver (egpu.dra); the extender path above stays for
# clusters without DRA.
DRA_DRIVER: Final = "gpu.egpu.io"  # ResourceSlice spec.driver, kubelet plugin name
DRA_CDI_VENDOR: Final = "egpu.io"
DEVICE_CLASS_SHARE: Final = "share.gpu.egpu.io"  # a share of one card (multiple allocations)
DEVICE_CLASS_WHOLE: Final = "whole.gpu.egpu.io"  # whole cards; extendedResourceName RES_GPU
DRA_CAPACITY_MEMORY: Final = "memory"  # bytes (Quantity, e.g. 24000Mi), in 1 MiB steps
DRA_CAPACITY_CORES: Final = "cores"  # % of the card's compute, 0..100
# Device attributes, as the inventory's card fields (egpu.records.Card):
DRA_ATTR_UUID: Final = "uuid"  # string
DRA_ATTR_MODEL: Final = "model"  # string
DRA_ATTR_INDEX: Final = "index"  # int
DRA_ATTR_MEMORY_MIB: Final = "memoryMiB"  # int, MiB, the card's physical memory
DRA_ATTR_NUMA_NODE: Final = "numaNode"  # int, -1 when unknown
DRA_ATTR_HEALTHY: Final = "healthy"  # bool
DRA_CONFIG_API_VERSION: Final = "gpu.egpu.io/v1alpha1"  # opaque config
DRA_CONFIG_KIND: Final = "ShareConfig"  # priority, computePolicy, memoryOversubscription
# Claims from pod specs (the webhook in DRA mode; docs/dra.md "Claims from pod specs"):
# pod: extender | dra (migrations); node (node agent): how the node takes shares, and the
# scheduler places none on a node that says dra (the DRA node pool, docs/dra.md)
ANN_ALLOCATION_MODE: Final = "egpu.io/allocation-mode"
# node (node agent): the config it runs, "<generation> <source>" (egpu.config.LoadedConfig:
# the SHA-256 prefix of its text; file | last-good), shown by `kubectl egpu`
ANN_CONFIG: Final = "egpu.io/config"
ALLOCATION_MODE_EXTENDER: Final = "extender"  # sections 1-2: extender, device plugin
ALLOCATION_MODE_DRA: Final = "dra"  # ResourceClaims placed by the kube-scheduler
ALLOCATION_MODES: Final = (ALLOCATION_MODE_EXTENDER, ALLOCATION_MODE_DRA)
DRA_POD_CLAIM: Final = "egpu"  # pod.spec.resourceClaims[].name of the webhook's claim
DRA_TEMPLATE_PREFIX: Final = "egpu-"  # ResourceClaimTemplate egpu-<hash of its spec>
# resource.k8s.io/v1's own finalizer of an allocated claim: the webhook writes it on the claims
# it creates, so that the kube-scheduler need not add it (one API write less per pod); the
# resourceclaim controller removes it from a deleted claim that no pod reserves
DRA_CLAIM_FINALIZER: Final = "resource.kubernetes.io/delete-protection"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"  # on the webhook's templates
DRA_TEMPLATE_MANAGER: Final = "egpu-webhook"  # its value there (templates and claims)
# on the webhook's claims: the template name of the claim's shape (egpu-<hash of its spec>)
LABEL_CLAIM_SHAPE: Final = "egpu.io/claim-shape"

# --- Configuration -----------------------------------------------------------------------
CONFIG_MAP_NAME: Final = "egpu-config"
# the chart's monitoring.prometheusURL, for `kubectl egpu advise` (charts/egpu/templates/monitoring)
MONITORING_CONFIG_MAP: Final = "egpu-monitoring"
MONITORING_PROMETHEUS_URL_KEY: Final = "prometheusURL"
CONFIG_FILE_ENV: Final = "EGPU_CLUSTER_CONFIG"  # path of the YAML config for the parts
NAMESPACE: Final = "egpu-system"

# --- Metrics (node agent) ----------------------------------------------------------------
METRIC_CONTAINER_MEMORY_LIMIT: Final = "egpu_container_memory_limit_bytes"
METRIC_CONTAINER_MEMORY_USED: Final = "egpu_container_memory_used_bytes"
# the highest use since the share's region was created (a scrape every 15 s misses short peaks)
METRIC_CONTAINER_MEMORY_PEAK: Final = "egpu_container_memory_peak_bytes"
# allocations the interposer refused because the share was full (a counter: OOMs seen)
METRIC_CONTAINER_MEMORY_REFUSED: Final = "egpu_container_memory_refused_allocations_total"
METRIC_CONTAINER_CORES_LIMIT: Final = "egpu_container_cores_limit_percent"
METRIC_CONTAINER_COMPUTE_USED: Final = "egpu_container_compute_used_percent"
# beyond the contract's list: what the share reports, unbounded, and whether that is over its cap
METRIC_CONTAINER_COMPUTE_REPORTED: Final = "egpu_container_compute_reported_percent"
METRIC_CONTAINER_COMPUTE_OVER_CAP: Final = "egpu_container_compute_over_cap"
METRIC_CARD_MEMORY_TOTAL: Final = "egpu_card_memory_total_bytes"
METRIC_CARD_MEMORY_USED: Final = "egpu_card_memory_used_bytes"
METRIC_CARD_MEMORY_BOOKED: Final = "egpu_card_memory_booked_bytes"
METRIC_CARD_CORES_BOOKED: Final = "egpu_card_cores_booked_percent"
METRIC_CARD_COMPUTE_USED: Final = "egpu_card_compute_used_percent"
METRIC_CARD_DRIVER_MEMORY_LIMIT: Final = "egpu_card_driver_memory_limit"  # 1: the driver's wall
# unix seconds of the node agent's last successful inventory heartbeat (PATCH of the node)
METRIC_NODE_HEARTBEAT: Final = "egpu_node_heartbeat_timestamp_seconds"
# 1 for the config a part runs: labels part, generation (sha256 prefix), source (file|last-good)
METRIC_CONFIG_INFO: Final = "egpu_config_info"
# dcgm-exporter label names where they overlap, then ours.
LABELS_CARD: Final = ("gpu", "UUID", "modelName", "Hostname")
LABELS_CONTAINER: Final = (*LABELS_CARD, "namespace", "pod", "container")
LABELS_NODE: Final = ("Hostname",)


def is_file_name(name: str) -> bool:
    """Whether ``name`` is one path component that names no other folder: not empty, no '/',
    no NUL, not '.' or '..'. Every name egpu joins under a node folder (a pod's or claim's
    UID, a card UUID, a region folder) passes this first."""
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def container_dir_name(pod_uid: str, container: str) -> str:
    """Folder name of a container's accounting region: ``<pod-uid>_<container>``."""
    return f"{pod_uid}_{container}"


def container_region_path(dir_name: str, runtime_dir: str = RUNTIME_DIR) -> str:
    """The accounting region file of the share whose folder is ``dir_name`` (a container's
    ``<pod-uid>_<container>``, a claim's, a raw container's):
    ``<runtime_dir>/containers/<dir_name>/region``. With the default ``RUNTIME_DIR`` it is
    the path the container sees: its interposer config's ``container_region``, which keys the
    share's owner in the card rosters (egpu.card_roster.share_owner)."""
    return f"{runtime_dir}/{CONTAINERS_SUBDIR}/{dir_name}/{CONTAINER_REGION_FILE}"


def claim_share_env(claim_uid: str, request: str) -> tuple[str, str]:
    """(name, value) of the environment variable a claim's CDI device of ``request`` sets."""
    return f"{ENV_CLAIM_SHARE_PREFIX}{claim_uid}_{request}", f"{claim_uid}/{request}"


def claim_request_device(claim_uid: str, request: str) -> str:
    """The CDI device name of one request of a prepared claim: ``claim-<uid>-<request>``."""
    return f"claim-{claim_uid}-{request}"


def claim_mark_path(claim_uid: str, request: str) -> str:
    """The device node a container given that claim request's CDI device has
    (``CLAIM_MARK_PREFIX``): ``/dev/egpu-claim-<uid>-<request>``."""
    return claim_mark_of_device(claim_request_device(claim_uid, request))


def claim_mark_of_device(device: str) -> str:
    """The device node of a claim request's CDI device named ``device``
    (``claim_request_device``)."""
    return CLAIM_MARK_PREFIX + device


def claim_share_dir_name(claim_uid: str, requests: Iterable[str]) -> str:
    """Folder name of the accounting region of one claim's ``requests`` (base names): every
    container naming exactly these requests of the claim shares it.
    ``claim-<claim-uid>_<r1>.<r2>`` with the requests sorted (DNS labels hold no '.' or '_')."""
    return f"{CLAIM_SHARE_DIR_PREFIX}{claim_uid}_{'.'.join(sorted(set(requests)))}"


def claim_share_dir_requests(name: str, claim_uid: str) -> frozenset[str] | None:
    """The requests of a claim's accounting folder name (``claim_share_dir_name``), None when
    ``name`` is not one of claim ``claim_uid``'s."""
    prefix = f"{CLAIM_SHARE_DIR_PREFIX}{claim_uid}_"
    return frozenset(name[len(prefix):].split(".")) if name.startswith(prefix) else None


def allocation_file_name(pod_uid: str) -> str:
    """File name of a pod's allocation file in ``<NODE_PRIVATE_DIR>/allocations/``."""
    return f"{pod_uid}.json"
