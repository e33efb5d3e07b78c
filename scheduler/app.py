"""The extender's HTTP edge (aiohttp): JSON in, ``Extender`` verb, JSON out.

Routes (kube-scheduler calls ``<urlPrefix>/<verb>`` with POST; see ``scheduler.wire``):

- ``POST /filter``      ExtenderArgs -> ExtenderFilterResult
- ``POST /prioritize``  ExtenderArgs -> HostPriorityList
- ``POST /bind``        ExtenderBindingArgs -> ExtenderBindingResult
- ``GET /healthz``      200 "ok" once the cluster view is synced, else 503
- ``GET /metrics``      Prometheus text

Verbs wait (up to ``sync_timeout_s``) for the first sync of the cluster view: an extender that
just restarted must not answer from an empty view. A malformed body answers 400; anything the
verb cannot do is reported in the result's ``Error`` field, as the protocol expects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scheduler.extender import Extender

log = logging.getLogger("egpu.scheduler.app")

EXTENDER: web.AppKey[Extender] = web.AppKey("extender", Extender)
SYNCED: web.AppKey[asyncio.Event] = web.AppKey("synced", asyncio.Event)
SYNC_TIMEOUT: web.AppKey[float] = web.AppKey("sync_timeout_s", float)


class Metrics:
    """The extender's Prometheus metrics, in their own registry."""

    def __init__(self, extender: Extender) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("egpu_extender_requests", "Extender calls by verb and outcome",
                                ["verb", "outcome"], registry=self.registry)
        self.seconds = Histogram(
            "egpu_extender_request_seconds", "Time to answer an extender call", ["verb"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
            registry=self.registry)
        self.registry.register(_StateCollector(extender))


class _StateCollector:
    """Per-card bookings of the cluster view (MiB, cores %, slots), read at scrape time."""

    def __init__(self, extender: Extender) -> None:
        self.extender = extender

    def collect(self) -> Any:
        labels = ["Hostname", "UUID"]
        memory = GaugeMetricFamily("egpu_extender_card_booked_mib",
                                   "MiB booked on a card (extender view)", labels=labels)
        cores = GaugeMetricFamily("egpu_extender_card_booked_cores_percent",
                                  "Cores % booked on a card (extender view)", labels=labels)
        slots = GaugeMetricFamily("egpu_extender_card_used_slots",
                                  "Share slots used on a card (extender view)", labels=labels)
        held = CounterMetricFamily(
            "egpu_extender_bind_gate_held", "Binds the gate held until the node's kubelet "
            "admitted a pod that could be confused with them (docs/node.md)")
        held.add_metric([], self.extender.gate_waits)
        yield held
        state = self.extender.state
        for node in state.node_names:
            for uuid, used in state.usage(node).items():
                memory.add_metric([node, uuid], used.memory_mib)
                cores.add_metric([node, uuid], used.cores)
                slots.add_metric([node, uuid], used.slots)
        yield from (memory, cores, slots)


METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)


def _verb(name: str, run: Callable[[Extender, Any], Awaitable[Any] | Any]) -> Any:
    async def handler(request: web.Request) -> web.Response:
        metrics = request.app[METRICS]
        started = time.perf_counter()
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("expected a JSON object")
        except RecursionError:  # nested deeper than Python's stack: no real request does
            metrics.requests.labels(name, "bad-request").inc()
            return web.json_response({"Error": f"malformed {name} request: nested too "
                                               "deeply"}, status=400)
        except ValueError as exc:  # bad JSON, bad UTF-8, an integer too long to convert
            metrics.requests.labels(name, "bad-request").inc()
            return web.json_response({"Error": f"malformed {name} request: {exc}"}, status=400)
        try:
            await asyncio.wait_for(request.app[SYNCED].wait(), request.app[SYNC_TIMEOUT])
        except TimeoutError:
            metrics.requests.labels(name, "not-synced").inc()
            return web.json_response({"Error": "extender not synced with the API yet"})
        try:
            result = run(request.app[EXTENDER], body)
            if asyncio.iscoroutine(result):
                result = await result
        except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
            # whatever a body that parsed as JSON but is not a request can raise
            metrics.requests.labels(name, "bad-request").inc()
            what = "nested too deeply" if isinstance(exc, RecursionError) else repr(exc)[:200]
            return web.json_response({"Error": f"malformed {name} request: {what}"}, status=400)
        outcome = "error" if isinstance(result, dict) and result.get("Error") else "ok"
        metrics.requests.labels(name, outcome).inc()
        metrics.seconds.labels(name).observe(time.perf_counter() - started)
        return web.Response(body=json.dumps(result, separators=(",", ":")),
                            content_type="application/json")

    return handler


async def healthz(request: web.Request) -> web.Response:
    """200 once synced, 503 before."""
    if request.app[SYNCED].is_set():
        return web.Response(text="ok")
    return web.Response(text="not synced", status=503)


async def metrics_view(request: web.Request) -> web.Response:
    """Prometheus text format."""
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


READ_ONLY_PATHS = frozenset({"/metrics", "/healthz"})


def _read_only_listener(port: int) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: on the listener at local ``port`` (the metrics listener, reachable from
    the pod network) only /metrics and /healthz; filter, prioritize and bind are served on
    the other listener alone (loopback: the kube-scheduler in the same pod)."""

    @web.middleware
    async def middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                         ) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        if sockname and sockname[1] == port and request.path not in READ_ONLY_PATHS:
            raise web.HTTPNotFound(text="this listener serves /metrics and /healthz only\n")
        return await handler(request)

    return middleware


def make_app(extender: Extender, synced: asyncio.Event | None = None, *,
             sync_timeout_s: float = 20.0,
             cleanup_ctx: list[Callable[[web.Application], AsyncIterator[None]]] | None = None,
             read_only_port: int = 0,
             ) -> web.Application:
    """Build the application. ``synced``: set when the view is usable (None: already is).

    ``cleanup_ctx``: context generators that open and close resources (watch threads, the API
    client) with the application. ``read_only_port``: a local port on which only /metrics and
    /healthz are answered (404 otherwise); 0: none.
    """
    middlewares = [_read_only_listener(read_only_port)] if read_only_port else []
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
    app[EXTENDER] = extender
    if synced is None:
        synced = asyncio.Event()
        synced.set()
    app[SYNCED] = synced
    app[SYNC_TIMEOUT] = sync_timeout_s
    app[METRICS] = Metrics(extender)
    app.router.add_post("/filter", _verb("filter", lambda e, b: e.filter(b)))
    app.router.add_post("/prioritize", _verb("prioritize", lambda e, b: e.prioritize(b)))
    app.router.add_post("/bind", _verb("bind", lambda e, b: e.bind(b)))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_view)
    app.cleanup_ctx.extend(cleanup_ctx or [])
    return app
