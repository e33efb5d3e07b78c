"""The one certificate issuer every part uses (``cryptography``): a private CA and the
certificates it signs, as PEM pairs. ``certs.issue`` (the webhook's serving certificate,
``egpu certs create``) and ``devcluster.pki`` (the dev cluster's CAs, serving and client
certificates) both issue through it.

- ``new_key(key_type)``: ``ecdsa-p256`` (default) or ``rsa-2048``; ValueError otherwise.
- ``create_ca(common_name, days, key_type)``: self-signed, basicConstraints CA:true pathlen 0,
  keyUsage keyCertSign + cRLSign (+ digitalSignature), subject key identifier.
- ``create_leaf(ca, common_name, ...)``: basicConstraints CA:false, keyUsage digitalSignature
  (+ keyEncipherment for RSA), extendedKeyUsage serverAuth and/or clientAuth, the names (DNS
  or IP) in subjectAltName, an organization (Kubernetes' group for client certificates),
  subject and authority key identifiers; never valid past its CA.

Validity starts five minutes back (clock skew between the issuer and the verifier).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_TYPES: Final = ("ecdsa-p256", "rsa-2048")
BACKDATE: Final = dt.timedelta(minutes=5)

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


def pem_key(key: PrivateKey) -> bytes:
    """The key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _name(common_name: str, organization: str | None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def create_ca(common_name: str, days: int, key_type: str = "ecdsa-p256") -> Pair:
    """A self-signed CA valid for ``days`` (>= 1, else ValueError)."""
    if days < 1:
        raise ValueError(f"days: {days} is out of range; allowed: >= 1")
    key = new_key(key_type)
    name = _name(common_name, None)
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
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
    return Pair(cert.public_bytes(serialization.Encoding.PEM), pem_key(key))


def create_leaf(ca: Pair, common_name: str, days: int, *, names: Sequence[str] = (),
                organization: str | None = None, server: bool = False, client: bool = False,
                key_type: str = "ecdsa-p256") -> Pair:
    """A certificate signed by ``ca`` for ``server`` and/or ``client`` authentication, valid
    for ``days`` (>= 1) but never past the CA, with ``names`` (DNS names or IP addresses) in
    subjectAltName when given. Raises ValueError for days < 1 or neither usage."""
    if days < 1:
        raise ValueError(f"days: {days} is out of range; allowed: >= 1")
    if not server and not client:
        raise ValueError("a certificate needs server or client authentication (or both)")
    key = new_key(key_type)
    ca_cert, ca_key = ca.cert, ca.key
    now = _now()
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False,
            key_encipherment=isinstance(key, rsa.RSAPrivateKey), data_encipherment=False,
            key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False,
            decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
    )
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Pair(cert.public_bytes(serialization.Encoding.PEM), pem_key(key))
