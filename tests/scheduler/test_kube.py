"""scheduler.kube against a small fake API server: list pages, watch, 410 relist, bind's writes."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as k8s_client

from egpu.config import Config
from scheduler.extender import BindError
from scheduler.kube import KubeApi, RawApi, Watcher
from scheduler.state import ClusterState
from tests.scheduler.helpers import cards, limits, node, pod


class FakeApiServer:
    """Serves /api/v1/{nodes,pods} (paged lists, scripted watches) and records writes."""

    def __init__(self) -> None:
        self.items: dict[str, list[dict[str, Any]]] = {"nodes": [], "pods": []}
        self.watch_events: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}
        self.lists: dict[str, int] = {"nodes": 0, "pods": 0}
        self.writes: list[tuple[str, str, str, Any]] = []
        self.peers: set[Any] = set()  # the client's (address, port) of each write
        self.pod_status = 200
        self.open_watches: list[tuple[Any, asyncio.Queue[Any]]] = []  # transport, events
        self.stopped = False
        self.loop = asyncio.new_event_loop()
        self.port = 0

    async def collection(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        if request.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            queue = self.watch_events.setdefault(kind, asyncio.Queue())
            watch = (request.transport, queue)
            self.open_watches.append(watch)
            try:
                while (event := await queue.get()) is not None:
                    await response.write(json.dumps(event).encode() + b"\n")
            finally:
                self.open_watches.remove(watch)
            return response
        self.lists[kind] += 1
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 1000)
        page = self.items[kind][start:start + limit]
        more = start + limit < len(self.items[kind])
        meta = {"resourceVersion": "10", **({"continue": str(start + limit)} if more else {})}
        return web.json_response({"items": page, "metadata": meta})

    async def write(self, request: web.Request) -> web.Response:
        body = await request.json()
        if request.transport is not None:
            self.peers.add(request.transport.get_extra_info("peername"))
        self.writes.append((request.method, request.path, request.content_type, body))
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    async def read(self, request: web.Request) -> web.Response:
        if self.pod_status != 200:
            return web.json_response({"message": "not found"}, status=self.pod_status)
        return web.json_response(pod("p", uid="u1"))

    def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/{kind}", self.collection)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self.read)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self.write)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self.write)
        runner = self.runner = web.AppRunner(app)
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(10)

    def stop(self) -> None:
        """Close every connection, open watches included, then stop the server's loop: a
        watch left open would keep its client's thread blocked until its read timeout."""
        if self.stopped:
            return
        self.stopped = True

        async def close() -> None:
            for transport, queue in list(self.open_watches):
                if transport is not None:
                    transport.close()  # the client's read ends now
                queue.put_nowait(None)  # and so does the handler
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)

    def push(self, kind: str, event: dict[str, Any] | None) -> None:
        def put() -> None:
            self.watch_events.setdefault(kind, asyncio.Queue()).put_nowait(event)

        self.loop.call_soon_threadsafe(put)


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer()
    fake.start()
    yield fake
    fake.stop()


def raw(server: FakeApiServer) -> RawApi:
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.port}"
    return RawApi(k8s_client.ApiClient(configuration))


def test_list_all_follows_continue_tokens(server: FakeApiServer) -> None:
    server.items["nodes"] = [node(f"n{i}", cards(1)) for i in range(1201)]
    items, version = raw(server).list_all("/api/v1/nodes")
    assert len(items) == 1201 and version == "10"


async def _until(check: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_watcher_lists_watches_and_relists_on_410(server: FakeApiServer) -> None:
    from egpu.records import Allocation, CardShare, ContainerAllocation

    server.items["nodes"] = [node("n", cards(1))]
    alloc = Allocation((ContainerAllocation("c0", False, (CardShare("GPU-0", 0, 5000, 0),)),),
                       node="n").encode()
    booked = pod("a", uid="ua", containers=[limits(memory=5000)], node="n", allocation=alloc)
    server.items["pods"] = [booked]
    state = ClusterState(Config())
    watcher = Watcher(raw(server), state, asyncio.get_running_loop())
    watcher.start()
    try:
        await _watch_and_relist(server, state, watcher, alloc)
    finally:
        watcher.stop()
        server.stop()  # ends the open watches, so the threads see the stop now
        await _until(lambda: not watcher.running())


async def _watch_and_relist(server: FakeApiServer, state: ClusterState, watcher: Watcher,
                            alloc: str) -> None:
    await asyncio.wait_for(watcher.synced.wait(), 5)
    assert state.usage("n")["GPU-0"].memory_mib == 5000
    second = pod("b", uid="ub", containers=[limits(memory=1000)], node="n",
                 allocation=alloc.replace("5000", "1000"))
    server.push("pods", {"type": "ADDED", "object": second})
    await _until(lambda: state.usage("n")["GPU-0"].memory_mib == 6000)
    # a DELETED event whose object has no annotations still releases the booking (by uid)
    server.push("pods", {"type": "DELETED", "object": {"metadata": {"uid": "ua"}}})
    await _until(lambda: state.usage("n")["GPU-0"].memory_mib == 1000)
    # 410 Gone: list again; the list no longer has b
    server.items["pods"] = []
    server.push("pods", {"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    await _until(lambda: state.usage("n")["GPU-0"].memory_mib == 0)
    assert server.lists["pods"] == 2
    # a node annotation change arrives through the node watch
    server.push("nodes", {"type": "MODIFIED", "object": node("n", cards(2))})
    await _until(lambda: len(state.node("n").cards) == 2)


async def test_bind_writes(server: FakeApiServer) -> None:
    api = KubeApi(raw(server))
    await api.bind("ns", "p", "u1", "n", {"egpu.io/allocation": "ALLOC"})
    await api.bind("ns", "q", "u2", "n")
    (m1, p1, ct1, b1), (_, p2, _, b2) = server.writes
    assert (m1, p1, ct1) == ("POST", "/api/v1/namespaces/ns/pods/p/binding", "application/json")
    assert b1["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n"}
    assert b1["metadata"] == {"name": "p", "namespace": "ns", "uid": "u1",
                              "annotations": {"egpu.io/allocation": "ALLOC"}}
    assert p2 == "/api/v1/namespaces/ns/pods/q/binding"
    assert b2["metadata"] == {"name": "q", "namespace": "ns", "uid": "u2"}
    assert (await api.get_pod("ns", "p"))["metadata"]["uid"] == "u1"
    server.pod_status = 404
    assert await api.get_pod("ns", "p") is None
    server.pod_status = 500
    with pytest.raises(BindError, match="HTTP 500"):
        await api.get_pod("ns", "p")
    api.close()


async def test_binds_one_after_another_reuse_one_connection(server: FakeApiServer) -> None:
    """Each bind reads its answer, so its connection goes back to the pool. Bug caught: an
    answer left unread kept its connection, and every bind opened a new one (a TLS handshake
    on both sides per pod: a third of the extender's time in bench/scheduling.py)."""
    api = KubeApi(raw(server))
    for i in range(5):
        await api.bind("ns", f"p{i}", f"u{i}", "n")
    assert len(server.writes) == 5
    assert len(server.peers) == 1, server.peers
    api.close()
