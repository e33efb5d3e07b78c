"""Read the shares' usage history from a Prometheus (its HTTP API, /api/v1/query_range) for
``kubectl egpu advise``.

Five range queries over the window, whatever the number of workloads: memory used, the
region's peak (``max_over_time`` per step, so a peak inside a step counts), the refused
allocations counter, compute used and the cores cap, all of the node agent's container
series (egpu.contract.METRIC_CONTAINER_*). The step is the PodMonitor's 15 s interval, or
longer for a window that would pass Prometheus' 11,000 points a series (then use is each
step's mean: ``avg_over_time``). Values that are not finite (Prometheus' NaN) are dropped.
A counter's series are put in time order (an agent's roll starts a second series of the same
share, which continues the first).

Series are keyed by ``(namespace, pod, container)``; a card's UUID keeps a share's cards
apart. A claim's series shared by several pods names no pod (node_agent.metrics.collector)
and is left out here: no one workload owns it.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from egpu.contract import (
    METRIC_CONTAINER_COMPUTE_USED,
    METRIC_CONTAINER_CORES_LIMIT,
    METRIC_CONTAINER_MEMORY_PEAK,
    METRIC_CONTAINER_MEMORY_REFUSED,
    METRIC_CONTAINER_MEMORY_USED,
)

MIB = 1 << 20
SCRAPE_INTERVAL_S = 15  # the PodMonitors' interval (manifests/monitoring)
MAX_POINTS = 11000  # Prometheus refuses a range query of more points per series
TIMEOUT_S = 60.0
AGENT_WINDOW_S = 3600.0  # what a node agent keeps (node_agent/metrics/window.py)

Key = tuple[str, str, str]  # namespace, pod, container
Samples = list[tuple[float, float]]  # (unix s, value)


class HistoryError(RuntimeError):
    """Prometheus could not be reached or refused the query; the message says which."""


@dataclass
class ContainerHistory:
    """One container's series: per card UUID, memory used and peak (MiB), refused (count),
    compute used (%) and the cores cap (%)."""

    memory: dict[str, Samples] = field(default_factory=dict)
    peak: dict[str, Samples] = field(default_factory=dict)
    refused: dict[str, Samples] = field(default_factory=dict)
    compute: dict[str, Samples] = field(default_factory=dict)
    cores: dict[str, Samples] = field(default_factory=dict)


def step_s(window_s: float) -> int:
    """The query step (s): the scrape interval, or the least that stays under MAX_POINTS."""
    return max(SCRAPE_INTERVAL_S, math.ceil(window_s / (MAX_POINTS - 1)))


# field of ContainerHistory -> (the node agent's metric, scale to the field's unit, how a
# query step longer than the scrape interval reduces its samples: the peak keeps the
# highest, use keeps the mean so that percentiles stay percentiles of use, not of maxima)
FIELDS: dict[str, tuple[str, float, str]] = {
    "memory": (METRIC_CONTAINER_MEMORY_USED, 1 / MIB, "avg_over_time"),
    "peak": (METRIC_CONTAINER_MEMORY_PEAK, 1 / MIB, "max_over_time"),
    "refused": (METRIC_CONTAINER_MEMORY_REFUSED, 1.0, ""),
    "compute": (METRIC_CONTAINER_COMPUTE_USED, 1.0, "avg_over_time"),
    "cores": (METRIC_CONTAINER_CORES_LIMIT, 1.0, ""),
}


def queries(step: int, namespace: str | None) -> dict[str, tuple[str, float]]:
    """field of ContainerHistory -> (PromQL, scale to the field's unit)."""
    match = f'{{namespace="{namespace}"}}' if namespace else ""
    return {name: (f"{reduce}({metric}{match}[{step}s])" if reduce else f"{metric}{match}",
                   scale) for name, (metric, scale, reduce) in FIELDS.items()}


def http_getter(base_url: str) -> Callable[[str, Mapping[str, str]], Any]:
    """GET ``<base_url><path>?<params>`` and return the decoded JSON ``data`` of a Prometheus
    API answer. Raises HistoryError naming the URL and Prometheus' own error."""
    def get(path: str, params: Mapping[str, str]) -> Any:
        url = f"{base_url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise HistoryError(f"{base_url}: {exc.code} {detail}") from None
        except (OSError, ValueError) as exc:
            raise HistoryError(f"cannot read {base_url}: {exc}") from None
        if body.get("status") != "success":
            raise HistoryError(f"{base_url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]
    return get


def fetch(get: Callable[[str, Mapping[str, str]], Any], start: float, end: float,
          namespace: str | None = None) -> dict[Key, ContainerHistory]:
    """Every container's history between ``start`` and ``end`` (unix s) through ``get``
    (``http_getter``). Raises HistoryError."""
    step = step_s(end - start)
    out: dict[Key, ContainerHistory] = {}
    for name, (query, scale) in queries(step, namespace).items():
        data = get("/api/v1/query_range", {"query": query, "start": f"{start:.3f}",
                                           "end": f"{end:.3f}", "step": f"{step}s"})
        add_matrix(out, name, scale, data.get("result") or [])
    settle_counters(out, start, step)
    return out


def settle_counters(out: dict[Key, ContainerHistory], start: float, step: float) -> None:
    """Put each share's refused-counter samples in time order (several series of one share,
    e.g. across a node agent's roll, continue each other) and, when the share's first sample
    is later than the window's start by more than two steps (the container started inside
    the window, its region's counter at 0), begin it with a 0: refusals before its first
    scrape are an increase too."""
    for history in out.values():
        for uuid, samples in history.refused.items():
            samples.sort()
            if samples and samples[0][0] > start + 2 * step and samples[0][1] > 0:
                samples.insert(0, (samples[0][0] - step, 0.0))
            history.refused[uuid] = samples


def add_matrix(out: dict[Key, ContainerHistory], name: str, scale: float,
               result: list[Any], namespace: str | None = None) -> None:
    """Add the series of a Prometheus matrix ``result`` (``[{"metric": labels, "values":
    [[t, "v"], ...]}]``, as /api/v1/query_range and the node agent's /usage-history answer)
    to field ``name`` of ``out``, scaled to its unit; values that are not finite dropped;
    series of other namespaces than ``namespace`` (when given) left out. Call
    ``settle_counters`` once every series is in."""
    for series in result:
        labels = series.get("metric") or {}
        pod = labels.get("pod", "")
        if not pod or (namespace and labels.get("namespace") != namespace):
            continue
        key = (labels.get("namespace", ""), pod, labels.get("container", ""))
        samples = [(float(t), float(v) * scale) for t, v in series.get("values") or []
                   if math.isfinite(float(v))]
        history = out.setdefault(key, ContainerHistory())
        getattr(history, name).setdefault(labels.get("UUID", ""), []).extend(samples)


def add_agent_window(out: dict[Key, ContainerHistory], document: Any,
                     namespace: str | None = None) -> None:
    """Add a node agent's /usage-history answer (node_agent/metrics/window.py: a matrix of
    its container series, each named by ``__name__``) to ``out``. Raises HistoryError for an
    answer of another shape."""
    try:
        data = document["data"]
        result = data["result"]
        start, step = float(data["start"]), float(data["stepSeconds"])
    except (KeyError, TypeError, ValueError):
        raise HistoryError("a node agent's /usage-history answer is not a usage window") from None
    for name, (metric, scale, _reduce) in FIELDS.items():
        add_matrix(out, name, scale, [s for s in result
                                      if (s.get("metric") or {}).get("__name__") == metric],
                   namespace)
    settle_counters(out, start, step)
