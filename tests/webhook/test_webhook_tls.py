"""TLS: the served certificate is reloaded when the files change, without a restart; a pair
that does not load leaves the old one served."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from certs.issue import Pair, create_ca, create_serving, write_atomic, write_bundle
from webhook.server import Settings, create_app
from webhook.tls import CertReloader

from .support import admission_review, container, make_pod


def _client_context(*cas: Pair) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata="".join(ca.cert_pem.decode() for ca in cas))
    return context


async def _served_serial(port: int, context: ssl.SSLContext) -> int:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[int, Settings, Pair, Pair]]:
    ca = create_ca()
    first = create_serving(ca, ["127.0.0.1", "localhost"])
    write_bundle(tmp_path, ca, first)
    reloader = CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    settings = Settings(tls=reloader, reload_interval_s=0.05)
    # a handshake the server failed on purpose can leave its connection open: the teardown
    # must not wait aiohttp's 60 s default for it (it took 25 s of `make test`)
    runner = web.AppRunner(create_app(settings), shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port, settings, ca, first
    finally:
        await runner.cleanup()


async def _wait_for_serial(port: int, context: ssl.SSLContext, serial: int) -> None:
    deadline = time.monotonic() + 10
    while await _served_serial(port, context) != serial:
        assert time.monotonic() < deadline, "the new certificate was never served"
        await asyncio.sleep(0.05)


async def test_cert_reload_new_handshakes_get_the_new_cert(
        served: tuple[int, Settings, Pair, Pair], tmp_path: Path) -> None:
    port, settings, ca, first = served
    context = _client_context(ca)
    assert await _served_serial(port, context) == first.cert.serial_number
    # a review over TLS works, on a connection opened before the rotation
    connector = aiohttp.TCPConnector(ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:
        url = f"https://127.0.0.1:{port}/mutate"
        body = admission_review(make_pod(container(limits={"egpu.io/gpu": "1"})))
        async with session.post(url, json=body) as resp:
            assert resp.status == 200
        second = create_serving(ca, ["127.0.0.1"])
        write_bundle(tmp_path, ca, second)
        await _wait_for_serial(port, context, second.cert.serial_number)
        async with session.post(url, json=body) as resp:  # the kept-alive connection works on
            assert resp.status == 200
    assert settings.tls is not None and settings.tls.reloads == 1
    metrics = settings.metrics.registry
    assert metrics.get_sample_value("egpu_webhook_certificate_reloads_total",
                                    {"result": "ok"}) == 1.0
    expiry = metrics.get_sample_value("egpu_webhook_certificate_expiry_timestamp_seconds")
    assert expiry == second.cert.not_valid_after_utc.timestamp()


async def test_cert_rotation_to_a_new_ca(
        served: tuple[int, Settings, Pair, Pair], tmp_path: Path) -> None:
    port, _, ca, _ = served
    new_ca = create_ca("next-ca")
    second = create_serving(new_ca, ["127.0.0.1"], key_type="rsa-2048")
    write_bundle(tmp_path, new_ca, second)
    await _wait_for_serial(port, _client_context(ca, new_ca), second.cert.serial_number)
    with pytest.raises(ssl.SSLCertVerificationError):
        await _served_serial(port, _client_context(ca))


async def test_mismatched_pair_keeps_the_old_cert(
        served: tuple[int, Settings, Pair, Pair], tmp_path: Path) -> None:
    port, settings, ca, first = served
    other = create_serving(ca, ["127.0.0.1"])
    write_atomic(tmp_path / "tls.key", other.key_pem, 0o600)  # key without its certificate
    deadline = time.monotonic() + 10
    registry = settings.metrics.registry
    while not registry.get_sample_value("egpu_webhook_certificate_reloads_total",
                                        {"result": "error"}):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert await _served_serial(port, _client_context(ca)) == first.cert.serial_number
    write_atomic(tmp_path / "tls.crt", other.cert_pem)  # now the pair matches
    await _wait_for_serial(port, _client_context(ca), other.cert.serial_number)


def test_tls_minimum_version_is_1_2(tmp_path: Path) -> None:
    ca = create_ca()
    write_bundle(tmp_path, ca, create_serving(ca, ["localhost"]))
    reloader = CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    assert reloader.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert reloader.check().changed is False


def test_missing_files_fail_at_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        CertReloader(str(tmp_path / "nope.crt"), str(tmp_path / "nope.key"))


async def test_certificate_written_before_its_key_never_breaks_handshakes(
        served: tuple[int, Settings, Pair, Pair], tmp_path: Path) -> None:
    port, settings, ca, first = served
    other = create_serving(ca, ["127.0.0.1"])
    write_atomic(tmp_path / "tls.crt", other.cert_pem)  # the key follows later
    registry = settings.metrics.registry
    deadline = time.monotonic() + 10
    while not registry.get_sample_value("egpu_webhook_certificate_reloads_total",
                                        {"result": "error"}):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert await _served_serial(port, _client_context(ca)) == first.cert.serial_number
    write_atomic(tmp_path / "tls.key", other.key_pem, 0o600)
    await _wait_for_serial(port, _client_context(ca), other.cert.serial_number)
