"""``egpu certs``: the CA and serving certificate, and the CA put into the manifest."""

from __future__ import annotations

import base64
import ipaddress
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs.inject import InjectError, inject_ca_text
from certs.issue import create_ca, create_serving, service_names
from cli.main import main as egpu

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "manifests" / "webhook" / "mutatingwebhook.yaml"


def test_service_names() -> None:
    assert service_names("egpu-webhook", "egpu-system") == [
        "egpu-webhook", "egpu-webhook.egpu-system", "egpu-webhook.egpu-system.svc",
        "egpu-webhook.egpu-system.svc.cluster.local"]


@pytest.mark.parametrize(("key_type", "key_class"), [("ecdsa-p256", ec.EllipticCurvePrivateKey),
                                                     ("rsa-2048", rsa.RSAPrivateKey)])
def test_serving_cert_signed_by_ca_with_sans(key_type: str, key_class: type) -> None:
    ca = create_ca(key_type=key_type)
    serving = create_serving(ca, ["svc", "svc.ns.svc", "127.0.0.1"], days=30, key_type=key_type)
    cert = serving.cert
    cert.verify_directly_issued_by(ca.cert)
    assert isinstance(serving.key, key_class)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["svc", "svc.ns.svc"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 29 <= days <= 30


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="key type"):
        create_ca(key_type="dsa")
    with pytest.raises(ValueError, match="names"):
        create_serving(create_ca(), [])
    with pytest.raises(ValueError, match="days"):
        create_serving(create_ca(), ["a"], days=0)


def test_cli_create_and_inject(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert egpu(["certs", "create", "--service", "egpu-webhook", "--namespace", "egpu-system",
                 "--out", str(out), "--days", "10", "--extra-san", "127.0.0.1",
                 "--extra-san", "localhost"]) == 0
    for name in ("ca.crt", "ca.key", "tls.crt", "tls.key"):
        assert (out / name).is_file()
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "egpu-webhook.egpu-system.svc.cluster.local" in sans.get_values_for_type(x509.DNSName)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    capsys.readouterr()

    target = tmp_path / "webhook.yaml"
    assert egpu(["certs", "inject-ca", "--ca", str(out / "ca.crt"), "--in", str(MANIFEST),
                 "--out", str(target)]) == 0
    doc = yaml.safe_load(target.read_text())
    bundle = doc["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle) == (out / "ca.crt").read_bytes()
    # the rest of the manifest is unchanged
    original = yaml.safe_load(MANIFEST.read_text())
    del doc["webhooks"][0]["clientConfig"]["caBundle"]
    assert doc == original

    assert egpu(["certs", "inject-ca", "--ca", str(out / "ca.crt"), "--in", str(MANIFEST)]) == 0
    assert "caBundle: " in capsys.readouterr().out


def test_inject_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = create_ca().cert_pem
    with pytest.raises(InjectError, match="no webhook"):
        inject_ca_text("kind: ConfigMap\n", ca)
    with pytest.raises(InjectError, match="PEM"):
        inject_ca_text(MANIFEST.read_text(), b"not a cert")
    bad = tmp_path / "ca.crt"
    bad.write_text("nope")
    assert egpu(["certs", "inject-ca", "--ca", str(bad), "--in", str(MANIFEST)]) == 2
    assert "PEM" in capsys.readouterr().err
    assert egpu(["certs", "inject-ca", "--ca", str(tmp_path / "missing"), "--in",
                 str(MANIFEST)]) == 2
