"""The HTTP edge through the aiohttp test client: routes, status codes, limits, metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from egpu.config import Config, config_generation
from webhook import server
from webhook.server import ConfigSource, Settings, check_files, create_app

from .support import admission_review, container, make_pod

GPU_POD = make_pod(container(limits={"egpu.io/gpu": "1", "egpu.io/gpu-memory": "3000"}))


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(create_app(Settings(max_body_bytes=64 * 1024)))) as c:
        yield c


async def test_mutate_answers_an_admission_review(client: TestClient) -> None:
    resp = await client.post("/mutate", json=admission_review(GPU_POD, uid="u-9"))
    assert resp.status == 200 and resp.content_type == "application/json"
    body = await resp.json()
    assert body["response"]["uid"] == "u-9" and body["response"]["patchType"] == "JSONPatch"


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe", b"[]", b'{"kind": 1}', b"1" * 5000,
                                  b"[" * 50_000, b'{"a":' * 5000])
async def test_bad_bodies_get_400_with_reason(client: TestClient, body: bytes) -> None:
    resp = await client.post("/mutate", data=body)
    assert resp.status == 400
    assert (await resp.json())["reason"]


@pytest.mark.parametrize("depth", [900, 980, 2000])
async def test_deeply_nested_review_never_5xx(client: TestClient, depth: int) -> None:
    body = json.dumps(admission_review(GPU_POD))
    nested = "[" * depth + "]" * depth
    body = body.replace('"image": "busybox:1.36"', f'"image": "busybox:1.36", "x": {nested}')
    resp = await client.post("/mutate", data=body)
    assert resp.status in (200, 400)


async def test_body_over_the_limit_gets_413(client: TestClient) -> None:
    resp = await client.post("/mutate", data=b" " * (65 * 1024))
    assert resp.status == 413
    assert "64" in (await resp.json())["reason"] or "65536" in (await resp.json())["reason"]


async def test_get_mutate_is_405(client: TestClient) -> None:
    assert (await client.get("/mutate")).status == 405


async def test_health_ready_metrics(client: TestClient) -> None:
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    await client.post("/mutate", json=admission_review(GPU_POD))
    await client.post("/mutate", json=admission_review(
        make_pod(container(limits={"egpu.io/gpu": "0"}))))
    await client.post("/mutate", json=admission_review(make_pod(container())))
    await client.post("/mutate", data=b"nope")
    resp = await client.get("/metrics")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    text = await resp.text()
    for line in ('egpu_webhook_requests_total{result="patched"} 1.0',
                 'egpu_webhook_requests_total{result="denied"} 1.0',
                 'egpu_webhook_requests_total{result="allowed"} 1.0',
                 'egpu_webhook_requests_total{result="invalid"} 1.0',
                 'egpu_webhook_denials_total{reason="invalid-request"} 1.0',
                 "egpu_webhook_review_seconds_count 3.0"):
        assert line in text, line


async def test_readyz_503_when_not_ready() -> None:
    settings = Settings()
    async with TestClient(TestServer(create_app(settings))) as client:
        settings.ready = False
        assert (await client.get("/readyz")).status == 503


async def test_a_bug_is_answered_as_a_denial_not_a_5xx(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(server, "decide", boom)
    resp = await client.post("/mutate", json=admission_review(GPU_POD, uid="u-bug"))
    assert resp.status == 200
    body = await resp.json()
    assert body["response"] == {"uid": "u-bug", "allowed": False, "status": {
        "code": 500, "reason": "InternalError",
        "message": "egpu webhook: internal error (see the webhook's log)"}}
    resp = await client.post("/mutate", data=json.dumps({"no": "uid"}))
    assert resp.status == 400


def test_config_reloaded_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("schedulerName: one\n")
    source = ConfigSource(str(path))
    settings = Settings(config=source)
    assert source.config.scheduler_name == "one"
    path.write_text("schedulerName: two-two\n")
    check_files(settings)
    assert source.config.scheduler_name == "two-two"
    path.write_text("schedulerName: [bad]\n")  # invalid: kept the previous one
    check_files(settings)
    assert source.config.scheduler_name == "two-two"


async def test_the_webhook_says_which_config_it_runs_and_when_the_file_is_bad(
        tmp_path: Path) -> None:
    """egpu_config_info{part="webhook"}: the generation of the file in use, ``last-good``
    while a bad edit is kept out, and back to ``file`` when the edit is fixed. Bug caught: the
    webhook, the one part that reloads its config live, had no egpu_config_info, so a bad
    ConfigMap edit it refused fired no EgpuConfigNotApplied alert."""
    path = tmp_path / "config.yaml"
    path.write_text("schedulerName: one\n")
    settings = Settings(config=ConfigSource(str(path), keep_dir=str(tmp_path)))

    def series() -> list[tuple[str, str]]:
        text = settings.metrics.registry.get_sample_value
        return [(g, s) for g in (config_generation("schedulerName: one\n"),
                                 config_generation("schedulerName: two\n"))
                for s in ("file", "last-good")
                if text("egpu_config_info", {"part": "webhook", "generation": g, "source": s})]

    async with TestClient(TestServer(create_app(settings))) as web_client:
        assert series() == [(config_generation("schedulerName: one\n"), "file")]
        path.write_text("schedulerName: [bad]\n")
        check_files(settings)
        assert series() == [(config_generation("schedulerName: one\n"), "last-good")]
        path.write_text("schedulerName: two\n")
        check_files(settings)
        assert series() == [(config_generation("schedulerName: two\n"), "file")]
        text = await (await web_client.get("/metrics")).text()
        assert 'egpu_config_info{generation="' in text and 'part="webhook"' in text


def test_config_source_without_file_uses_given_config() -> None:
    source = ConfigSource(None, Config(scheduler_name="x"))
    assert source.config.scheduler_name == "x" and source.check() is False
