"""The driver's own per-container memory limit: NVML's cgroup memory partitions (driver r615,
CUDA 13.4; docs.nvidia.com/deploy/mps, "MPS v3 Memory Partitioning").

``nvmlDeviceSetMemoryLimits_v1(device, {nameSpace, softLimit, hardLimit})`` puts a hard limit
(bytes) on what the processes of one cgroup v2 directory (``nameSpace``, its full path) may
allocate on one card: past it the driver answers out-of-memory, whatever the process calls,
interposer or not. egpu sets the hard limit to the share, as a second wall under the
interposer (docs/security.md). The soft limit stays 0: a soft limit reserves memory in every
ancestor cgroup (the dmem backend propagates it upwards) and is only given back when it is
zeroed before the cgroup goes, which nothing guarantees when a container exits.

Plain ctypes on ``libnvidia-ml.so.1``, no pynvml: the runtime hook uses it on the path of
every container with a share. The node agent decides which cards have the limit
(``supported``) and writes them to ``<NODE_PRIVATE_DIR>/driver-memory-limits.json``
(``encode_cards``); the hook reads that record (``decode_cards``) and sets the limit on those
cards only, for the container's cgroup (``cgroup_dir``), so that a node without the feature
costs the hook one failed open(2) and no NVML call.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

MIN_DRIVER_MAJOR = 615  # the first driver with nvmlDeviceSetMemoryLimits_v1
NVML_SUCCESS = 0
NO_LIMIT = (1 << 64) - 1  # NVML_DEVICE_MEMORY_LIMIT_MAX: hard limit "max" (the card's capacity)
DRIVER_VERSION_BUFFER = 96
RECORD_VERSION = 1


class DriverLimitError(RuntimeError):
    """NVML refused or could not be reached; the message names the call, card and group."""


class _SetLimits(ctypes.Structure):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong),
                ("hardLimit", ctypes.c_ulonglong)]


class _GetLimits(ctypes.Structure):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong),
                ("hardLimit", ctypes.c_ulonglong), ("currentUsed", ctypes.c_ulonglong)]


# --- the cgroup of a process (pure parsing, then the files) ----------------------------------

def cgroup_v2_path(proc_cgroup: str) -> str | None:
    """The cgroup v2 path ("/...") of the ``0::`` line of a /proc/<pid>/cgroup text, None
    when there is none (a host without the unified hierarchy)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or None
    return None


def cgroup_v2_mount(mountinfo: str) -> tuple[str, str] | None:
    """``(root, mount point)`` of the first cgroup v2 mount of a /proc/self/mountinfo text
    (proc(5): fields 4 and 5, the filesystem type after " - "), None when there is none."""
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        if sep and tail.split(" ", 1)[0] == "cgroup2":
            fields = head.split()
            if len(fields) >= 5:
                return fields[3], fields[4]
    return None


def cgroup_dir(pid: int, proc: str = "/proc") -> str:
    """The host path of the cgroup v2 directory of process ``pid`` (the ``nameSpace`` NVML
    wants), seen from this process's mount namespace. Raises DriverLimitError when the
    process or the hierarchy is not there."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as handle:
            path = cgroup_v2_path(handle.read())
        with open(f"{proc}/self/mountinfo", encoding="utf-8") as handle:
            mount = cgroup_v2_mount(handle.read())
    except OSError as exc:
        raise DriverLimitError(f"cgroup of pid {pid}: {exc}") from None
    if path is None or mount is None:
        raise DriverLimitError(f"pid {pid}: no cgroup v2 hierarchy on this node")
    root, point = mount
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        raise DriverLimitError(f"pid {pid}: its cgroup {path} is outside the cgroup v2 mount "
                               f"{point} (root {root})")
    inside = path[len(root.rstrip("/")):] if root != "/" else path
    return point.rstrip("/") + inside if inside != "/" else point


# --- the record the agent writes and the hook reads -----------------------------------------

def encode_cards(uuids: list[str] | tuple[str, ...]) -> str:
    """The node's driver-limit record, the cards whose driver takes a memory limit:
    ``{"version": 1, "cards": [uuid, ...]}``."""
    return json.dumps({"version": RECORD_VERSION, "cards": sorted(uuids)})


def decode_cards(text: str | bytes) -> frozenset[str]:
    """The card UUIDs of the record. Raises DriverLimitError naming the bad field."""
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise DriverLimitError(f"driver-memory-limits record: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DriverLimitError(f"driver-memory-limits record: expected an object, got {data!r}")
    cards = data.get("cards")
    if not isinstance(cards, list) or not all(isinstance(c, str) and c for c in cards):
        raise DriverLimitError(f"driver-memory-limits record: cards {cards!r}: a list of "
                               "card UUIDs")
    return frozenset(cards)


# --- NVML -----------------------------------------------------------------------------------

class Nvml:
    """An initialised NVML (``library``: a path or soname, or a loaded ``ctypes.CDLL``).
    Raises DriverLimitError when it cannot be loaded or initialised."""

    def __init__(self, library: str | ctypes.CDLL = "libnvidia-ml.so.1") -> None:
        try:
            self.lib = ctypes.CDLL(library) if isinstance(library, str) else library
        except OSError as exc:
            raise DriverLimitError(f"cannot load NVML ({library}): {exc}") from None
        self._call("nvmlInit_v2", "")

    def _call(self, name: str, what: str, *args: Any) -> None:
        func = getattr(self.lib, name, None)
        if func is None:
            raise DriverLimitError(f"{name}: not in this NVML (a driver before r615)")
        rc = func(*args)
        if rc != NVML_SUCCESS:
            self.lib.nvmlErrorString.restype = ctypes.c_char_p
            text = (self.lib.nvmlErrorString(rc) or b"?").decode(errors="replace")
            raise DriverLimitError(f"{name}{what}: {text} (NVML error {rc})")

    def close(self) -> None:
        """nvmlShutdown (the library stays loaded)."""
        self.lib.nvmlShutdown()

    def driver_major(self) -> int:
        """The driver's major version (580 of "580.95.05"); 0 when unreadable."""
        buf = ctypes.create_string_buffer(DRIVER_VERSION_BUFFER)
        self._call("nvmlSystemGetDriverVersion", "", buf, ctypes.c_uint(DRIVER_VERSION_BUFFER))
        head = buf.value.decode(errors="replace").split(".", 1)[0]
        return int(head) if head.isdigit() else 0

    def _device(self, uuid: str) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByUUID", f" {uuid}", uuid.encode(), ctypes.byref(handle))
        return handle

    def get_limit(self, uuid: str, namespace: str) -> tuple[int, int, int]:
        """``(soft, hard, used)`` bytes of cgroup directory ``namespace`` on card ``uuid``
        (hard NO_LIMIT: none). Raises DriverLimitError."""
        limits = _GetLimits(namespace.encode(), 0, 0, 0)
        self._call("nvmlDeviceGetMemoryLimits_v1", f" {uuid} {namespace}", self._device(uuid),
                   ctypes.byref(limits))
        return limits.softLimit, limits.hardLimit, limits.currentUsed

    def set_limit(self, uuid: str, namespace: str, hard_bytes: int) -> None:
        """Hard limit ``hard_bytes`` (NO_LIMIT clears it), soft 0, for cgroup directory
        ``namespace`` on card ``uuid``. Needs root. Raises DriverLimitError."""
        limits = _SetLimits(namespace.encode(), 0, hard_bytes)
        self._call("nvmlDeviceSetMemoryLimits_v1", f" {uuid} {namespace}", self._device(uuid),
                   ctypes.byref(limits))

    def supported(self, uuid: str, namespace: str) -> bool:
        """Whether card ``uuid`` takes memory limits: a driver of r615 or later whose NVML
        reads the limits of ``namespace`` (a cgroup v2 directory: the caller's own). A MIG
        device or a host without cgroup v2 answers no."""
        if self.driver_major() < MIN_DRIVER_MAJOR:
            return False
        try:
            self.get_limit(uuid, namespace)
        except DriverLimitError:
            return False
        return True
