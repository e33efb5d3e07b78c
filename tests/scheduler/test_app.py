"""The HTTP edge through aiohttp's test client: wire keys, status codes, sync gate, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from egpu.config import Config
from scheduler.app import make_app
from scheduler.extender import Extender
from scheduler.state import ClusterState
from tests.scheduler.helpers import NOW, cards, limits, node, pod
from tests.scheduler.test_extender import FakeApi

CONFIG = Config(shares_per_card=4)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[TestClient, FakeApi, asyncio.Event]]:
    state = ClusterState(CONFIG)
    state.replace_nodes([node("a", cards(1, memory=24576)), node("b", cards(1, "Tesla T4", 15360))])
    api = FakeApi(state)
    synced = asyncio.Event()
    app = make_app(Extender(state, CONFIG, api, clock=lambda: NOW), synced, sync_timeout_s=0.2)
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, api, synced
    await client.close()


async def test_healthz_waits_for_sync(setup: tuple[TestClient, FakeApi, asyncio.Event]) -> None:
    client, _, synced = setup
    assert (await client.get("/healthz")).status == 503
    p = pod()
    r = await client.post("/filter", json={"Pod": p, "NodeNames": ["a"]})
    assert "not synced" in (await r.json())["Error"]
    synced.set()
    assert (await client.get("/healthz")).status == 200


async def test_filter_prioritize_bind_round_trip(
    setup: tuple[TestClient, FakeApi, asyncio.Event],
) -> None:
    client, api, synced = setup
    synced.set()
    p = api.add(pod("p", containers=[limits(memory=20000, cores=50)]))
    body = {"Pod": p, "NodeNames": ["a", "b"]}
    r = await client.post("/filter", json=body)
    assert r.status == 200
    result = await r.json()
    assert result["NodeNames"] == ["a"] and result["Error"] == ""
    assert set(result["FailedAndUnresolvableNodes"]) == {"b"}
    r = await client.post("/prioritize", json={"Pod": p, "NodeNames": ["a"]})
    assert await r.json() == [{"Host": "a", "Score": 8}]
    meta = p["metadata"]
    r = await client.post("/bind", json={"PodName": meta["name"], "PodNamespace": "default",
                                         "PodUID": meta["uid"], "Node": "a"})
    assert await r.json() == {"Error": ""}
    assert api.pods[("default", "p")]["spec"]["nodeName"] == "a"
    text = await (await client.get("/metrics")).text()
    assert 'egpu_extender_requests_total{outcome="ok",verb="bind"} 1.0' in text
    assert "egpu_extender_request_seconds_bucket" in text
    assert "egpu_extender_card_booked_mib{" in text and "} 20000.0" in text


async def test_malformed_requests_answer_400(
    setup: tuple[TestClient, FakeApi, asyncio.Event],
) -> None:
    client, _, synced = setup
    synced.set()
    r = await client.post("/filter", data=b"{not json")
    assert r.status == 400 and "malformed filter" in (await r.json())["Error"]
    r = await client.post("/filter", json=[1, 2])
    assert r.status == 400
    r = await client.post("/bind", json={"PodName": "x"})
    assert r.status == 400


async def test_bind_error_is_in_the_result(
    setup: tuple[TestClient, FakeApi, asyncio.Event],
) -> None:
    client, api, synced = setup
    synced.set()
    api.fail_bind = True
    p = api.add(pod("p"))
    meta = p["metadata"]
    r = await client.post("/bind", json={"PodName": "p", "PodNamespace": "default",
                                         "PodUID": meta["uid"], "Node": "a"})
    assert r.status == 200 and "binding failed" in (await r.json())["Error"]


@pytest.mark.parametrize("body", [
    b"[" * 100000 + b"]" * 100000,
    b'{"Pod":' + b"[" * 100000 + b"]" * 100000 + b"}",
    b'{"Pod": ' + b'{"a":' * 50000 + b"1" + b"}" * 50000 + b', "NodeNames": ["a"]}',
    b'{"Pod": {}, "NodeNames": ' + b"1" * 5000 + b"}",
    b"\xff\xfe",
    b'{"Pod": {}, "NodeNames": 5}',
    b'{"Pod": {"spec": {"containers": [5]}}, "Nodes": {"items": [{"metadata": null}]}}',
])
async def test_any_body_the_extender_cannot_parse_answers_400(
    setup: tuple[TestClient, FakeApi, asyncio.Event], body: bytes,
) -> None:
    """F9: deeply nested JSON (RecursionError) and integers too long to convert answered
    500; every unparsable body is the client's mistake, 400."""
    client, _, synced = setup
    synced.set()
    for verb in ("filter", "prioritize", "bind"):
        r = await client.post(f"/{verb}", data=body)
        assert r.status in (200, 400), (verb, r.status, await r.text())
        if r.status == 400:
            assert f"malformed {verb} request" in (await r.json())["Error"]
    r = await client.post("/filter", data=body)
    assert r.status == 400


async def test_a_5000_digit_quantity_is_an_unresolvable_request_not_a_500(
    setup: tuple[TestClient, FakeApi, asyncio.Event],
) -> None:
    client, _, synced = setup
    synced.set()
    p = pod(containers=[{"egpu.io/gpu": 1}])
    p["spec"]["containers"][0]["resources"]["limits"]["egpu.io/gpu-cores"] = "1" * 5000
    r = await client.post("/filter", json={"Pod": p, "NodeNames": ["a"]})
    assert r.status == 200
    (reason,) = (await r.json())["FailedAndUnresolvableNodes"].values()
    assert f"egpu.io/gpu-cores='{'1' * 40}...' is not allowed (not a whole number (longer " \
           "than 40 characters))" in reason


async def test_the_metrics_listener_never_binds() -> None:
    """With --metrics-port (the deployment), filter / prioritize / bind are answered on the
    loopback listener only: a pod on the cluster network reaching the metrics port cannot
    have the extender bind a pod (bypassing kube-scheduler's filters)."""
    import socket

    from aiohttp import ClientSession, web

    state = ClusterState(CONFIG)
    state.replace_nodes([node("a", cards(1, memory=24576))])
    api = FakeApi(state)
    verbs_sock = socket.create_server(("127.0.0.1", 0))
    metrics_sock = socket.create_server(("127.0.0.1", 0))
    metrics_port = metrics_sock.getsockname()[1]
    app = make_app(Extender(state, CONFIG, api, clock=lambda: NOW), read_only_port=metrics_port)
    runner = web.AppRunner(app)
    await runner.setup()
    for sock in (verbs_sock, metrics_sock):
        await web.SockSite(runner, sock).start()
    p = api.add(pod("p"))
    bind = {"PodName": "p", "PodNamespace": "default", "PodUID": p["metadata"]["uid"],
            "Node": "a"}
    verbs = f"http://127.0.0.1:{verbs_sock.getsockname()[1]}"
    metrics = f"http://127.0.0.1:{metrics_port}"
    try:
        async with ClientSession() as http:
            for path in ("/bind", "/filter", "/prioritize"):
                async with http.post(metrics + path, json=bind) as r:
                    assert r.status == 404, path
            assert "nodeName" not in api.pods[("default", "p")]["spec"]
            for path in ("/metrics", "/healthz"):
                async with http.get(metrics + path) as r:
                    assert r.status == 200, path
            async with http.post(verbs + "/bind", json=bind) as r:
                assert await r.json() == {"Error": ""}
            assert api.pods[("default", "p")]["spec"]["nodeName"] == "a"
    finally:
        await runner.cleanup()


async def test_a_node_with_an_absurd_inventory_does_not_fail_the_filter_request() -> None:
    """/tmp/review_placement/r5: one node's card of 10**400 MiB answered HTTP 500 for every
    pod that opts into memory oversubscription."""
    from egpu.records import Card
    state = ClusterState(CONFIG)
    state.replace_nodes([node("good", cards(2)),
                         node("bad", [Card("GPU-x", 0, "NVIDIA A10", 10**400)])])
    app = make_app(Extender(state, CONFIG, None, clock=lambda: NOW))
    async with TestClient(TestServer(app)) as client:
        p = pod(containers=[limits(memory=1000)],
                annotations={"egpu.io/memory-oversubscription": "true"})
        r = await client.post("/filter", json={"Pod": p, "NodeNames": ["good", "bad"]})
        assert r.status == 200
        result = await r.json()
    assert result["NodeNames"] == ["good"]
    assert "memory_mib" in result["FailedAndUnresolvableNodes"]["bad"]
