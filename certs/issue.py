"""Issue a private CA and a serving certificate for the webhook (``egpu certs create``).

``create_ca(...)`` and ``create_serving(ca, names, ...)`` return ``Pair`` (PEM certificate
and PEM private key, bytes). ``service_names(service, namespace)`` lists the DNS names the
API server may dial for a Service: ``svc``, ``svc.ns``, ``svc.ns.svc``,
``svc.ns.svc.cluster.local``. ``write_bundle(out_dir, ca, serving)`` writes ``ca.crt``,
``ca.key``, ``tls.crt``, ``tls.key`` (the names of a ``kubernetes.io/tls`` Secret plus the CA;
keys mode 0600) atomically (write to a temporary file, then rename) so a watching webhook
never reads half a file.

Issued by the one issuer, ``egpu.x509ca``. Key types: ``ecdsa-p256`` (default; small, fast
handshakes) or ``rsa-2048``. Validity in
days; the CA gets the same validity as the serving certificate plus one day. The serving
certificate: CN = the first name, every name in subjectAltName (IP addresses as iPAddress
entries), keyUsage digitalSignature (+ keyEncipherment for RSA), extendedKeyUsage serverAuth,
basicConstraints CA:false, subject/authority key identifiers.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Final

from egpu.x509ca import KEY_TYPES, Pair, create_leaf, new_key
from egpu.x509ca import create_ca as _create_ca

__all__ = ["KEY_TYPES", "Pair", "create_ca", "create_serving", "new_key", "service_names",
           "write_atomic", "write_bundle"]

DEFAULT_DAYS: Final = 365
CA_FILE: Final = "ca.crt"
CA_KEY_FILE: Final = "ca.key"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names of a Service: svc, svc.ns, svc.ns.svc, svc.ns.svc.cluster.local."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def create_ca(common_name: str = "egpu-webhook-ca", days: int = DEFAULT_DAYS + 1,
              key_type: str = "ecdsa-p256") -> Pair:
    """The webhook's private CA (egpu.x509ca.create_ca)."""
    return _create_ca(common_name, days, key_type)


def create_serving(ca: Pair, names: list[str], days: int = DEFAULT_DAYS,
                   key_type: str = "ecdsa-p256") -> Pair:
    """A serving certificate for ``names`` (DNS names or IP addresses) signed by ``ca``: CN
    the first name (egpu.x509ca.create_leaf). Raises ValueError without a name."""
    if not names:
        raise ValueError("names: at least one DNS name or IP address is needed")
    return create_leaf(ca, names[0], days, names=names, server=True, key_type=key_type)


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
