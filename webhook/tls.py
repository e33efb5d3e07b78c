"""Serving TLS from a certificate and key on disk, reloaded when they change (no restart).

``CertReloader(cert_path, key_path)`` gives one server-side ``ssl.SSLContext`` (``context``:
TLS 1.2 or newer, ALPN ``http/1.1``) for the listening socket. ``check()`` compares the
files' signatures (``os.stat`` of each: mtime in ns, size, inode; symlinks followed, as a
Kubernetes Secret volume swaps its ``..data`` link) with those last loaded and, when they
differ, loads the pair into a *fresh* context. The listening context's ``sni_callback`` (which
OpenSSL calls for every ClientHello, with or without SNI) moves each new handshake onto the
newest context: handshakes that start afterwards present the new certificate, connections
already open keep theirs.

Why not ``load_cert_chain`` again on the listening context: OpenSSL keeps one certificate per
key type in a context, so rotating from an ECDSA to an RSA pair would keep serving the old
ECDSA certificate to clients that prefer it, and a certificate written before its key leaves
a slot with a certificate but no key. A fresh context has neither problem, and a pair that
does not load (half written, key not matching) is never served: the old one stays and the
next check tries again. Errors: ``ssl.SSLError``/``OSError`` from the first load are raised
by the constructor.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
from dataclasses import dataclass

from cryptography import x509

log = logging.getLogger(__name__)

Signature = tuple[tuple[int, int, int], ...]


def file_signature(*paths: str) -> Signature | None:
    """``(mtime_ns, size, inode)`` of each path, following symlinks; None when one is missing."""
    try:
        stats = [os.stat(path) for path in paths]
    except OSError:
        return None
    return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)


def certificate_not_after(cert_path: str) -> dt.datetime | None:
    """The expiry (UTC) of the first certificate in the PEM file, or None if unreadable."""
    try:
        with open(cert_path, "rb") as handle:
            cert = x509.load_pem_x509_certificate(handle.read())
    except (OSError, ValueError):
        return None
    return cert.not_valid_after_utc


def server_context() -> ssl.SSLContext:
    """A server-side context: TLS 1.2 minimum, the library's default ciphers, HTTP/1.1."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


@dataclass
class ReloadResult:
    """The outcome of one ``check``: changed (files differ from the loaded ones), loaded
    (the new pair is now served), error (why loading failed, "" when it did not)."""

    changed: bool
    loaded: bool
    error: str = ""


class CertReloader:
    """The listening SSLContext for the cert/key pair at the given paths, kept current by
    ``check()``. ``not_after``: expiry of the served certificate (UTC), None if unknown;
    ``reloads``: how many new pairs were loaded since start."""

    def __init__(self, cert_path: str, key_path: str) -> None:
        self.cert_path = cert_path
        self.key_path = key_path
        self._signature = file_signature(cert_path, key_path)
        self.context = server_context()
        self.context.load_cert_chain(cert_path, key_path)
        self.context.sni_callback = self._use_current
        self._current = self.context
        self.not_after = certificate_not_after(cert_path)
        self.reloads = 0

    def _use_current(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                     listening: ssl.SSLContext) -> None:
        """sni_callback: serve this handshake from the newest context."""
        if connection.context is not self._current:
            connection.context = self._current

    def check(self) -> ReloadResult:
        """Reload the pair when the files changed since the last successful load."""
        signature = file_signature(self.cert_path, self.key_path)
        if signature is None or signature == self._signature:
            return ReloadResult(changed=False, loaded=False)
        try:
            fresh = server_context()
            fresh.load_cert_chain(self.cert_path, self.key_path)
        except (ssl.SSLError, OSError) as exc:
            log.warning("TLS: keeping the current certificate; %s/%s did not load: %s",
                        self.cert_path, self.key_path, exc)
            return ReloadResult(changed=True, loaded=False, error=str(exc))
        self._current = fresh
        self._signature = signature
        self.not_after = certificate_not_after(self.cert_path)
        self.reloads += 1
        log.info("TLS: loaded a new certificate from %s (expires %s)", self.cert_path,
                 self.not_after)
        return ReloadResult(changed=True, loaded=True)
