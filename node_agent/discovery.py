"""The node's cards through NVML (pynvml): UUID, index, model, memory, NUMA node.

pynvml loads ``libnvidia-ml.so.1`` through the dynamic loader (LD_LIBRARY_PATH, ld.so.cache);
``use_library(path)`` points it at a given file instead (the fake driver in tests:
fakegpu/build/libnvidia-ml.so.1) by setting ``pynvml.nvmlLib`` before ``nvmlInit``.
"""

from __future__ import annotations

import ctypes
import threading
import warnings

with warnings.catch_warnings():  # pynvml warns that nvidia-ml-py is its new name
    warnings.simplefilter("ignore", FutureWarning)
    import pynvml

from egpu.records import Card

MIB = 1 << 20
_init_lock = threading.Lock()
_initialized = False


class DiscoveryError(RuntimeError):
    """NVML could not be loaded or answered with an error; the message says which call."""


def use_library(path: str) -> None:
    """Make pynvml use the NVML library at ``path`` (call before ``init``)."""
    pynvml.nvmlLib = ctypes.CDLL(path)


def init() -> None:
    """nvmlInit once per process. Raises DiscoveryError."""
    global _initialized
    with _init_lock:
        if _initialized:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise DiscoveryError(f"nvmlInit: {exc}") from None
        _initialized = True


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def numa_node(handle: object) -> int:
    """The card's NUMA node, -1 when NVML does not know (or is too old)."""
    try:
        return int(pynvml.nvmlDeviceGetNumaNodeId(handle))
    except (pynvml.NVMLError, AttributeError):
        return -1


def discover() -> tuple[Card, ...]:
    """Every card NVML sees, in index order, all healthy (health comes from ``health``).
    memory_mib: total device memory, MiB (floor). Raises DiscoveryError."""
    init()
    try:
        cards = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            cards.append(Card(
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                index=index,
                model=_text(pynvml.nvmlDeviceGetName(handle)),
                memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                healthy=True,
                numa_node=numa_node(handle),
            ))
    except pynvml.NVMLError as exc:
        raise DiscoveryError(f"NVML: {exc}") from None
    return tuple(cards)


def memory_used_bytes(uuid: str) -> int | None:
    """Device memory in use on card ``uuid`` (all processes), bytes; None when NVML fails."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except pynvml.NVMLError:
        return None


def utilization_percent(uuid: str) -> int | None:
    """The card's compute utilisation over NVML's last sample period, %; None on failure."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError:
        return None
