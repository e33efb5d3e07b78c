"""The node's cards through NVML (pynvml): UUID, index, model, memory, NUMA node.

pynvml loads ``libnvidia-ml.so.1`` through the dynamic loader (LD_LIBRARY_PATH, ld.so.cache);
``use_library(path)`` points it at a given file instead (the fake driver in tests:
fakegpu/build/libnvidia-ml.so.1) by setting ``pynvml.nvmlLib`` before ``nvmlInit``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import threading
import warnings

with warnings.catch_warnings():  # pynvml warns that nvidia-ml-py is its new name
    warnings.simplefilter("ignore", FutureWarning)
    import pynvml

from egpu import driver_limits
from egpu.records import Card

log = logging.getLogger(__name__)
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


def with_driver_limits(cards: tuple[Card, ...]) -> tuple[Card, ...]:
    """``cards`` with ``driver_memory_limit`` set where the driver takes a per-container
    memory limit (egpu.driver_limits.Nvml.supported, asked for the agent's own cgroup): a
    driver of r615 or later, cgroup v2, no MIG. Never raises: a card it cannot tell is
    without the limit (logged)."""
    init()
    try:
        nvml = driver_limits.Nvml(pynvml.nvmlLib)
        namespace = driver_limits.cgroup_dir(os.getpid())
    except driver_limits.DriverLimitError as exc:
        log.info("no driver memory limits on this node: %s", exc)
        return cards
    try:
        return tuple(dataclasses.replace(c, driver_memory_limit=nvml.supported(c.uuid, namespace))
                     for c in cards)
    finally:
        nvml.close()


def write_driver_limits(private_dir: str, cards: tuple[Card, ...]) -> None:
    """Write ``<private_dir>/driver-memory-limits.json`` (egpu.driver_limits.encode_cards:
    the cards with the driver's limit) for the runtime hook, replacing the last agent's; with
    no such card, remove it (the hook then makes no NVML call). Raises OSError."""
    from egpu.contract import DRIVER_LIMITS_FILE
    from node_agent.cdi import write_spec  # the agent's one atomic file writer

    path = os.path.join(private_dir, DRIVER_LIMITS_FILE)
    uuids = [c.uuid for c in cards if c.driver_memory_limit]
    if not uuids:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    write_spec(path, driver_limits.encode_cards(uuids), mode=0o644, folder_mode=0o711)


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
