"""Certificates and keys for the dev cluster, made with ``cryptography``.

Files (PEM) under ``<state_dir>/pki``:
    ca.crt ca.key                     cluster CA (signs serving and client certs)
    apiserver.crt apiserver.key       serving: 127.0.0.1, ::1, localhost, kubernetes.default.svc...
    admin.crt admin.key               client: CN=egpu-dev-admin, O=system:masters
    sa.key sa.pub                     service-account token signing key pair
    front-proxy-ca.crt .key           request-header CA (aggregated APIs)
    front-proxy-client.crt .key       the apiserver's proxy client cert

Existing files are reused, so a warm ``up`` does not pay for key generation. Issued by the one
issuer, ``egpu.x509ca``.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from egpu.x509ca import Pair, create_ca, create_leaf, new_key, pem_key

VALIDITY_DAYS = 3650
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


def _write(pki: Path, name: str, pair: Pair) -> None:
    key = pki / f"{name}.key"
    key.write_bytes(pair.key_pem)
    key.chmod(0o600)
    (pki / f"{name}.crt").write_bytes(pair.cert_pem)


def _load(pki: Path, name: str) -> Pair:
    return Pair((pki / f"{name}.crt").read_bytes(), (pki / f"{name}.key").read_bytes())


def _present(pki: Path, name: str) -> bool:
    return (pki / f"{name}.crt").exists() and (pki / f"{name}.key").exists()


def _ca(pki: Path, name: str, cn: str) -> None:
    if not _present(pki, name):
        _write(pki, name, create_ca(cn, VALIDITY_DAYS))


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
    if _present(pki, name) and not (server and _stale_sans(pki / f"{name}.crt", extra_ips)):
        return
    names = (*API_SANS_DNS, *API_SANS_IP, *extra_ips) if server else ()
    _write(pki, name, create_leaf(_load(pki, ca), cn, VALIDITY_DAYS, names=names,
                                  organization=org, server=server, client=client))


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
    key = new_key()
    (pki / "sa.key").write_bytes(pem_key(key))
    (pki / "sa.key").chmod(0o600)
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
