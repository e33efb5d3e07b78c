"""Certificates and keys for the dev cluster, made with ``cryptography``.

Files (PEM) under ``<state_dir>/pki``:
    ca.crt ca.key                     cluster CA (signs serving and client certs)
    apiserver.crt apiserver.key       serving: 127.0.0.1, ::1, localhost, kubernetes.default.svc...
    admin.crt admin.key               client: CN=egpu-dev-admin, O=system:masters
    sa.key sa.pub                     service-account token signing key pair
    front-proxy-ca.crt .key           request-header CA (aggregated APIs)
    front-proxy-client.crt .key       the apiserver's proxy client cert

Existing files are reused, so a warm ``up`` does not pay for key generation.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=3650)
# First address of the service CIDR the apiserver is given (devcluster.cluster.SERVICE_CIDR):
# the kubernetes Service's ClusterIP, which pods on a real node dial.
SERVICE_IP = "198.19.0.1"
# The host's side of the real nodes' link (devcluster.realnode.HOST_LINK_IP): real nodes reach
# the apiserver there (a relay to 127.0.0.1).
HOST_LINK_IP = "198.18.0.1"
API_SANS_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
API_SANS_IP = ("127.0.0.1", "::1", SERVICE_IP, HOST_LINK_IP)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load(pki: Path, name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((pki / f"{name}.crt").read_bytes())
    key = serialization.load_pem_private_key((pki / f"{name}.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _ca(pki: Path, name: str, cn: str) -> None:
    if (pki / f"{name}.crt").exists() and (pki / f"{name}.key").exists():
        return
    key = _key()
    now = dt.datetime.now(dt.UTC)
    subject = _name(cn)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(pki / f"{name}.key", key)
    _write_cert(pki / f"{name}.crt", cert)


def _leaf(
    pki: Path,
    name: str,
    ca: str,
    cn: str,
    org: str | None = None,
    server: bool = False,
    client: bool = False,
    extra_ips: tuple[str, ...] = (),
) -> None:
    if (pki / f"{name}.crt").exists() and (pki / f"{name}.key").exists() \
            and not (server and _stale_sans(pki / f"{name}.crt", extra_ips)):
        return
    ca_cert, ca_key = _load(pki, ca)
    key = _key()
    now = dt.datetime.now(dt.UTC)
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, org))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=True,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in API_SANS_DNS]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in (*API_SANS_IP, *extra_ips)]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(pki / f"{name}.key", key)
    _write_cert(pki / f"{name}.crt", cert)


def _stale_sans(crt: Path, extra_ips: tuple[str, ...]) -> bool:
    """A serving cert made before an address was added to the SANs (kept pki folders)."""
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return True
    have = {str(ip) for ip in ext.value.get_values_for_type(x509.IPAddress)}
    return not {*API_SANS_IP, *extra_ips} <= have


def client_cert(pki: Path, name: str, cn: str, org: str | None = None) -> tuple[Path, Path]:
    """A client cert signed by the cluster CA (kept when present): (crt, key) paths.
    Real nodes use it for the kubelet (CN=system:node:<node>, O=system:nodes) and kube-proxy
    (CN=system:kube-proxy)."""
    _leaf(pki, name, "ca", cn, org=org, client=True)
    return pki / f"{name}.crt", pki / f"{name}.key"


def _service_account(pki: Path) -> None:
    if (pki / "sa.key").exists() and (pki / "sa.pub").exists():
        return
    key = _key()
    _write_key(pki / "sa.key", key)
    (pki / "sa.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def ensure_pki(pki: Path) -> Path:
    """Create whatever of the dev cluster's certs and keys is missing under ``pki``."""
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)
    _ca(pki, "ca", "egpu-dev-ca")
    _leaf(pki, "apiserver", "ca", "kube-apiserver", server=True)
    _leaf(pki, "admin", "ca", "egpu-dev-admin", org="system:masters", client=True)
    # The apiserver's client cert towards kubelets (logs, exec, port-forward on real nodes).
    _leaf(pki, "apiserver-kubelet-client", "ca", "kube-apiserver-kubelet-client",
          org="system:masters", client=True)
    _service_account(pki)
    _ca(pki, "front-proxy-ca", "egpu-dev-front-proxy-ca")
    _leaf(pki, "front-proxy-client", "front-proxy-ca", "front-proxy-client", client=True)
    return pki
