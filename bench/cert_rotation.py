"""Certificate rotation under load: no review fails while the webhook's serving pair changes.

Issue 15's reliability figure. The webhook runs as its own process (HTTPS on 127.0.0.1,
``--reload-interval 0.1``) with its certificate and key laid out as a Kubernetes Secret volume
mounts them: ``tls.crt`` and ``tls.key`` are links into ``..data``, a link to a timestamped
folder that a rotation replaces in one rename. For ``--seconds`` seconds, ``--concurrency``
clients POST the AdmissionReview of a GPU pod back to back: half on keep-alive connections
(they keep the pair they shook hands with), half on a new connection for every review (a
handshake each, so every rotation meets handshakes in flight). Every ``--every`` seconds a new
serving pair is written: signed by one of two CAs in turn (every fifth rotation switches CA,
as a CA rotation does while the caBundle holds both), every third one with an RSA key instead
of ECDSA. The clients trust both CAs.

Counted: reviews answered 200 with an AdmissionReview (``reviews``), anything else
(``failures``: TLS or connection errors, other statuses, a wrong answer), rotations written,
how many of them a new handshake was given within three reload intervals (``served``), and
the webhook's own reload counters (``egpu_webhook_certificate_reloads_total``). The last line
is exactly ``seconds=N rotations=N served=N reloads_ok=N reloads_error=N reviews=N failures=N
reviews_per_s=N``. Exit status 0 when failures is 0 and every rotation was served.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import socket
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

from certs.issue import Pair, create_ca, create_serving  # noqa: E402
from devcluster.webhook_process import WebhookProcess  # noqa: E402


def _admission_fuzz() -> Any:
    """bench/admission_fuzz.py as a module (its review builder and webhook start)."""
    spec = importlib.util.spec_from_file_location("admission_fuzz",
                                                  REPO / "bench" / "admission_fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["admission_fuzz"] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


FUZZ = _admission_fuzz()
RELOAD_INTERVAL_S = 0.1  # the webhook's check of the pair: a rotation is served within it
CA_SWITCH_EVERY = 5  # rotations per signing CA
RSA_EVERY = 3  # every third pair has an RSA key
NAMES = ["127.0.0.1", "localhost"]
GPU_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "share", "namespace": "team"},
           "spec": {"containers": [{"name": "app", "image": "app", "resources": {"limits": {
               "egpu.io/gpu-memory": "8000", "egpu.io/gpu-cores": "30"}}}]}}


@dataclass
class Count:
    reviews: int = 0
    failures: int = 0
    first_failures: list[str] | None = None

    def fail(self, what: str) -> None:
        self.failures += 1
        if self.first_failures is None:
            self.first_failures = []
        if len(self.first_failures) < 5:
            self.first_failures.append(what)


class SecretVolume:
    """A folder laid out as the kubelet mounts a Secret: ``tls.crt``/``tls.key`` link into
    ``..data``, which links to the current timestamped folder; ``write`` swaps it in one
    rename."""

    def __init__(self, root: Path) -> None:
        self.root, self.generation = root, 0
        for name in ("tls.crt", "tls.key"):
            (root / name).symlink_to(Path("..data") / name)

    def write(self, serving: Pair) -> None:
        self.generation += 1
        folder = self.root / f"..{self.generation:06d}"
        folder.mkdir()
        (folder / "tls.key").write_bytes(serving.key_pem)
        (folder / "tls.crt").write_bytes(serving.cert_pem)
        link = self.root / "..data_tmp"
        link.symlink_to(folder.name)
        os.replace(link, self.root / "..data")


async def client(session: aiohttp.ClientSession, url: str, body: bytes, stop: float,
                 count: Count) -> None:
    while time.monotonic() < stop:
        try:
            async with session.post(url, data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                payload = await resp.read()
                answer = json.loads(payload) if resp.status == 200 else None
                if not (isinstance(answer, dict) and answer.get("kind") == "AdmissionReview"):
                    count.fail(f"HTTP {resp.status}: {payload[:200]!r}")
                    continue
                count.reviews += 1
        except (aiohttp.ClientError, ssl.SSLError, OSError, ValueError) as exc:
            count.fail(f"{type(exc).__name__}: {exc}")


def served_certificate(port: int, context: ssl.SSLContext) -> bytes:
    """The certificate (DER) a new handshake with the webhook is given."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.getpeercert(binary_form=True) or b""


async def rotate(volume: SecretVolume, cas: list[Pair], every_s: float, stop: float, port: int,
                 context: ssl.SSLContext) -> tuple[int, int]:
    """Writes a new pair every ``every_s`` until ``stop``; returns (rotations, how many of the
    pairs a new handshake was given within the reload interval's few multiples)."""
    rotations = served = 0
    while time.monotonic() + every_s < stop:
        await asyncio.sleep(every_s)
        ca = cas[(rotations // CA_SWITCH_EVERY) % len(cas)]
        key_type = "rsa-2048" if rotations % RSA_EVERY == RSA_EVERY - 1 else "ecdsa-p256"
        pair = await asyncio.to_thread(create_serving, ca, NAMES, key_type=key_type)
        volume.write(pair)
        rotations += 1
        await asyncio.sleep(3 * RELOAD_INTERVAL_S)
        der = await asyncio.to_thread(served_certificate, port, context)
        served += der == ssl.PEM_cert_to_DER_cert(pair.cert_pem.decode())
    return rotations, served


async def run(port: int, cafile: Path, volume: SecretVolume, cas: list[Pair], seconds: float,
              every_s: float, concurrency: int) -> tuple[Count, int, int, float]:
    url = f"https://127.0.0.1:{port}/mutate"
    body = json.dumps(FUZZ.admission_review(GPU_POD, "rotation")).encode()
    context = ssl.create_default_context(cafile=str(cafile))
    count = Count()
    start = time.monotonic()
    stop = start + seconds
    keep = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))
    fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, force_close=True))
    async with keep, fresh:
        tasks = [client(keep if i % 2 else fresh, url, body, stop, count)
                 for i in range(concurrency)]
        (rotations, served), *_ = await asyncio.gather(
            rotate(volume, cas, every_s, stop, port, context), *tasks)
    return count, rotations, served, time.monotonic() - start


def reload_counts(url: str, cafile: Path) -> dict[str, int]:
    """The webhook's egpu_webhook_certificate_reloads_total by result."""
    import urllib.request

    context = ssl.create_default_context(cafile=str(cafile))
    with urllib.request.urlopen(url, context=context, timeout=5) as resp:
        text = resp.read().decode()
    found = re.findall(
        r'egpu_webhook_certificate_reloads_total\{result="(\w+)"\} ([\d.e+]+)', text)
    return {result: int(float(value)) for result, value in found}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=0.5, help="seconds between rotations")
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="egpu-rotation-") as tmp:
        root = Path(tmp)
        cas = [create_ca("egpu-webhook-ca-1"), create_ca("egpu-webhook-ca-2")]
        cafile = root / "cas.pem"
        cafile.write_bytes(b"".join(ca.cert_pem for ca in cas))
        volume = SecretVolume(root)
        volume.write(create_serving(cas[0], NAMES))
        log_path = root / "webhook.log"
        webhook = WebhookProcess(root, extra_args=["--reload-interval", str(RELOAD_INTERVAL_S)],
                                 log=log_path, cafile=cafile)
        FUZZ.start_webhook(webhook)
        port = webhook.port
        try:
            count, rotations, served, elapsed = asyncio.run(
                run(port, cafile, volume, cas, args.seconds, args.every, args.concurrency))
            time.sleep(3 * RELOAD_INTERVAL_S)
            reloads = reload_counts(f"https://127.0.0.1:{port}/metrics", cafile)
        finally:
            webhook.stop()
        if count.failures:
            print("first failures:", *(count.first_failures or []), sep="\n  ")
            print(log_path.read_text()[-3000:])
    ok, bad = reloads.get("ok", 0), reloads.get("error", 0)
    print(f"seconds={elapsed:.0f} rotations={rotations} served={served} reloads_ok={ok} "
          f"reloads_error={bad} "
          f"reviews={count.reviews} failures={count.failures} "
          f"reviews_per_s={count.reviews / elapsed:.0f}")
    return 0 if count.failures == 0 and served == rotations else 1


if __name__ == "__main__":
    sys.exit(main())
