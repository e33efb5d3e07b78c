"""Polling: ``wait_until(what, check, timeout, interval)``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from devcluster.errors import DevClusterError


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60,
               interval: float = 0.3) -> Any:
    """Poll ``check()`` every ``interval`` s until it returns something truthy, and return it.

    Raises DevClusterError naming ``what`` (and the last value) after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise DevClusterError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
