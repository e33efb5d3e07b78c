"""The node agent's own recent window of its shares' use, for `kubectl egpu advise` on a
cluster without Prometheus (issue 26).

Every ``step_s`` the agent samples its collector's container series (memory used and peak,
refused allocations, compute used, cores cap: egpu.usage_history.FIELDS) and keeps the last
``window_s`` of them in memory (at the defaults, 240 samples a series: some 10 kB per
container). ``GET /usage-history`` on the metrics port answers them as a Prometheus matrix,
each series named by ``__name__``, so that one decoder reads both
(egpu.usage_history.add_agent_window)::

    {"status": "success", "data": {"resultType": "matrix", "start": <unix s>,
     "stepSeconds": 15, "result": [{"metric": {"__name__": ..., labels}, "values":
     [[<unix s>, "<value>"], ...]}]}}

The window starts again when the agent restarts: that is what "recent" means here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client.registry import Collector

from egpu.contract import METRIC_CONTAINER_MEMORY_REFUSED
from egpu.usage_history import AGENT_WINDOW_S, FIELDS

log = logging.getLogger("egpu-node-agent")
WINDOW_S = AGENT_WINDOW_S
STEP_S = 15.0  # as the PodMonitors' scrape interval
SAMPLED = frozenset(metric for metric, _scale, _peak in FIELDS.values())


class UsageWindow:
    """The last ``window_s`` of the container series of ``collector``, a sample every
    ``step_s`` (module docstring). Thread-safe: ``sample`` runs on the agent's sampler
    thread, ``document`` on the HTTP server's."""

    def __init__(self, collector: Collector, window_s: float = WINDOW_S,
                 step_s: float = STEP_S, clock: Callable[[], float] = time.time) -> None:
        self.collector, self.window_s, self.step_s, self.clock = (collector, window_s, step_s,
                                                                  clock)
        self.started = clock()
        self._rounds = 0
        self._series: dict[tuple[tuple[str, str], ...], deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def sample(self) -> None:
        """One sample of every container series; series older than the window dropped."""
        now = self.clock()
        rows = []
        for family in self.collector.collect():
            for s in family.samples:
                if s.name in SAMPLED:
                    rows.append(((("__name__", s.name), *sorted(s.labels.items())), s.value))
        with self._lock:
            for key, value in rows:
                kept = self._series.get(key)
                if kept is None:
                    kept = self._series[key] = deque()
                    if self._rounds and key[0][1] == METRIC_CONTAINER_MEMORY_REFUSED:
                        # a share that started since the last sample: its counter began at 0
                        # there (so a refusal before this first sample is an increase)
                        kept.append((now - self.step_s, 0.0))
                kept.append((now, value))
            self._rounds += 1
            for key in list(self._series):
                kept = self._series[key]
                while kept and kept[0][0] < now - self.window_s:
                    kept.popleft()
                if not kept:
                    del self._series[key]

    def document(self) -> dict[str, Any]:
        """The /usage-history answer (module docstring)."""
        with self._lock:
            result = [{"metric": dict(key), "values": [[t, repr(v)] for t, v in samples]}
                      for key, samples in self._series.items()]
        return {"status": "success", "data": {
            "resultType": "matrix", "start": max(self.started, self.clock() - self.window_s),
            "stepSeconds": self.step_s, "result": result}}

    def run(self, stop: threading.Event) -> None:
        """Sample every ``step_s`` until ``stop`` is set (the agent's sampler thread); a
        failed sample is skipped, never fatal."""
        while not stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # a measurement never stops the agent
                log.warning("usage window: %s", exc)
            stop.wait(self.step_s)
