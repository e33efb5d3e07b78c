"""Card health from NVML XID events (nvmlDeviceRegisterEvents + nvmlEventSetWait).

A critical XID marks its card unhealthy until the agent restarts (as the NVIDIA device plugin
does); XIDs caused by an application, not the card, are ignored: 13 (graphics engine
exception), 31 (MMU fault), 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video
processor exception), 109 (context switch timeout). ``HealthWatcher`` runs the wait loop in a
thread and calls ``on_unhealthy(uuid, xid)``.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import pynvml

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def is_critical_xid(xid: int) -> bool:
    """Whether XID ``xid`` means the card itself is unhealthy."""
    return xid not in APPLICATION_XIDS


class HealthWatcher:
    """Waits for XID events on ``uuids`` and reports critical ones (module docstring)."""

    def __init__(self, uuids: list[str], on_unhealthy: Callable[[str, int], None],
                 wait_ms: int = 1000) -> None:
        self.uuids = uuids
        self.on_unhealthy = on_unhealthy
        self.wait_ms = wait_ms
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        """Start the wait loop in a daemon thread; it ends when ``stop`` is set."""
        self._thread = threading.Thread(target=self._run, args=(stop,), daemon=True,
                                        name="egpu-health")
        self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        try:
            events = pynvml.nvmlEventSetCreate()
            by_handle: dict[int, str] = {}
            for uuid in self.uuids:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError,
                                                events)
                by_handle[ctypes_address(handle)] = uuid
        except pynvml.NVMLError as exc:
            log.warning("XID events unavailable (%s): card health is not watched", exc)
            return
        while not stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait(events, self.wait_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                log.warning("nvmlEventSetWait: %s", exc)
                stop.wait(1)
                continue
            failed = by_handle.get(ctypes_address(data.device))
            xid = int(data.eventData)
            if failed and is_critical_xid(xid):
                log.warning("card %s: XID %d, marking it unhealthy", failed, xid)
                self.on_unhealthy(failed, xid)
        pynvml.nvmlEventSetFree(events)


def ctypes_address(handle: Any) -> int:
    """A device handle's pointer value (handles from different calls compare by address)."""
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value or 0
