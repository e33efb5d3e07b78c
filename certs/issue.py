"""Issue a private CA and a serving certificate for the webhook (``egpu certs create``).

``create_ca(...)`` and ``create_serving(ca, names, ...)`` return ``Pair`` (PEM certificate
and PEM private key, bytes). ``service_names(service, namespace)`` lists the DNS names the
API server may dial for a Service: ``svc``, ``svc.ns``, ``svc.ns.svc``,
``svc.ns.svc.cluster.local``. ``write_bundle(out_dir, ca, serving)`` writes ``ca.crt``,
``ca.key``, ``tls.crt``, ``tls.key`` (the names of a ``kubernetes.io/tls`` Secret plus the CA;
keys mode 0600) atomically (write to a temporary file, then rename) so a watching webhook
never reads half a file.

Key types: ``ecdsa-p256`` (default; small, fast handshakes) or ``rsa-2048``. Validity in
days; the CA gets the same validity as the serving certificate plus one day. The serving
certificate: CN = the first name, every name in subjectAltName (IP addresses as iPAddress
entries), keyUsage digitalSignature (+ keyEncipherment for RSA), extendedKeyUsage serverAuth,
basicConstraints CA:false, subject/authority key identifiers.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_TYPES: Final = ("ecdsa-p256", "rsa-2048")
DEFAULT_DAYS: Final = 365
CA_FILE: Final = "ca.crt"
CA_KEY_FILE: Final = "ca.key"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, both PEM (bytes)."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        """The parsed certificate."""
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def key(self) -> PrivateKey:
        """The parsed private key."""
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
        return key


def new_key(key_type: str = "ecdsa-p256") -> PrivateKey:
    """A fresh private key of ``key_type`` (one of KEY_TYPES). Raises ValueError otherwise."""
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa-2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"key type {key_type!r} is not supported; allowed: {', '.join(KEY_TYPES)}")


def _pem_key(key: PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names of a Service: svc, svc.ns, svc.ns.svc, svc.ns.svc.cluster.local."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def create_ca(common_name: str = "egpu-webhook-ca", days: int = DEFAULT_DAYS + 1,
              key_type: str = "ecdsa-p256") -> Pair:
    """A self-signed CA (basicConstraints CA:true, pathlen 0; keyCertSign, cRLSign)."""
    if days < 1:
        raise ValueError(f"days: {days} is out of range; allowed: >= 1")
    key = new_key(key_type)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def create_serving(ca: Pair, names: list[str], days: int = DEFAULT_DAYS,
                   key_type: str = "ecdsa-p256") -> Pair:
    """A serving certificate for ``names`` (DNS names or IP addresses) signed by ``ca``."""
    if not names:
        raise ValueError("names: at least one DNS name or IP address is needed")
    if days < 1:
        raise ValueError(f"days: {days} is out of range; allowed: >= 1")
    key = new_key(key_type)
    ca_cert, ca_key = ca.cert, ca.key
    now = _now()
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False,
            key_encipherment=isinstance(key, rsa.RSAPrivateKey), data_encipherment=False,
            key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False,
            decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bundle(out_dir: str | Path, ca: Pair, serving: Pair) -> dict[str, Path]:
    """Write ca.crt, ca.key, tls.crt, tls.key under ``out_dir`` (created); return the paths.

    The key is written before the certificate, so that a watcher keyed on both files sees a
    matching pair once both are in place.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in (CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE)}
    write_atomic(paths[CA_FILE], ca.cert_pem)
    write_atomic(paths[CA_KEY_FILE], ca.key_pem, 0o600)
    write_atomic(paths[KEY_FILE], serving.key_pem, 0o600)
    write_atomic(paths[CERT_FILE], serving.cert_pem)
    return paths
